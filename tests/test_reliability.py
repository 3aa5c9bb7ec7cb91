"""Careless or hostile use: checkpoints never run code, nothing finished is lost, signals save, bad input is one line.
Each test runs the scripts as a user would and checks the exit status, the one line, and the checksums of what existed."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from conftest import TINY_TRAIN
from helpers import ROOT, digest, refused, run, start, train_log, wait_for

from shards import write_durably

TRAIN = [*TINY_TRAIN, '--data_dir=data', '--eval_interval=5']


@pytest.fixture(scope='module')
def trained(data):
    """data/ with a finished 10-step run in run/ (and its trajectory), made once."""
    run(data, 'train.py', *TRAIN, '--out_dir=run', '--max_iters=10', '--keep_checkpoints=True')
    return data


def script_env():
    """The environment helpers.run gives a script: eager PyTorch, not conftest.py's Triton interpreter."""
    return {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}


class Payload:  # unpickling this calls os.system: a checkpoint that would run code
    def __reduce__(self):
        return (os.system, ('touch pwned',))


def test_a_crafted_checkpoint_runs_no_code_in_train_sample_or_analyze(trained):
    (trained / 'evil').mkdir(exist_ok=True)
    torch.save({'model': Payload(), 'model_config': {}, 'config': {}, 'encoding': 'byte'}, trained / 'evil' / 'ckpt.pt')
    before = digest(trained / 'evil')
    for script, args in [('train.py', [*TRAIN, '--out_dir=evil', '--init_from=resume', '--max_iters=12']),
                         ('sample.py', ['--out_dir=evil', '--device=cpu']), ('analyze.py', ['--runs=evil'])]:
        refused(run(trained, script, *args, check=False), 'evil/ckpt.pt holds objects other than tensors and plain values')
        assert not (trained / 'pwned').exists()
    assert digest(trained / 'evil') == before


def test_every_checkpoint_train_py_writes_loads_as_data(trained):
    for name in ('ckpt.pt', 'best.pt', 'ckpt_5.pt', 'ckpt_10.pt'):
        assert 'optimizer' in torch.load(trained / 'run' / name, weights_only=True)


def test_prepare_checks_a_new_out_dir_without_touching_its_existing_parents(tmp_path):
    (tmp_path / 'text.txt').write_text('tiny')
    (tmp_path / 'parent').mkdir(mode=0o750)
    refused(run(tmp_path, 'prepare.py', '--input_files=text.txt', '--encoding=byte', '--out_dir=parent/a/b', check=False),
            'all taken by the validation split')
    assert (tmp_path / 'parent').is_dir() and (tmp_path / 'parent').stat().st_mode & 0o777 == 0o750
    assert not (tmp_path / 'parent' / 'a').exists()


def test_a_shard_name_that_leaves_the_data_folder_is_refused(trained):
    shutil.copytree(trained / 'data', trained / 'crafted', dirs_exist_ok=True)
    meta = json.loads((trained / 'crafted' / 'meta.json').read_text())
    meta['splits']['train']['shards'] = ['../data/train_000000.bin']
    (trained / 'crafted' / 'meta.json').write_text(json.dumps(meta))
    refused(run(trained, 'train.py', *TINY_TRAIN, '--data_dir=crafted', '--out_dir=never', check=False),
            "crafted/meta.json names the shard '../data/train_000000.bin'")
    assert not (trained / 'never').exists()


def test_training_from_scratch_into_a_finished_run_is_refused_unless_asked_to_start_over(trained):
    before = digest(trained / 'run')
    refused(run(trained, 'train.py', *TRAIN, '--out_dir=run', '--max_iters=4', check=False),
            'run/ already holds a run (best.pt): continue it with --init_from=resume')
    assert digest(trained / 'run') == before
    shutil.copytree(trained / 'run', trained / 'again')
    (trained / 'again' / 'evaluate.json').write_text('{"the old run": "scores"}')
    run(trained, 'train.py', *TRAIN, '--out_dir=again', '--max_iters=4', '--start_over=True')
    assert not (trained / 'again' / 'ckpt_10.pt').exists() and max(train_log(trained / 'again')[0]) == 4
    assert not (trained / 'again' / 'evaluate.json').exists()  # the old run's scores go with it


