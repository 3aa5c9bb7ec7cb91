import json
import os

from helpers import run


def test_compare_runs_end_to_end_and_its_table_comes_from_the_logs(tmp_path):
    (tmp_path / 'text.txt').write_text('the quick brown fox jumps over the lazy dog. ' * 400)
    run(tmp_path, 'prepare.py', '--input_files=text.txt', '--encoding=byte', '--out_dir=data', '--val_tokens=2000')
    args = ['--data_dir=data', '--out_dir=cmp', '--n_layer=1', '--n_head=2', '--n_embd=32', '--intermediate_size=64',
            '--rank=8', '--block_size=32', '--batch_size=4', '--max_iters=20', '--warmup_iters=2', '--eval_interval=10',
            '--eval_tokens=512', '--full_rank_lrs=(1e-3,)', '--cola_lrs=(3e-3,1e-2)']
    r = run(tmp_path, 'compare.py', *args)
    assert 'run 1 of 7, full-rank-lr0.001: training' in r.stdout and 'run 7 of 7, tsvd-lr0.001' in r.stdout
    runs = ['full-rank-lr0.001', 'cola-lr0.003', 'cola-lr0.01']
    logs = {name: [json.loads(line) for line in open(tmp_path / 'cmp' / name / 'log.jsonl')] for name in runs}
    best_cola = min(runs[1:], key=lambda name: logs[name][-1]['val_loss'])
    colam = 'cola-m-lr' + best_cola.split('lr')[1]
    for name in [method + '-lr' + best_cola.split('lr')[1] for method in ('cola-m', 'dlr', 'elas')] + ['tsvd-lr0.001']:
        logs[name] = [json.loads(line) for line in open(tmp_path / 'cmp' / name / 'log.jsonl')]
    table = (tmp_path / 'cmp' / 'compare.md').read_text()
    rows = {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
            for line in table.split('\n\n')[0].splitlines() if line.startswith('| ') and not line.startswith('| run')}
    assert set(rows) == set(logs)
    for name, log in logs.items():
        final = [r for r in log if 'val_loss' in r][-1]
        assert final['iter'] == 20 and rows[name][1] == f"{final['val_loss']:.4f}"
        last_shape = [r for r in log if 'model_params' in r][-1]  # TSVD: after its last rank change
        assert rows[name][3] == f"{last_shape['model_params'] / 1e6:.2f}"
    assert 'tsvd-lr0.001: mean rank per projection type after each adaptation' in table
    assert rows[colam][1] == rows[best_cola][1]  # CoLA-M reproduces CoLA
    png = tmp_path / 'cmp' / 'compare.png'
    try:
        import matplotlib  # noqa: F401
        assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    except ImportError:
        assert not png.exists()
    before = {name: os.path.getmtime(tmp_path / 'cmp' / name / 'log.jsonl') for name in logs}
    run(tmp_path, 'compare.py', *args)  # finished runs are not run again
    assert before == {name: os.path.getmtime(tmp_path / 'cmp' / name / 'log.jsonl') for name in logs}


def test_a_resumed_log_keeps_the_redone_steps_records(tmp_path):
    from compare import read_log
    records = [{'config': {}}, {'iter': 10, 'loss': 3.0}, {'iter': 10, 'val_loss': 3.1}, {'iter': 20, 'loss': 2.0},
               {'iter': 20, 'val_loss': 2.5},  # the run stopped after iter 20, its last checkpoint is at 10
               {'config': {}}, {'resumed_at': 10}, {'iter': 10, 'val_loss': 3.1}, {'iter': 20, 'loss': 2.2}]
    (tmp_path / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    kept = read_log(tmp_path / 'log.jsonl')
    assert kept == records[:2] + [records[5], records[7], records[8]]
