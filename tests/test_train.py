import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import TINY_TRAIN as TINY
from conftest import needs_gpt2
from helpers import ROOT, digest, refused, run, start, train_log, wait_for

from shards import write_shard


def test_tiny_run_loss_falls(data):
    out = run(data, 'train.py', *TINY, '--data_dir=data', '--out_dir=falls', '--max_iters=40', '--eval_interval=20').stdout
    assert 'max_iters=40 and' not in out  # its schedules fit: no warning
    losses, val = train_log(data / 'falls')
    assert losses[40] < losses[1] - 1.0 and val[40] < val[0] - 1.0
    assert os.path.exists(data / 'falls' / 'ckpt.pt') and os.path.exists(data / 'falls' / 'best.pt')


@pytest.mark.parametrize('method,misfits', [
    (['--projection=tsvd', '--mlp=elas'], ['warmup_iters=5: the learning rate never reaches', '--warmup_iters=0',
                                           'tsvd_interval=1000: TSVD never adapts', '--tsvd_interval=1',
                                           "elas_warmup_iters=1000: ELAS's 2:4 sparsity never", '--elas_warmup_iters=0']),
    (['--projection=relora', '--relora_interval=10', '--warmup_iters=0'],
     ['lr_decay_iters=40: the cosine ends at', '--lr_decay_iters=2', 'relora_interval=10: ReLoRA never merges',
      'relora_restart_warmup=100 is not shorter than relora_interval=10', '--relora_restart_warmup=1']),
    (['--rank=0', '--optimizer=galore', '--galore_rank=8', '--warmup_iters=0'],
     ['galore_update_interval=200: the projector is never refreshed', '--galore_update_interval=1']),
], ids=['tsvd-elas', 'relora', 'galore'])
def test_a_shortened_run_names_each_schedule_that_no_longer_fits_and_its_fix(data, method, misfits):
    out = run(data, 'train.py', *TINY, *method, '--data_dir=data', f'--out_dir=short{len(misfits)}', '--max_iters=2',
              '--eval_tokens=128').stdout
    lines = [line for line in out.splitlines() if line.startswith('max_iters=2 and ')]
    first = {'tsvd-elas': 'training TSVD + ELAS (start rank 16, ranks adapted every 1000 steps',
             'relora': 'training ReLoRA (rank 16; of the parameters below',
             'galore': 'training GaLore (gradients projected to rank 8, the projector refreshed every 200 steps'}
    kind = 'galore' if '--optimizer=galore' in method else 'relora' if '--projection=relora' in method else 'tsvd-elas'
    assert out.startswith(first[kind]), out.splitlines()[0]  # the first line: what the method is set to do
    for misfit in misfits:
        assert any(misfit in line for line in lines), (misfit, out)


def test_a_shortened_run_names_each_method_schedule_that_keeps_the_long_runs_steps(data):
    # config/cpu_tiny.py's schedules, 10% of 300 steps, in a run of 60: each would fall at 50% of it
    out = run(data, 'train.py', *TINY, '--data_dir=data', '--out_dir=short-share', '--max_iters=60', '--lr_decay_iters=300',
              '--projection=relora', '--relora_interval=30', '--relora_restart_warmup=3', '--eval_tokens=128',
              '--eval_interval=1000').stdout
    assert ('max_iters=60 and relora_interval=30, set for lr_decay_iters=300 steps, falls at 50% of this run; '
            'set --relora_interval=6 to keep its share') in out


def test_resume_gives_exactly_the_losses_of_an_uninterrupted_run(data):
    common = [*TINY, '--data_dir=data', '--eval_interval=10', '--gradient_accumulation_steps=2']
    run(data, 'train.py', *common, '--out_dir=straight', '--max_iters=20')
    run(data, 'train.py', *common, '--out_dir=stopped', '--max_iters=10')
    run(data, 'train.py', *common, '--out_dir=stopped', '--max_iters=20', '--init_from=resume')
    straight, straight_val = train_log(data / 'straight')
    resumed, resumed_val = train_log(data / 'stopped')
    assert sorted(resumed) == list(range(1, 21))
    assert resumed == straight and resumed_val == straight_val  # exact, not approximately