@pytest.mark.parametrize('change,message', [
    ('--seed=7', "seed=7 differs from the checkpoint's seed=1337"),
    ('--data_dir=other', 'other/ holds other data than the run was trained on'),
])
def test_a_resume_that_would_change_the_data_order_or_the_data_is_refused(trained, change, message):
    if not (trained / 'other').exists():
        (trained / 'other.txt').write_text('something else entirely. ' * 800)
        run(trained, 'prepare.py', '--input_files=other.txt', '--encoding=byte', '--out_dir=other', '--val_tokens=4096')
    before = digest(trained / 'run')
    refused(run(trained, 'train.py', *TRAIN, '--out_dir=run', '--max_iters=12', '--init_from=resume', change, check=False),
            message)
    assert digest(trained / 'run') == before


def test_sigterm_saves_the_step_and_the_resumed_run_equals_an_uninterrupted_one(trained):
    common = [*TRAIN, '--max_iters=30', '--eval_interval=100', '--log_interval=1']
    one_thread = {'OMP_NUM_THREADS': '1'}  # bit-exact comparisons whatever else the machine runs
    run(trained, 'train.py', *common, '--out_dir=whole', env=one_thread)
    job = start(trained, 'train.py', *common, '--out_dir=cut', env=one_thread, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: '"loss"' in (trained / 'cut' / 'log.jsonl').read_text(), job, 'the run to log its first loss')
    job.send_signal(signal.SIGSTOP)  # paused before its last step however fast the machine is; the signal waits
    job.send_signal(signal.SIGTERM)
    job.send_signal(signal.SIGCONT)
    _, err = job.communicate(timeout=600)
    assert job.returncode != 0 and 'Traceback' not in err
    assert 'SIGTERM: stopped after iter' in err.strip().splitlines()[-1] and '--init_from=resume' in err
    stopped_at = torch.load(trained / 'cut' / 'ckpt.pt', weights_only=True)['iter_num']
    assert 0 < stopped_at < 30
    run(trained, 'train.py', *common, '--out_dir=cut', '--init_from=resume', env=one_thread)
    assert train_log(trained / 'cut') == train_log(trained / 'whole')


def test_a_second_signal_stops_at_once_and_leaves_the_last_checkpoint_whole(trained):
    common = [*TRAIN, '--max_iters=200', '--eval_interval=3', '--log_interval=1']  # about a minute alone
    job = start(trained, 'train.py', *common, '--out_dir=twice', stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: (trained / 'twice' / 'ckpt.pt').exists(), job, 'the run to write its first checkpoint')
    job.send_signal(signal.SIGINT)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=600)
    assert job.returncode != 0 and 'Traceback' not in err and 'SIGINT' in err.strip().splitlines()[-1]
    assert torch.load(trained / 'twice' / 'ckpt.pt', weights_only=True)['iter_num'] % 3 == 0 or 'stopped after' in err


def test_a_full_disk_is_one_line_and_leaves_the_previous_file_and_no_temporary_file(tmp_path):
    target = tmp_path / 'analysis.json'
    target.write_text('{"the": "previous result"}')
    (tmp_path / '.analysis.json.tmp999999999.a1b2c3').write_text('left by a killed process')

    def disk_full(f):
        f.write(b'{"half')
        raise OSError(28, 'No space left on device')

    with pytest.raises(SystemExit, match='could not write .*analysis.json .No space left on device.; the previous '
                                         'analysis.json is unchanged'):
        write_durably(str(target), disk_full)
    assert target.read_text() == '{"the": "previous result"}' and os.listdir(tmp_path) == ['analysis.json']


def test_prepare_reads_each_real_file_once_and_notices_a_changed_source(tmp_path):
    (tmp_path / 'src').mkdir()
    for i in range(3):
        (tmp_path / 'src' / f'{i}.txt').write_text(f'document {i} ' * 400)
    os.symlink('.', tmp_path / 'src' / 'loop')  # src/loop/loop/... reaches the same files again and again
    run(tmp_path, 'prepare.py', '--input_files=src/**/*.txt', '--encoding=byte', '--out_dir=out', '--val_tokens=100')
    meta = json.loads((tmp_path / 'out' / 'meta.json').read_text())
    assert meta['splits']['train']['sources'] == ['src/0.txt', 'src/1.txt', 'src/2.txt']
    before = digest(tmp_path / 'out')
    (tmp_path / 'src' / '1.txt').write_text('changed since')
    refused(run(tmp_path, 'prepare.py', '--input_files=src/**/*.txt', '--encoding=byte', '--out_dir=out',
                '--val_tokens=100', check=False), 'src/1.txt changed since out/train_000001.bin was made from it')
    assert digest(tmp_path / 'out') == before


