import json
import os
import random

import pytest
from helpers import run

TINY = ['--n_layer=2', '--n_head=2', '--n_embd=64', '--intermediate_size=128', '--rank=16', '--block_size=32',
        '--batch_size=4', '--learning_rate=3e-3', '--min_lr=3e-4', '--warmup_iters=5', '--lr_decay_iters=40',
        '--eval_tokens=1024', '--log_interval=1', '--device=cpu', '--dtype=float32', '--compile=False']


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """Byte shards of a small made-up corpus: sentences from a tiny grammar, easy to start learning."""
    folder = tmp_path_factory.mktemp('train')
    rng = random.Random(0)
    subjects, verbs, objects = ['the cat', 'a dog', 'my friend', 'the king'], ['sees', 'likes', 'finds'], ['the sea', 'a bird', 'bread']
    with open(folder / 'corpus.txt', 'w') as f:
        f.write(' '.join(f'{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}.' for _ in range(8000)))
    run(folder, 'prepare.py', '--input=corpus.txt', '--encoding=byte', '--out_dir=data', '--val_tokens=4096')
    return folder


def train_log(folder):
    records = [json.loads(line) for line in open(os.path.join(folder, 'log.jsonl'))]
    losses = {r['iter']: r['loss'] for r in records if 'loss' in r}
    return losses, {r['iter']: r['val_loss'] for r in records if 'val_loss' in r}


def test_tiny_run_loss_falls(data):
    run(data, 'train.py', *TINY, '--data_dir=data', '--out_dir=falls', '--max_iters=40', '--eval_interval=20')
    losses, val = train_log(data / 'falls')
    assert losses[40] < losses[1] - 1.0 and val[40] < val[0] - 1.0
    assert os.path.exists(data / 'falls' / 'ckpt.pt') and os.path.exists(data / 'falls' / 'best.pt')


def test_resume_gives_exactly_the_losses_of_an_uninterrupted_run(data):
    common = [*TINY, '--data_dir=data', '--eval_interval=10', '--gradient_accumulation_steps=2']
    run(data, 'train.py', *common, '--out_dir=straight', '--max_iters=20')
    run(data, 'train.py', *common, '--out_dir=stopped', '--max_iters=10')
    run(data, 'train.py', *common, '--out_dir=stopped', '--max_iters=20', '--init_from=resume')
    straight, straight_val = train_log(data / 'straight')
    resumed, resumed_val = train_log(data / 'stopped')
    assert sorted(resumed) == list(range(1, 21))
    assert resumed == straight and resumed_val == straight_val  # exact, not approximately


@pytest.mark.parametrize('parallel', ['ddp', 'fsdp'])
def test_two_processes_match_one_with_the_same_global_batch(data, parallel):
    common = [*TINY, '--data_dir=data', '--eval_interval=6', '--max_iters=6', '--gradient_accumulation_steps=2']
    run(data, 'train.py', *common, '--out_dir=one', '--batch_size=4')
    run(data, 'train.py', *common, f'--out_dir={parallel}', '--batch_size=2', f'--parallel={parallel}', torchrun=2)
    one, one_val = train_log(data / 'one')
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
    run(data, 'train.py', *common, '--out_dir=colam', '--checkpointing=cola_m')
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


def test_a_missing_data_folder_says_which_prepare_command_to_run(tmp_path):
    r = run(tmp_path, 'train.py', *TINY, '--data_dir=data/nothing', check=False)
    assert r.returncode != 0 and 'python prepare.py --out_dir=data/nothing' in r.stderr.strip().splitlines()[-1]


def test_a_vocabulary_mismatch_is_refused(data):
    r = run(data, 'train.py', *TINY, '--data_dir=data', '--vocab_size=128', check=False)
    assert r.returncode != 0 and 'vocab_size=128 is smaller than the vocabulary of data/' in r.stderr
    run(data, 'prepare.py', '--input=corpus.txt', '--encoding=gpt2', '--out_dir=data_gpt2', '--val_tokens=1000')
    r = run(data, 'train.py', *TINY, '--data_dir=data_gpt2', '--out_dir=falls', '--init_from=resume', check=False)
    assert r.returncode != 0 and "trained on encoding='byte' data, but data_gpt2/ holds 'gpt2' tokens" in r.stderr


def test_config_typos_are_caught(tmp_path):
    r = run(tmp_path, 'train.py', '--learning_rat=1e-3', check=False)
    assert r.returncode != 0 and '--learning_rat: unknown setting' in r.stderr
    r = run(tmp_path, 'train.py', '--batch_size=big', check=False)
    assert r.returncode != 0 and "batch_size='big' is a str, expected a int" in r.stderr
    r = run(tmp_path, 'train.py', 'config/nope.py', check=False)
    assert r.returncode != 0 and "config file 'config/nope.py' not found" in r.stderr