def test_the_seed_sets_the_init_and_the_order_of_the_training_sequences_and_repeats_a_run_exactly(data):
    """The first step's loss is that of the model torch.manual_seed(seed) builds, on the sequences
    order_0 = numpy's permutation seeded by (seed, 0) picks (train.py's TokenStream); so two seeds give two
    inits and two orders, and one seed gives the same run twice."""
    import torch
    from model import ModelConfig, Transformer
    from shards import read_shard
    tokens = read_shard(data / 'data' / 'train_000000.bin').astype(np.int64)
    T, B = 32, 4
    common = [*TINY, '--data_dir=data', '--max_iters=3', '--eval_interval=3']
    first_batches = []
    for seed in (1, 2):
        order = np.random.default_rng([seed, 0]).permutation((len(tokens) - 1) // T)[:B]
        first_batches.append(sorted(order))
        rows = torch.from_numpy(np.stack([tokens[j * T:(j + 1) * T + 1] for j in order]))
        torch.manual_seed(seed)
        model = Transformer(ModelConfig(vocab_size=320, block_size=T, n_layer=2, n_head=2, n_embd=64,
                                        intermediate_size=128, rank=16))
        with torch.no_grad():
            _, expected = model(rows[:, :-1], rows[:, 1:])
        run(data, 'train.py', *common, f'--seed={seed}', f'--out_dir=seed{seed}')
        assert train_log(data / f'seed{seed}')[0][1] == pytest.approx(expected.item(), rel=1e-6)
    assert first_batches[0] != first_batches[1]
    run(data, 'train.py', *common, '--seed=2', '--out_dir=seed2-again')
    assert train_log(data / 'seed2-again') == train_log(data / 'seed2')


@pytest.mark.parametrize('parallel', ['ddp', 'fsdp'])
def test_two_processes_match_one_with_the_same_global_batch(data, parallel):
    common = [*TINY, '--data_dir=data', '--eval_interval=6', '--max_iters=6', '--gradient_accumulation_steps=2']
    run(data, 'train.py', *common, f'--out_dir=one-{parallel}', '--batch_size=4')
    run(data, 'train.py', *common, f'--out_dir={parallel}', '--batch_size=2', f'--parallel={parallel}', torchrun=2)
    one, one_val = train_log(data / f'one-{parallel}')
    two, two_val = train_log(data / parallel)
    assert one.keys() == two.keys()
    for it in one:
        assert two[it] == pytest.approx(one[it], abs=1e-5), it
    assert two_val[6] == pytest.approx(one_val[6], abs=1e-5)
    # the checkpoint holds whole tensors, whichever way the training was split
    resumed = run(data, 'train.py', *common, f'--out_dir={parallel}', '--batch_size=4', '--max_iters=7', '--init_from=resume')
    assert 'resumed from' in resumed.stdout


def test_cola_m_trains_exactly_like_cola(data):
    common = [*TINY, '--data_dir=data', '--eval_interval=8', '--max_iters=8']
    run(data, 'train.py', *common, '--out_dir=cola')
    run(data, 'train.py', *common, '--out_dir=colam', '--checkpointing=cola-m')
    cola, _ = train_log(data / 'cola')
    colam, _ = train_log(data / 'colam')
    for it in cola:
        assert colam[it] == pytest.approx(cola[it], rel=1e-5), it


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(data):
    common = [*TINY, '--data_dir=data', '--eval_interval=5', '--out_dir=nan']
    run(data, 'train.py', *common, '--max_iters=5')
    good = open(data / 'nan' / 'ckpt.pt', 'rb').read()
    r = run(data, 'train.py', *common, '--max_iters=30', '--init_from=resume', '--learning_rate=1e30', check=False)
    assert r.returncode != 0
    assert 'is nan at iter' in r.stderr.strip().splitlines()[-1] and 'last good checkpoint' in r.stderr
    assert open(data / 'nan' / 'ckpt.pt', 'rb').read() == good
    last = json.loads((data / 'nan' / 'log.jsonl').read_text().splitlines()[-1])  # the log says so too (compare.py reads it)
    assert last['diverged'].endswith('is nan') and f"is nan at iter {last['iter']}:" in r.stderr


def test_a_missing_data_folder_says_which_prepare_command_to_run(tmp_path):
    r = run(tmp_path, 'train.py', *TINY, '--data_dir=data/nothing', check=False)
    assert r.returncode != 0 and 'python prepare.py --out_dir=data/nothing' in r.stderr.strip().splitlines()[-1]


@needs_gpt2
def test_a_vocabulary_mismatch_is_refused(data):
    refused(run(data, 'train.py', *TINY, '--data_dir=data', '--vocab_size=128', check=False),
            'vocab_size=128 is smaller than the vocabulary of data/')
    run(data, 'train.py', *TINY, '--data_dir=data', '--out_dir=vocab', '--max_iters=2', '--eval_interval=2')
    run(data, 'prepare.py', '--input_files=corpus.txt', '--encoding=gpt2', '--out_dir=data_gpt2', '--val_tokens=1000')
    refused(run(data, 'train.py', *TINY, '--data_dir=data_gpt2', '--out_dir=vocab', '--init_from=resume', check=False),
            "trained on encoding='byte' data, but data_gpt2/ holds 'gpt2' tokens")


def test_config_typos_are_caught(tmp_path):
    r = run(tmp_path, 'train.py', '--learning_rat=1e-3', check=False)
    assert r.returncode != 0 and '--learning_rat: unknown setting' in r.stderr
    r = run(tmp_path, 'train.py', '--batch_size=big', check=False)
    assert r.returncode != 0 and "batch_size='big' is a str, expected an int" in r.stderr
    r = run(tmp_path, 'train.py', 'config/nope.py', check=False)
    assert r.returncode != 0 and "config file 'config/nope.py' not found" in r.stderr


def test_a_second_run_into_a_busy_out_dir_is_refused_and_a_killed_run_leaves_no_stale_lock(data):
    common = [*TINY, '--data_dir=data', '--out_dir=busy', '--eval_interval=2']
    run(data, 'train.py', *common, '--max_iters=2')
    first = start(data, 'train.py', *common, '--max_iters=200', '--init_from=resume',  # about a minute alone
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: 'resumed_at' in (data / 'busy' / 'log.jsonl').read_text(), first,
                 'the first run to log that it resumed (it holds the lock from then on)')
        first.send_signal(signal.SIGSTOP)  # it holds the lock however slowly the second run starts
        r = run(data, 'train.py', *common, '--max_iters=4', '--init_from=resume', check=False)
        refused(r, f'busy/ is in use by another training run (pid {first.pid})')
    finally:
        first.kill()
        first.wait()
    r = run(data, 'train.py', *common, '--max_iters=4', '--init_from=resume')  # the kill released the lock
    assert 'resumed from' in r.stdout


@pytest.mark.parametrize('override,message', [
    ('--rank=8', 'rank=8 differs from the checkpoint\'s rank=16'),
    ('--rank=0', 'rank=0 differs from the checkpoint\'s rank=16'),
    ('--n_embd=32', 'n_embd=32 differs from the checkpoint\'s n_embd=64'),
    ('--n_layer=3', 'n_layer=3 differs from the checkpoint\'s n_layer=2'),
    ('--block_size=16', 'block_size=16 differs from the checkpoint\'s block_size=32'),
])
def test_resume_refuses_a_different_model_shape_and_changes_nothing(data, override, message):
    common = [*TINY, '--data_dir=data', '--out_dir=shape', '--eval_interval=2']
    if not (data / 'shape' / 'ckpt.pt').exists():
        run(data, 'train.py', *common, '--max_iters=2')
    before = digest(data / 'shape')
    refused(run(data, 'train.py', *common, '--max_iters=4', '--init_from=resume', override, check=False), message)
    assert digest(data / 'shape') == before


def test_resume_may_change_how_the_model_runs(data):
    common = [*TINY, '--data_dir=data', '--out_dir=howto', '--eval_interval=2']
    run(data, 'train.py', *common, '--max_iters=2')
    run(data, 'train.py', *common, '--max_iters=4', '--init_from=resume', '--checkpointing=cola-m', '--fused_cola=False')


def test_a_resume_applies_changed_optimizer_settings_or_refuses_them(data):
    import torch
    common = [*TINY, '--data_dir=data', '--out_dir=opt', '--eval_interval=2']
    run(data, 'train.py', *common, '--max_iters=2')
    r = run(data, 'train.py', *common, '--max_iters=4', '--init_from=resume', '--weight_decay=0.1', '--beta2=0.95')
    assert 'resuming with changed settings, applied from here on: weight_decay 0.01 -> 0.1, beta2 0.999 -> 0.95' in r.stdout
    groups = torch.load(data / 'opt' / 'ckpt.pt', weights_only=True)['optimizer']['param_groups']
    assert [g['weight_decay'] for g in groups] == [0.1, 0.0] and all(g['betas'] == (0.9, 0.95) for g in groups)
    galore = [*TINY, '--data_dir=data', '--out_dir=opt-galore', '--eval_interval=2', '--rank=0', '--optimizer=galore',
              '--galore_rank=8']
    run(data, 'train.py', *galore, '--max_iters=2')
    refused(run(data, 'train.py', *galore[:-1], '--galore_rank=4', '--max_iters=4', '--init_from=resume', check=False),
            "galore_rank=4 differs from the checkpoint's galore_rank=8, which its optimizer state is made for")


def test_a_truncated_checkpoint_on_resume_points_to_best_pt(data):
    common = [*TINY, '--data_dir=data', '--out_dir=cut', '--eval_interval=2']
    run(data, 'train.py', *common, '--max_iters=2')
    (data / 'cut' / 'ckpt.pt').write_bytes((data / 'cut' / 'ckpt.pt').read_bytes()[:10000])
    r = run(data, 'train.py', *common, '--max_iters=4', '--init_from=resume', check=False)
    refused(r, 'cut/ckpt.pt is truncated or corrupt')
    assert 'cut/best.pt holds the best state so far' in r.stderr


def test_a_resumed_log_marks_the_resume(data):
    common = [*TINY, '--data_dir=data', '--out_dir=marked', '--eval_interval=3']
    run(data, 'train.py', *common, '--max_iters=3')
    run(data, 'train.py', *common, '--max_iters=6', '--init_from=resume')
    records = [json.loads(line) for line in open(data / 'marked' / 'log.jsonl')]
    assert {'resumed_at': 3} in records and records.index({'resumed_at': 3}) < [r.get('iter') for r in records].index(4)
    r = run(data, 'train.py', *common, '--max_iters=7', '--init_from=resume', '--log_interval=1')
    assert 'iter 7/7: loss' in r.stdout and ', eta 0h00m' in r.stdout


@pytest.mark.parametrize('args,message', [
    (['--rank=-4'], 'rank=-4: expected 0 (full-rank) or a bottleneck narrower than n_embd=64'),
    (['--n_layer=0'], 'n_layer=0: expected a positive integer'),
    (['--n_head=3'], 'n_embd=64 must split into n_head=3 heads of even size'),
    (['--batch_size=0'], 'batch_size=0: expected a positive number'),
    (['--eval_interval=0'], 'eval_interval=0: expected a positive number'),
    (['--gradient_accumulation_steps=0'], 'gradient_accumulation_steps=0: expected a positive number'),
    (['--max_iters=-1'], 'max_iters=-1: expected 0 or more'),
    (['--seed=-1'], 'seed=-1: expected 0 or more'),
    (['--learning_rate=0.0'], 'learning_rate=0.0: expected a positive number'),
    (['--device=cdua'], "device='cdua': expected 'cpu', or 'cuda' / 'cuda:N' on a machine with a CUDA GPU"),
    (['--dtype=float16'], "dtype='float16': expected one of ('float32', 'bfloat16')"),
    (['--block_size=2000000'], 'block_size=2000000 is longer than the train split of data/'),
    (['--block_size=4000', '--batch_size=2'], '(4,096 tokens) is smaller than one evaluation batch of 2 x 4000 tokens'),
    (['--learning_rate=1e999'], 'learning_rate=inf: expected a finite number'),
    (['--vocab_size=abc'], "vocab_size='abc': expected None (the data's) or a positive integer"),
    (['--max_iters=0'], 'max_iters=0: a new run would train nothing and save no checkpoint'),
    (['--rank=0', '--optimizer=galore', '--galore_rank=1000'], 'galore_rank=1000: expected fewer than the projected'),
    (['--projection=sltrain', '--sltrain_delta=1e-9'], 'sltrain_delta=1e-09: expected a density in (0, 1] that gives'),
    (['--relora_warm_start=out'], "relora_warm_start='out' with projection='cola': the warm start is ReLoRA's"),
    pytest.param(['--wandb_log=True'], 'wandb_log=True: the wandb package is not installed',
                 marks=pytest.mark.skipif(importlib.util.find_spec('wandb') is not None, reason='wandb is installed')),
])
def test_bad_settings_are_one_line_errors_and_write_nothing(data, args, message):
    refused(run(data, 'train.py', *TINY, '--data_dir=data', '--out_dir=never', *args, check=False), message)
    assert not (data / 'never').exists()


def test_an_eval_budget_larger_than_the_val_split_is_capped_with_a_notice(data):
    r = run(data, 'train.py', *TINY, '--data_dir=data', '--out_dir=capped', '--max_iters=1', '--eval_tokens=100000000')
    assert 'eval_tokens=100,000,000 is more than the val split holds: evaluating on its first 3,968 tokens' in r.stdout


@pytest.mark.parametrize('fault,message', [
    ('magic', 'not a version-1 nanoCoLA token shard (wrong magic number)'),
    ('truncated', 'truncated: the header says'),
    ('header', 'cut inside its header (100 bytes)'),
    ('odd', 'truncated: the header says'),
    ('deleted', 'train_000000.bin: No such file or directory'),
    ('token', 'train_000000.bin: token id 60000 is outside the byte vocabulary of 257 tokens'),
])
def test_broken_shards_are_named_with_what_is_wrong(data, tmp_path, fault, message):
    broken = tmp_path / 'broken'
    broken.mkdir()
    for name in os.listdir(data / 'data'):
        (broken / name).write_bytes((data / 'data' / name).read_bytes())
    shard = broken / 'train_000000.bin'
    content = shard.read_bytes()
    if fault == 'magic':
        shard.write_bytes(b'XXXX' + content[4:])
    elif fault == 'truncated':
        shard.write_bytes(content[:-100])
    elif fault == 'header':
        shard.write_bytes(content[:100])
    elif fault == 'odd':
        shard.write_bytes(content + b'x')
    elif fault == 'deleted':
        shard.unlink()
    else:
        tokens = np.frombuffer(content[1024:], dtype=np.uint16).copy()
        tokens[500] = 60000
        write_shard(str(shard), tokens)
    before = digest(broken)
    refused(run(tmp_path, 'train.py', *TINY, f'--data_dir={broken}', '--out_dir=never', check=False), message)
    assert digest(broken) == before and not (tmp_path / 'never').exists()


def first_loss_logged(folder):
    return (folder / 'log.jsonl').exists() and '"loss"' in (folder / 'log.jsonl').read_text()


def ranks_of(launcher):
    """{rank: pid} of a torchrun launcher's worker processes."""
    children = [int(pid) for pid in os.listdir('/proc') if pid.isdigit() and os.path.exists(f'/proc/{pid}/stat')
                and open(f'/proc/{pid}/stat').read().rpartition(')')[2].split()[1] == str(launcher.pid)]
    return {int(dict(v.split(b'=', 1) for v in open(f'/proc/{pid}/environ', 'rb').read().split(b'\0') if b'=' in v)[b'RANK']): pid
            for pid in children}


def process_alive(pid):
    """Whether pid runs (a zombie, dead but not yet reaped by its parent, does not)."""
    return os.path.exists(f'/proc/{pid}') and open(f'/proc/{pid}/stat').read().rpartition(')')[2].split()[0] != 'Z'


def test_a_stalled_process_stops_a_distributed_run_after_dist_timeout_s(data):
    args = [*TINY, '--data_dir=data', '--out_dir=stalled', '--batch_size=2', '--max_iters=2000', '--eval_interval=100000',
            '--dist_timeout_s=10']  # 2,000 steps: about a minute on 2 idle cores, so that it ends by itself
    launcher = start(data, 'train.py', *args, torchrun=2, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: first_loss_logged(data / 'stalled'), launcher, 'the 2-process run to log its first loss')
    ranks = ranks_of(launcher)
    os.kill(ranks[1], signal.SIGSTOP)  # as a hung or stopped process would
    stopped = time.time()
    wait_for(lambda: not process_alive(ranks[0]), None, 'the waiting rank to stop')
    assert time.time() - stopped < 300  # the 10 s timeout, not the default 30 minutes
    os.kill(ranks[1], signal.SIGKILL)  # torchrun would wait 30 s for the stopped one to take its SIGTERM
    assert launcher.wait(timeout=600) != 0


def test_ranks_stop_when_their_launcher_is_killed_without_passing_a_signal_on(data):
    args = [*TINY, '--data_dir=data', '--out_dir=orphaned', '--batch_size=2', '--max_iters=2000', '--eval_interval=100000']
    launcher = start(data, 'train.py', *args, torchrun=2, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: first_loss_logged(data / 'orphaned'), launcher, 'the 2-process run to log its first loss')
    ranks = ranks_of(launcher)
    launcher.kill()  # SIGKILL, as the out-of-memory killer would: torchrun cannot tell its ranks
    launcher.wait()
    wait_for(lambda: not any(process_alive(pid) for pid in ranks.values()), None, 'both ranks to stop after their launcher died')
    checkpoint = torch.load(data / 'orphaned' / 'ckpt.pt', weights_only=True)
    assert 0 < checkpoint['iter_num'] < 2000  # they saved their step together (SIGTERM), then stopped


@pytest.mark.parametrize('script,setting', [('train.py', '--learning_rate=0.006'), ('prepare.py', "--encoding='gpt2'"),
                                            ('sample.py', '--top_k=200'), ('bench.py', '--seq_len=256'),
                                            ('compare.py', "--seeds=(1, 2, 3)"), ('analyze.py', '--directions=5'),
                                            ('evaluate.py', '--items=200'), ('export.py', "--export_dir=''")])
def test_help_prints_the_docstring_and_every_setting_with_its_default_and_meaning(tmp_path, script, setting):
    r = run(tmp_path, script, '--help')
    first_line = open(os.path.join(ROOT, script)).read().split('"""')[1].strip().splitlines()[0]
    assert r.stdout.startswith(first_line) and f'  {setting}  ' in r.stdout and r.stderr == ''
    for line in (line for line in r.stdout.splitlines() if line.startswith('  --')):  # '  --key=default  meaning'
        assert line.strip().partition('  ')[2].strip(), f"{script} --help: {line.strip()} has no meaning"
        meaning = line.strip().partition('  ')[2]
        assert meaning.count('(') == meaning.count(')') and not meaning.endswith((' the', ' a', ' of')), \
            f"{script} --help: {line.strip()} is cut short"


def test_the_first_line_names_the_method_and_the_last_says_where_the_checkpoint_is(data):
    r = run(data, 'train.py', *TINY, '--data_dir=data', '--out_dir=closing', '--max_iters=4', '--warmup_iters=10',
            '--checkpointing=cola-m', '--mlp=elas')
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith('training CoLA-M + ELAS (rank 16, 2:4 sparsity after 1000 dense steps): ')
    assert 'max_iters=4 and warmup_iters=10: the learning rate never reaches learning_rate=0.003' in r.stdout
    assert lines[-1] == ('done: 4 steps, checkpoint in closing/ckpt.pt (best validation loss '
                         f"{train_log(data / 'closing')[1][4]:.4f} in closing/best.pt); generate text with: "
                         'python sample.py --out_dir=closing')


def test_the_slurm_script_trains_with_two_processes_as_a_one_node_job(data, tmp_path):
    """train.slurm's own srun/torchrun line, under stand-ins for SLURM's srun and scontrol (srun runs its command,
    scontrol names this host), on the CPU with 2 processes over gloo: the run a one-node job would start."""
    import socket
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'srun').write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / 'scontrol').write_text('#!/bin/bash\necho localhost\n')
    for tool in ('srun', 'scontrol'):
        (bin_dir / tool).chmod(0o755)
    with socket.socket() as s:
        s.bind(('localhost', 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PATH=f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", SLURM_NNODES='1',
               SLURM_JOB_NODELIST='localhost', SLURM_JOB_ID='7', NPROC_PER_NODE='2', MASTER_PORT=str(port))
    env.pop('TRITON_INTERPRET', None)
    r = subprocess.run(['bash', 'train.slurm', *TINY, f"--data_dir={data / 'data'}", f"--out_dir={data / 'slurm'}",
                        '--max_iters=2', '--eval_tokens=256'], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)  # submitted from the repository, as sbatch is
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert '= 4 x 32 x 1 x 2' in r.stdout  # two processes' batches in a step
    assert train_log(data / 'slurm')[0].keys() == {1, 2}


@pytest.mark.parametrize('content,message', [
    (b'max_iters = 1/0\n', "line 1: ZeroDivisionError: division by zero"),
    (b'\xff\xfe\x00', 'is not UTF-8 text'),
    (b'learning_rate = (\n', 'line 1: SyntaxError'),
])
def test_a_config_file_that_fails_is_one_line_naming_it_and_its_line(tmp_path, content, message):
    from configurator import read_config_file
    (tmp_path / 'bad.py').write_bytes(content)
    with pytest.raises(SystemExit, match=f"config file '{tmp_path / 'bad.py'}'.*{message}".replace('(', r'\(')):
        read_config_file(str(tmp_path / 'bad.py'))


def test_the_paper_recipes_padding_is_no_target_in_the_loss_the_evaluation_or_tokens_per_s(paper_data):
    """On rows of one document each: the first step's loss and the validation loss at iter 0 are the mean token
    loss over the targets that are not padding, computed here by hand (log-softmax, gathered); the validation
    budget counts those targets; perplexity is exp of that mean."""
    import torch
    from model import ModelConfig, Transformer
    from shards import read_shard
    R, B, seed = 32, 4, 3
    train_rows = read_shard(paper_data / 'data' / 'train_000000.bin').astype(np.int64).reshape(-1, R)
    val_rows = read_shard(paper_data / 'data' / 'val_000000.bin').astype(np.int64).reshape(-1, R)
    settings = ['--data_dir=data', '--n_layer=2', '--n_head=2', '--n_embd=64', '--intermediate_size=128', '--rank=16',
                f'--block_size={R - 1}', f'--batch_size={B}', '--max_iters=1', '--eval_interval=1', '--eval_tokens=300',
                '--log_interval=1', '--device=cpu', '--dtype=float32', '--compile_model=False', f'--seed={seed}']
    vocab = -(-json.loads((paper_data / 'data' / 'meta.json').read_text())['vocab_size'] // 64) * 64  # train.py's padding
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(vocab_size=vocab, block_size=R - 1, n_layer=2, n_head=2, n_embd=64,
                                    intermediate_size=128, rank=16))

    def by_hand(rows):  # mean over the targets that are not padding (id 0)
        rows = torch.from_numpy(rows)
        with torch.no_grad():  # (given targets, the model returns every position's logits)
            logits, _ = model(rows[:, :-1], rows[:, 1:])
        logp = torch.log_softmax(logits.double(), -1).gather(-1, rows[:, 1:, None])[..., 0]
        return (logp[rows[:, 1:] != 0].mean() * -1).item()

    first = train_rows[np.random.default_rng([seed, 0]).permutation(len(train_rows))[:B]]
    k = int(np.searchsorted(np.cumsum((val_rows[:, 1:] != 0).sum(1)), 300)) + 1  # rows holding 300 real targets
    evaluated = val_rows[:-(-k // B) * B]
    run(paper_data, 'train.py', *settings, '--out_dir=paper-run', '--official_val_loss=True')
    losses, val = train_log(paper_data / 'paper-run')
    assert losses[1] == pytest.approx(by_hand(first), rel=1e-5) and val[0] == pytest.approx(by_hand(evaluated), rel=1e-5)
    record = next(json.loads(line) for line in open(paper_data / 'paper-run' / 'log.jsonl') if '"val_ppl"' in line)
    assert record['val_ppl'] == pytest.approx(np.exp(record['val_loss']))
    total, batches, seen = 0.0, 1, 0  # the official evaluate_model's loop, as written there
    for first_row in range(0, len(val_rows) - B + 1, B):
        if seen > 300:
            break
        batches += 1
        total += by_hand(val_rows[first_row:first_row + B])
        seen += (val_rows[first_row:first_row + B] != 0).sum()  # input_ids that are not padding
    assert record['val_loss_official'] == pytest.approx(total / batches, rel=1e-5)
    assert abs(record['val_loss_official'] - record['val_loss']) > 1e-3  # the two conventions differ
    step = next(json.loads(line) for line in open(paper_data / 'paper-run' / 'log.jsonl') if '"tokens_per_s"' in line)
    real = (first[:, 1:] != 0).sum()  # tokens/s counts these, not the step's B x 31 positions
    assert step['tokens_per_s'] == pytest.approx(real / (step['ms_per_iter'] / 1000), rel=1e-6)
    refused(run(paper_data, 'train.py', *settings[:-1], '--block_size=32', '--out_dir=paper-bad', check=False),
            "block_size=32: data/ holds the paper's rows of 32 tokens, 31 inputs and targets each; give --block_size=31")
    refused(run(paper_data, 'train.py', *settings, '--vocab_size=8', '--out_dir=paper-small', check=False),
            "vocab_size=8 is too small for data/, which holds token id")
    out = run(paper_data, 'sample.py', '--out_dir=paper-run', '--start=the cat', '--num_samples=1', '--max_new_tokens=5',
              '--device=cpu').stdout
    assert out.startswith('the cat')  # decoded with the run's own tokenizer


def test_measure_only_times_every_step_and_writes_no_checkpoint_and_no_evaluation(data):
    r = run(data, 'train.py', *TINY, '--data_dir=data', '--out_dir=measured', '--max_iters=3', '--measure_only=True',
            '--checkpointing=cola-m')
    records = [json.loads(line) for line in open(data / 'measured' / 'log.jsonl')]
    assert [r['iter'] for r in records if 'tokens_per_s' in r] == [1, 2, 3] and not any('val_loss' in r for r in records)
    assert not list((data / 'measured').glob('*.pt')) and 'nothing evaluated or saved' in r.stdout