@pytest.mark.parametrize('script,args,message', [
    ('prepare.py', ['--input_files=x.txt', '--val_tokens=-5'], 'val_tokens=-5: expected an integer from 1 up'),
    ('prepare.py', ['--train_shards=2000'], 'train_shards=2000: expected an integer from 1 to 1024'),
    ('train.py', ['--batch_size=None'], 'batch_size=None is None, expected an int'),
    ('sample.py', ['--out_dir=run', '--device=cuda'], "device=cuda: expected 'cpu', or 'cuda' on a machine with a CUDA GPU"),
    ('train.py', [*TRAIN, '--out_dir=afile'], "out_dir='afile' cannot be written"),
    ('analyze.py', ['--runs=run', '--batch_size=0'], 'batch_size=0: expected a positive number'),
    ('analyze.py', ['--runs=run,nothing'], 'no checkpoint nothing/ckpt.pt'),
    ('analyze.py', ['--runs=run', '--reference=gone'], 'no checkpoint gone/ckpt.pt'),  # missing, not "corrupt"
    ('sample.py', ['--out_dir=gone'], 'no checkpoint gone/ckpt.pt'),
    ('compare.py', ['--seeds=(1, 1)'], 'seeds=(1, 1): a seed twice would count one run as two'),
    ('compare.py', ["--trend=('nowhere',)", '--out_dir=trend'], 'trend: nowhere/ holds no full-rank and CoLA runs'),
    ('compare.py', ['--jobs=0'], 'jobs=0: expected 1 or more runs at a time'),
])
def test_bad_settings_are_one_line_errors(trained, script, args, message):
    (trained / 'afile').write_text('a file, not a folder')
    if torch.cuda.is_available() and '--device=cuda' in args:
        pytest.skip('a GPU is here')
    before = digest(trained / 'run')
    refused(run(trained, script, *args, check=False), message)
    assert digest(trained / 'run') == before


def test_a_tiny_temperature_samples_greedily(trained):
    greedy = run(trained, 'sample.py', '--out_dir=run', '--device=cpu', '--temperature=0', '--num_samples=1',
                 '--max_new_tokens=20', '--start=the cat')
    tiny = run(trained, 'sample.py', '--out_dir=run', '--device=cpu', '--temperature=1e-40', '--num_samples=1',
               '--max_new_tokens=20', '--start=the cat')
    assert tiny.stdout == greedy.stdout


@pytest.mark.parametrize('edit', ['dlr', 'tsvd'])
def test_a_hand_edited_checkpoint_is_one_line(trained, edit):
    folder = trained / f'edited_{edit}'
    if not (folder / 'ckpt.pt').exists():
        method = ['--dlr_alpha=1.0'] if edit == 'dlr' else ['--projection=tsvd', '--tsvd_interval=2', '--tsvd_min_rank=4']
        run(trained, 'train.py', *TRAIN, *method, f'--out_dir=edited_{edit}', '--max_iters=4')
    checkpoint = torch.load(folder / 'ckpt.pt', weights_only=True)
    if edit == 'dlr':
        checkpoint['model_config']['dlr_alpha'] = 0.0  # the residual buffers are now unexpected
    else:
        checkpoint['model']['blocks.0.attn.q_proj.S'] = torch.zeros(3, 5)  # not square
    torch.save(checkpoint, folder / 'ckpt.pt')
    before = digest(folder)
    for script, args in [('sample.py', [f'--out_dir=edited_{edit}', '--device=cpu']),
                         ('analyze.py', [f'--runs=edited_{edit}', '--landscape=False'])]:
        refused(run(trained, script, *args, check=False),
                f'edited_{edit}/ckpt.pt: its weights do not make the model its model_config describes')
    assert digest(folder) == before


