import json
import os
import subprocess

import numpy as np
import pytest
import torch
from helpers import ROOT, digest, refused, run, start, wait_for

from compare import read_log
from configurator import configure, public_settings
from model import load_checkpoint, model_from_checkpoint


def test_compare_sweeps_then_runs_every_method_per_seed_and_its_table_comes_from_the_logs(tmp_path):
    (tmp_path / 'text.txt').write_text('the quick brown fox jumps over the lazy dog. ' * 400)
    run(tmp_path, 'prepare.py', '--input_files=text.txt', '--encoding=byte', '--out_dir=data', '--val_tokens=2000')
    args = ['--data_dir=data', '--out_dir=cmp', '--n_layer=1', '--n_head=2', '--n_embd=32', '--intermediate_size=64',
            '--rank=8', '--block_size=32', '--batch_size=4', '--max_iters=10', '--eval_interval=5', '--eval_tokens=512',
            '--sweep_lrs=(3e-3,1e-2)', '--seeds=(1,2)', '--downstream_items=5',
            "--methods=('full-rank','cola','cola-m','relora')",  # every method's settings: the next test
            "--learning_rates=(('full-rank',1e-3),('relora',1e-3))", '--jobs=2']  # two runs at a time
    r = run(tmp_path, 'compare.py', *args)
    # only CoLA is swept (CoLA-M takes its lr): the grid, then its best / and * sqrt(2); then 4 methods x 2 seeds
    assert 'run 1 of 12, sweep/cola-lr0.003: training' in r.stdout and 'run 12 of 12, relora-seed2' in r.stdout
    assert 'm more' in r.stdout.split('run 12 of 12')[1].splitlines()[0]  # the whole study's ETA, once a run has finished
    assert 'iter 5: val loss' in (tmp_path / 'cmp' / 'sweep' / 'cola-lr0.003' / 'output.txt').read_text()  # each run's own output
    grid = {lr: read_log(tmp_path / 'cmp' / 'sweep' / f'cola-lr{lr:g}' / 'log.jsonl') for lr in (3e-3, 1e-2)}
    best_grid = min(grid, key=lambda lr: grid[lr][-1]['val_loss'])
    sweep = grid | {lr: read_log(tmp_path / 'cmp' / 'sweep' / f'cola-lr{lr:g}' / 'log.jsonl')
                    for lr in (best_grid / 2 ** 0.5, best_grid * 2 ** 0.5)}
    sweep = dict(sorted(sweep.items()))
    assert all(log[0]['config']['max_iters'] == 10 and log[0]['config']['seed'] == 1 for log in sweep.values())  # full length
    best_cola = min(sweep, key=lambda lr: sweep[lr][-1]['val_loss'])
    # the sweep's run at the chosen rate is CoLA's seed-1 study run, not trained again
    assert os.readlink(tmp_path / 'cmp' / 'cola-seed1') == os.path.join('sweep', f'cola-lr{best_cola:g}')
    assert 'cola-seed1: training' not in r.stdout and f'cola: lr {best_cola:.3g} wins, ' in r.stdout
    lrs = {'full-rank': 1e-3, 'cola': best_cola, 'cola-m': best_cola, 'relora': 1e-3}
    logs = {(m, s): read_log(tmp_path / 'cmp' / f'{m}-seed{s}' / 'log.jsonl') for m in lrs for s in (1, 2)}
    for (m, s), log in logs.items():
        assert (log[0]['config']['learning_rate'], log[0]['config']['seed']) == (lrs[m], s)
    assert logs['relora', 1][0]['config']['relora_interval'] == 1  # 10% of 10 steps
    final = {key: [r for r in log if 'val_loss' in r][-1]['val_loss'] for key, log in logs.items()}
    assert final['cola-m', 1] == final['cola', 1] and final['cola', 1] != final['cola', 2]

    blocks = [block.splitlines() for block in (tmp_path / 'cmp' / 'compare.md').read_text().split('\n\n')]
    assert blocks[1][0].startswith('11 runs, ')  # 4 swept and 8 study runs, CoLA's seed-1 run one of the sweep's
    tables = {'best' in block[0]: {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
                                   for line in block[2:]} for block in blocks if block[0].startswith('| method')}
    sweep_rows, rows = tables[True], tables[False]
    losses = sorted(log[-1]['val_loss'] for log in sweep.values())
    runner_up = next(lr for lr, log in sweep.items() if log[-1]['val_loss'] == losses[1])
    margin = f"{(losses[1] / losses[0] - 1) * 100:.2f}% below {runner_up:.3g}"
    edge = ' (at the edge of the rates tried)' if best_cola in (min(sweep), max(sweep)) else ''
    assert sweep_rows == {'cola': [f"{log[-1]['val_loss']:.4f}" for log in sweep.values()] + [f'{best_cola:.3g}', margin + edge]}
    assert set(rows) == set(lrs)
    evals = {key: np.array([(r['flops'], r['val_loss']) for r in log if 'val_loss' in r]) for key, log in logs.items()}
    for m in lrs:
        ours = np.array([final[m, 1], final[m, 2]])
        full = np.array([final['full-rank', 1], final['full-rank', 2]])
        gap = (ours / full - 1) * 100
        given = ' (given)' if m in ('full-rank', 'relora') else ''
        assert rows[m][:3] == [f'{lrs[m]:.3g}{given}', f'{ours.mean():.4f} ± {ours.std(ddof=1):.4f}',
                               f'{gap.mean():.2f} ± {gap.std(ddof=1):.2f}'], m
    # what the optimizer trains and holds, against the model's trainable parameters and AdamW's two float32
    # moments per trained number and one float32 step per tensor
    for m in ('full-rank', 'relora'):
        path = tmp_path / 'cmp' / f'{m}-seed1' / 'ckpt.pt'
        model = model_from_checkpoint(load_checkpoint(path), 'cpu', path)
        trained = [p for p in model.parameters() if p.requires_grad]
        in_all, n, megabytes = float(rows[m][6]), float(rows[m][7]), float(rows[m][8])
        assert n == round(sum(p.numel() for p in trained) / 1e6, 3)
        assert megabytes == round((8 * sum(p.numel() for p in trained) + 4 * len(trained)) / 1e6, 2)
        assert (n < in_all) == (m == 'relora')  # ReLoRA's frozen W is held, not trained
    # at equal FLOPs: CoLA's final loss against full-rank's curve, linear between evaluations
    gap = [(final['cola', s] / np.interp(evals['cola', s][-1, 0], *evals['full-rank', s].T) - 1) * 100 for s in (1, 2)]
    assert rows['cola'][3] == f'{np.mean(gap):.2f} ± {np.std(gap, ddof=1):.2f}'
    # the downstream columns: evaluate.py's built-in tasks on each study run's final checkpoint, 5 items each
    reports = {key: json.loads((tmp_path / 'cmp' / f'{key[0]}-seed{key[1]}' / 'evaluate.json').read_text()) for key in logs}
    assert all(r['scores']['next_passage']['items'] == 5 for r in reports.values())
    accs = np.array([reports['cola', s]['scores']['next_passage']['acc'] for s in (1, 2)])
    assert rows['cola'][4] == f'{accs.mean():.3f} ± {accs.std(ddof=1):.3f}'
    assert sum((tmp_path / 'cmp' / 'sweep' / f'cola-lr{lr:g}' / 'evaluate.json').exists() for lr in sweep) == 1  # the linked one
    png = tmp_path / 'cmp' / 'compare.png'
    try:
        import matplotlib  # noqa: F401
        assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    except ImportError:
        assert not png.exists()
    # the size trend's table: this study as one width, its CoLA gaps as in the study's table, CoLA-M on CoLA
    run(tmp_path, 'compare.py', "--trend=('cmp',)", '--out_dir=trend')
    [row] = [line.split('|')[1:-1] for line in (tmp_path / 'trend' / 'trend.md').read_text().splitlines()[2:]]
    assert [c.strip() for c in row[:4]] == ['32', '8', f"{logs['full-rank', 1][0]['model_params']:,}", '2']
    assert [c.strip() for c in row[8:11]] == [rows['cola'][2], rows['cola'][3], '0.0e+00']
    tokens, vocab = logs['full-rank', 1][-1]['tokens'], logs['full-rank', 1][0]['model_config']['vocab_size']
    assert row[13].strip() == f"{tokens / (logs['full-rank', 1][0]['model_params'] - 2 * vocab * 32):.1f}"
    # memorising: the final val loss minus the mean training loss over the last tenth of the logged steps
    train = {key: [r['loss'] for r in log if 'loss' in r] for key, log in logs.items()}
    memorised = {m: np.mean([final[m, s] - np.mean(train[m, s][-max(1, len(train[m, s]) // 10):]) for s in (1, 2)])
                 for m in ('full-rank', 'cola')}
    assert row[11].strip() == f"{memorised['full-rank']:.3f} / {memorised['cola']:.3f}"
    lowest = {key: min(r['val_loss'] for r in log if 'val_loss' in r) for key, log in logs.items()}
    early = [(lowest['cola', s] / lowest['full-rank', s] - 1) * 100 for s in (1, 2)]
    assert row[12].strip() == f'{np.mean(early):.2f} ± {np.std(early, ddof=1):.2f}'  # where an early stop would keep each run
    before = {key: os.path.getmtime(tmp_path / 'cmp' / f'{key[0]}-seed{key[1]}' / 'log.jsonl') for key in logs}
    r = run(tmp_path, 'compare.py', *args)  # finished runs are not run again
    assert ': training ...' not in r.stdout
    assert before == {key: os.path.getmtime(tmp_path / 'cmp' / f'{key[0]}-seed{key[1]}' / 'log.jsonl') for key in logs}
    kept = digest(tmp_path / 'cmp')  # a run trained with other settings is never reported under new labels
    refused(run(tmp_path, 'compare.py', *args[:-1],
                "--learning_rates=(('full-rank',4e-3),('relora',1e-3))",
                check=False), 'cmp/full-rank-seed1/ holds a run trained with learning_rate=0.001, not 0.004')
    assert digest(tmp_path / 'cmp') == kept


def test_a_diverging_sweep_rate_loses_and_the_sweep_goes_on(tmp_path):
    (tmp_path / 'text.txt').write_text('the quick brown fox jumps over the lazy dog. ' * 400)
    run(tmp_path, 'prepare.py', '--input_files=text.txt', '--encoding=byte', '--out_dir=data', '--val_tokens=2000')
    args = ['--data_dir=data', '--n_layer=1', '--n_head=2', '--n_embd=32', '--intermediate_size=64', '--rank=8',
            '--block_size=32', '--batch_size=4', '--max_iters=10', '--eval_interval=5', '--eval_tokens=512',
            "--methods=('cola',)", '--seeds=(1,)', '--downstream_items=0']
    r = run(tmp_path, 'compare.py', *args, '--out_dir=cmp', '--sweep_lrs=(3e-3,1e30)')
    assert 'sweep/cola-lr1e+30: diverged at iter ' in r.stdout  # and the study went on: the refinement, the table
    [header, _, row] = next(block for block in (tmp_path / 'cmp' / 'compare.md').read_text().split('\n\n')
                            if block.startswith('| method |') and 'margin' in block).splitlines()
    sweep = dict(zip([c.strip() for c in header.split('|')[2:-3]], [c.strip() for c in row.split('|')[2:-3]]))
    assert sweep['1e+30'] == 'diverged' and set(sweep) == {'0.00212', '0.003', '0.00424', '1e+30'}
    assert all(float(loss) > 0 for rate, loss in sweep.items() if rate != '1e+30')
    assert 'lr1e+30' not in os.readlink(tmp_path / 'cmp' / 'cola-seed1')
    r = run(tmp_path, 'compare.py', *args, '--out_dir=cmp', '--sweep_lrs=(3e-3,1e30)')  # the diverged run is a result
    assert ': training ...' not in r.stdout
    refused(run(tmp_path, 'compare.py', *args, '--out_dir=all', '--sweep_lrs=(1e30,)', check=False),
            'cola: every rate of the sweep diverged (1e+30): give sweep_lrs smaller rates')


def test_killing_compare_stops_its_training_run_after_it_saves_its_step(tmp_path):
    (tmp_path / 'text.txt').write_text('the quick brown fox jumps over the lazy dog. ' * 400)
    run(tmp_path, 'prepare.py', '--input_files=text.txt', '--encoding=byte', '--out_dir=data', '--val_tokens=2000')
    args = ['--data_dir=data', '--out_dir=cmp', '--n_layer=1', '--n_head=2', '--n_embd=32', '--intermediate_size=64',
            '--rank=8', '--block_size=32', '--batch_size=4', '--max_iters=300', '--eval_interval=5', '--eval_tokens=512',
            "--methods=('cola',)", '--seeds=(1,)', "--learning_rates=(('cola',3e-3),)"]  # 300 steps: about a minute
    study = start(tmp_path, 'compare.py', *args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = tmp_path / 'cmp' / 'cola-seed1' / 'train.lock'
    wait_for(lambda: lock.read_text().strip(), study, 'the training run to take its lock')
    child = int(lock.read_text())
    study.kill()  # SIGKILL: compare.py cannot clean up; its child must end by itself
    study.wait()
    wait_for(lambda: not os.path.exists(f'/proc/{child}') or open(f'/proc/{child}/stat').read().split()[2] == 'Z', None,
             'the training run to stop after compare.py was killed')
    assert torch.load(tmp_path / 'cmp' / 'cola-seed1' / 'ckpt.pt', weights_only=True)['iter_num'] > 0  # it saved first


def test_every_method_gets_its_own_settings_scaled_to_the_run(monkeypatch):
    import compare
    monkeypatch.setattr(compare, 'rank', 32)
    settings = {m: compare.method_settings(m, 1000) for m in compare.METHODS}
    assert settings['full-rank'] == dict(rank=0) and settings['cola'] == dict(rank=32)
    assert settings['cola-m']['checkpointing'] == 'cola-m' and settings['dlr']['dlr_alpha'] == 1.0
    assert settings['elas'] == dict(rank=32, mlp='elas', elas_warmup_iters=100)  # 10%, the paper's 1,000 of 10,000
    assert settings['tsvd'] == dict(rank=32, projection='tsvd', tsvd_interval=100)
    for kind in ('galore', 'fira'):  # full-rank, projected at CoLA's rank, a new projector every 2%
        assert settings[kind] == dict(rank=0, optimizer=kind, galore_rank=32, galore_scale=0.25, galore_update_interval=20)
    assert settings['low-rank'] == dict(rank=32, projection='low-rank') and settings['sltrain'] == dict(rank=32, projection='sltrain')
    assert settings['relora'] == dict(rank=32, projection='relora', relora_interval=100, relora_restart_warmup=10)


def test_the_regime_arithmetic_is_computed_from_the_settings(monkeypatch):
    """Tokens per parameter against a hand count of the parameters (full-rank: 4d^2 + 3df per block;
    CoLA: 11dr + 3rf; both with 2d of norms per block and d at the end), for every preset."""
    import compare
    defaults = public_settings(vars(compare))
    for preset in [[], ['config/compare_quick.py'], ['config/compare_60m.py']]:
        settings = configure(dict(defaults), [os.path.join(ROOT, p) for p in preset])
        for key, value in settings.items():
            monkeypatch.setattr(compare, key, value)
        L, d, f, r = settings['n_layer'], settings['n_embd'], settings['intermediate_size'], settings['rank']
        tokens = settings['max_iters'] * settings['batch_size'] * settings['block_size'] * \
            settings['gradient_accumulation_steps'] * settings['nproc']
        full, cola = L * (4 * d * d + 3 * d * f + 2 * d) + d, L * (11 * d * r + 3 * r * f + 2 * d) + d
        plan = compare.regime()
        assert (plan['tokens'], plan['full_params'], plan['cola_params']) == (tokens, full, cola), preset
        assert plan['tokens_per_full_param'] == tokens / full and plan['tokens_per_cola_param'] == tokens / cola
        assert plan['warmup_iters'] == round(settings['warmup'] * settings['max_iters'])
        assert plan['elas_warmup_iters'] == round(settings['elas_warmup'] * settings['max_iters'])
        assert plan['tsvd_interval'] == settings['max_iters'] // settings['tsvd_adaptations']
        assert plan['galore_update_interval'] == max(1, round(settings['galore_interval'] * settings['max_iters']))
        assert plan['relora_interval'] == max(1, round(settings['relora_interval'] * settings['max_iters']))
        assert plan['paper_tokens_per_param'] == pytest.approx(21.8, abs=0.1)  # 1.31B tokens / 60M parameters
        text = compare.regime_text(plan)
        assert f"{tokens:,} training tokens per run = {tokens / full:.1f} per full-rank" in text


def test_a_resumed_log_keeps_the_redone_steps_records(tmp_path):
    records = [{'config': {}}, {'iter': 10, 'loss': 3.0}, {'iter': 10, 'val_loss': 3.1}, {'iter': 20, 'loss': 2.0},
               {'iter': 20, 'val_loss': 2.5},  # the run stopped after iter 20, its last checkpoint is at 10
               {'config': {}}, {'resumed_at': 10}, {'iter': 10, 'val_loss': 3.1}, {'iter': 20, 'loss': 2.2}]
    (tmp_path / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    kept = read_log(tmp_path / 'log.jsonl')
    assert kept == records[:2] + [records[5], records[7], records[8]]


def test_a_finished_run_is_reused_at_a_rate_equal_to_the_last_bit_and_refused_at_another(tmp_path, monkeypatch):
    import ast
    import compare
    monkeypatch.setattr(compare, 'out_dir', str(tmp_path))
    lr = 8e-3 / 2 ** 0.5  # the run was trained at 4e-3 * sqrt(2), which differs from this in its last bit
    assert 4e-3 * 2 ** 0.5 != lr
    _, commands = compare.plan_run('sweep/cola-lr0.00565685', 'cola', lr, 1)
    settings = dict(arg[2:].split('=', 1) for arg in commands[0] if arg.startswith('--'))
    config = {}
    for key, text in settings.items():
        try:
            config[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            config[key] = text  # a path or a name
    log = tmp_path / 'sweep' / 'cola-lr0.00565685' / 'log.jsonl'
    log.parent.mkdir(parents=True)
    for trained_at, reused in [(4e-3 * 2 ** 0.5, True), (5.6e-3, False)]:
        log.write_text(json.dumps({'config': dict(config, learning_rate=trained_at, min_lr=trained_at / 10)}) + '\n')
        if reused:
            compare.plan_run('sweep/cola-lr0.00565685', 'cola', lr, 1)
        else:
            with pytest.raises(SystemExit, match=r'holds a run trained with learning_rate=0.0056, not 0.0056568'):
                compare.plan_run('sweep/cola-lr0.00565685', 'cola', lr, 1)


@pytest.mark.parametrize('args,message', [
    (["--methods=('cola','lora')"], "methods: 'lora' is not one of full-rank, cola, cola-m, dlr, elas, tsvd"),
    (['--seeds=()'], 'seeds=(): expected one seed or more'),
    (['--sweep_lrs=()', "--methods=('full-rank',)"], 'sweep_lrs=(): no rates to sweep, and full-rank have none'),
    (["--methods=('full-rank',)", "--learning_rates=(('full_rank',4e-3),)"],
     "learning_rates: ('full_rank', 0.004): expected (method, peak lr) pairs, each method one of full-rank"),
])
def test_bad_study_settings_are_one_line_errors(tmp_path, args, message):
    refused(run(tmp_path, 'compare.py', *args, check=False), message)
    assert not (tmp_path / 'out-compare').exists()


def test_a_one_seed_study_without_a_sweep_says_neither_spread_nor_sweep(monkeypatch):
    import compare
    monkeypatch.setattr(compare, 'seeds', (1,))
    monkeypatch.setattr(compare, 'methods', ('full-rank', 'cola'))
    monkeypatch.setattr(compare, 'learning_rates', (('full-rank', 1e-3), ('cola', 4e-3)))
    plan = compare.regime()
    assert not compare.sweeping() and compare.regime_text(plan).endswith('; no sweep (every lr given).')
    row = {'run': 'full-rank-seed1', 'val_loss': 2.0, 'params': 1e6, 'trained_params': 1e6, 'optimizer_bytes': 8e6, 'flops_per_token': 1e6,
           'flops': 1e12, 'tokens_per_s': 1000, 'wall_s': 60, 'evals': [(0, 0, 3.0), (1e12, 1e12, 2.0)]}
    table = compare.markdown(plan, {}, dict(compare.learning_rates), {'full-rank': [row], 'cola': [dict(row, val_loss=2.1, run='cola-seed1')]})
    assert 'Each method at its best peak lr, 1 seed (1); the gaps are to full-rank with the same seed.' in table
    assert '±' not in table and "the sweep's runs" not in table and table.splitlines()[2].startswith('2 runs, 2 minutes')
    monkeypatch.setattr(compare, 'learning_rates', (('full-rank', 1e-3),))
    assert compare.sweeping() and "; the sweep's runs as long as the study's." in compare.regime_text(compare.regime())


def test_a_resumed_runs_wall_time_adds_both_processes_time(tmp_path):
    header = {'config': {'learning_rate': 1e-3}, 'model_params': 10, 'flops_per_token': 1.0}
    lines = [header, {'iter': 0, 'val_loss': 3.0, 'tokens': 0, 'flops': 0, 'elapsed_s': 1.0},
             {'iter': 5, 'loss': 2.5, 'tokens_per_s': 9.0, 'elapsed_s': 40.0},  # killed after 40 s, resumed at 0
             header, {'resumed_at': 0}, {'iter': 0, 'val_loss': 3.0, 'tokens': 0, 'flops': 0, 'elapsed_s': 2.0},
             {'iter': 10, 'val_loss': 2.0, 'tokens': 10, 'flops': 10, 'elapsed_s': 70.0}]
    (tmp_path / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in lines))
    from compare import summary
    assert summary('run', read_log(tmp_path / 'log.jsonl'))['wall_s'] == 110.0


def test_a_runs_training_loss_is_the_mean_of_its_last_tenth_of_logged_steps():
    from compare import summary
    header = {'config': {'learning_rate': 1e-3}, 'model_params': 10, 'flops_per_token': 1.0}
    losses = [5.0 - 0.1 * i for i in range(20)]  # 20 logged steps: the last tenth is the last 2
    records = ([header] + [{'iter': 10 * (i + 1), 'loss': x, 'tokens_per_s': 9.0, 'elapsed_s': i} for i, x in enumerate(losses)]
               + [{'iter': 200, 'val_loss': 3.5, 'tokens': 10, 'flops': 10, 'elapsed_s': 30.0}])
    assert summary('run', records)['train_loss'] == pytest.approx((3.2 + 3.1) / 2)


def test_a_log_cut_short_by_a_kill_loses_its_last_line_only_and_a_damaged_one_is_one_line(tmp_path):
    records = [{'config': {}}, {'iter': 10, 'loss': 3.0}, {'iter': 10, 'val_loss': 3.1}]
    text = ''.join(json.dumps(r) + '\n' for r in records)
    (tmp_path / 'log.jsonl').write_text(text[:-8])  # the last record half written
    assert read_log(tmp_path / 'log.jsonl') == records[:2]
    (tmp_path / 'log.jsonl').write_text(text.replace('"loss": 3.0', '"loss": 3.0,,'))
    with pytest.raises(SystemExit, match='log.jsonl:2: not a JSON line: the log was edited or damaged'):
        read_log(tmp_path / 'log.jsonl')


def test_unreadable_or_partial_scores_are_scored_again(tmp_path):
    from compare import read_scores
    good = {'scored_by': 'lm-eval 0.4.13', 'scores': {'next_passage': {'acc': 0.5, 'items': 5},
                                                      'last_word': {'acc': 0.1, 'items': 5}}}
    (tmp_path / 'evaluate.json').write_text(json.dumps(good))
    assert read_scores(tmp_path / 'evaluate.json', 5) == {'next_passage': 0.5, 'last_word': 0.1}
    assert read_scores(tmp_path / 'evaluate.json', 7) is None  # scored on other items
    hand_written = json.dumps({k: v for k, v in good.items() if k != 'scored_by'})  # scored before lm-eval: again
    for broken in ('{"run": "x", "iter": 20, "scores": ', '{"scores": {}}', '', hand_written):
        (tmp_path / 'evaluate.json').write_text(broken)
        assert read_scores(tmp_path / 'evaluate.json', 5) is None
    assert read_scores(tmp_path / 'missing.json', 5) is None


def test_a_second_compare_on_the_same_out_dir_is_refused(tmp_path):
    import fcntl
    (tmp_path / 'out-compare').mkdir()
    with open(tmp_path / 'out-compare' / 'compare.lock', 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a first compare.py holds it
        refused(run(tmp_path, 'compare.py', '--data_dir=nowhere', check=False),
                'out-compare/ is in use by another compare.py: wait for it, or use another out_dir')
    (tmp_path / 'a_file').write_text('not a folder')
    refused(run(tmp_path, 'compare.py', '--out_dir=a_file', check=False), "out_dir='a_file' is a file, not a folder")