def test_analyze_ignores_a_stray_checkpoint_and_refuses_a_reference_of_another_encoding(trained):
    shutil.copy(trained / 'run' / 'ckpt.pt', trained / 'run' / 'ckpt_final.pt')
    try:
        run(trained, 'analyze.py', '--runs=run', '--out_dir=analysis', '--landscape=False', '--eval_tokens=512',
            '--alphas=3')
    finally:
        os.remove(trained / 'run' / 'ckpt_final.pt')
    other = torch.load(trained / 'run' / 'ckpt.pt', weights_only=True)
    (trained / 'gpt2run').mkdir(exist_ok=True)
    torch.save({**other, 'encoding': 'gpt2'}, trained / 'gpt2run' / 'ckpt.pt')
    refused(run(trained, 'analyze.py', '--runs=run', '--reference=gpt2run', '--out_dir=analysis2', check=False),
            "the reference gpt2run on 'gpt2' tokens: their hidden states are not of the same tokens")


def test_analyze_says_where_a_moved_data_folder_should_be(trained):
    checkpoint = torch.load(trained / 'run' / 'ckpt.pt', weights_only=True)
    (trained / 'moved').mkdir(exist_ok=True)
    torch.save({**checkpoint, 'config': {**checkpoint['config'], 'data_dir': 'gone'}}, trained / 'moved' / 'ckpt.pt')
    refused(run(trained, 'analyze.py', '--runs=moved', '--out_dir=analysis3', check=False),
            'was trained on gone/, which holds no meta.json now: give --data_dir=')


def test_bench_tables_work_from_outside_the_repository(tmp_path):
    rows = [line for line in run(tmp_path, 'bench.py', '--table=params').stdout.splitlines() if line.startswith('| config/')]
    assert len(rows) == 10


def test_a_full_disk_while_saving_is_one_line_leaves_no_temporary_file_and_records_nothing_unsaved(trained):
    """A file-size limit (ulimit -f) stands in for a full disk: torch.save fails inside the durable write."""
    import resource
    shutil.copytree(trained / 'run', trained / 'full', ignore=shutil.ignore_patterns('ckpt_*.pt', 'train.lock'))
    before = digest(trained / 'full')
    limit = os.path.getsize(trained / 'full' / 'ckpt.pt') // 2  # the next checkpoint cannot be written whole
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'train.py'), *TRAIN, '--out_dir=full', '--max_iters=15',
                        '--init_from=resume'], cwd=trained, env=script_env(), capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    refused(r, 'could not write full/')
    assert "the previous best.pt is unchanged" in r.stderr or "the previous ckpt.pt is unchanged" in r.stderr
    assert sorted(os.listdir(trained / 'full')) == sorted(before) + ['train.lock']  # no temporary file
    assert digest(trained / 'full')['ckpt.pt'] == before['ckpt.pt']
    assert 15 not in train_log(trained / 'full')[1]  # iter 15's result is not recorded: its state was not saved


def test_compare_trusts_the_final_checkpoint_not_the_log(trained, monkeypatch):
    """A log that records the final evaluation beside an earlier checkpoint (a kill or a full disk between the two in
    an older train.py) is an unfinished run: compare.py resumes it rather than scoring the earlier model."""
    import compare
    shape = dict(n_layer=2, n_head=2, n_embd=64, intermediate_size=128, rank=16, block_size=32, batch_size=4)
    for key, value in {**shape, 'data_dir': str(trained / 'data'), 'out_dir': str(trained / 'cmp'), 'max_iters': 10,
                       'eval_interval': 5, 'eval_tokens': 1024, 'downstream_items': 0, 'keep_checkpoints': True}.items():
        monkeypatch.setattr(compare, key, value)
    _, commands = compare.plan_run('full-rank-seed1', 'full-rank', 3e-3, 1)
    subprocess.run(commands[0], env=script_env(), check=True, capture_output=True, timeout=300)
    run_dir = trained / 'cmp' / 'full-rank-seed1'
    assert compare.plan_run('full-rank-seed1', 'full-rank', 3e-3, 1)[1] == []  # finished: nothing to run
    shutil.copy(run_dir / 'ckpt_5.pt', run_dir / 'ckpt.pt')  # the final record stays in log.jsonl, iter 10's state lost
    _, commands = compare.plan_run('full-rank-seed1', 'full-rank', 3e-3, 1)
    assert len(commands) == 1 and commands[0][-1] == '--init_from=resume'


@pytest.mark.parametrize('planted', ['train.lock', 'log.jsonl'])
def test_a_link_planted_in_the_out_dir_is_refused_and_its_target_untouched(trained, tmp_path, planted):
    victim = tmp_path / 'victim.txt'
    victim.write_text('a file of the user that a neighbour points at')
    shutil.copytree(trained / 'run', trained / f'links-{planted}', ignore=shutil.ignore_patterns('ckpt_*.pt', 'train.lock'))
    os.replace(trained / f'links-{planted}' / 'log.jsonl', tmp_path / 'log.jsonl')  # (the resumed run's own)
    os.symlink(victim, trained / f'links-{planted}' / planted)
    r = run(trained, 'train.py', *TRAIN, f'--out_dir=links-{planted}', '--max_iters=12', '--init_from=resume', check=False)
    refused(r, f'{planted} (it is a symbolic link): remove it, or use another folder')
    assert victim.read_text() == 'a file of the user that a neighbour points at'


def test_a_durable_write_replaces_a_planted_link_never_its_target(tmp_path):
    victim = tmp_path / 'victim.txt'
    victim.write_text('untouched')
    os.symlink(victim, tmp_path / 'ckpt.pt')
    write_durably(str(tmp_path / 'ckpt.pt'), lambda f: f.write(b'the checkpoint'))
    assert victim.read_text() == 'untouched' and not os.path.islink(tmp_path / 'ckpt.pt')
    assert (tmp_path / 'ckpt.pt').read_bytes() == b'the checkpoint'
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt', 'victim.txt']  # no temporary file left


def test_an_analysis_rerun_that_fails_partway_leaves_the_complete_earlier_analysis(trained):
    off = ['--activations=False', '--weights=False', '--updates=False', '--landscape=False', '--interpolation=False',
           '--similarity=False', '--out_dir=an']
    run(trained, 'analyze.py', '--runs=run', *off)
    before = digest(trained / 'an')
    shutil.copytree(trained / 'run', trained / 'relocated', ignore=shutil.ignore_patterns('ckpt_*.pt', 'train.lock'))
    checkpoint = torch.load(trained / 'relocated' / 'ckpt.pt', weights_only=True)
    checkpoint['config']['data_dir'] = 'gone'  # its data folder no longer there: found only when its turn comes
    torch.save(checkpoint, trained / 'relocated' / 'ckpt.pt')
    refused(run(trained, 'analyze.py', '--runs=run,relocated', *off, check=False), 'relocated/ckpt.pt was trained on gone/')
    assert {f: h for f, h in digest(trained / 'an').items() if 'partial' not in f} == before
    assert [r['run'] for r in json.loads((trained / 'an' / 'analysis.partial.json').read_text())['runs']] == ['run']


def test_analyze_refuses_in_one_line_an_out_dir_that_is_a_file_bad_scores_and_runs_of_another_shape(trained):
    off = ['--activations=False', '--weights=False', '--updates=False', '--landscape=False', '--interpolation=False']
    (trained / 'a_file').write_text('not a folder')
    refused(run(trained, 'analyze.py', '--runs=run', *off, '--similarity=False', '--out_dir=a_file', check=False),
            "out_dir='a_file' is a file, not a folder")
    shutil.copytree(trained / 'run', trained / 'scored', ignore=shutil.ignore_patterns('ckpt_*.pt', 'train.lock'))
    (trained / 'scored' / 'evaluate.json').write_text('{"iter": 10, "scores": ')
    refused(run(trained, 'analyze.py', '--runs=scored', *off, '--similarity=False', '--out_dir=an2', check=False),
            "scored/evaluate.json is not evaluate.py's output: rerun evaluate.py --out_dir=scored, or delete it")
    run(trained, 'train.py', *TRAIN, '--out_dir=wide', '--max_iters=1', '--n_embd=128', '--intermediate_size=256')
    refused(run(trained, 'analyze.py', '--runs=wide', '--reference=run', *off, '--out_dir=an3', check=False),
            "wide has {'n_layer': 2, 'n_embd': 128, 'block_size': 32} where the reference run has")
