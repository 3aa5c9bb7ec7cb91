"""evaluate.py: lm-evaluation-harness scores a train.py checkpoint through our `nanocola` model class (its equality with
lm-eval's own hf model: test_lm_eval.py); the built-in tasks are lm-eval tasks made from the run's own data."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_TRAIN
from helpers import published_task_files, refused, run

import evaluate
from model import load_checkpoint, model_from_checkpoint
from shards import ByteEncoding, load_meta, read_shard, shard_path

@pytest.fixture(scope='module')
def trained(data):
    """A run of 3 steps beside the published task files (data/tasks/)."""
    run(data, 'train.py', *TINY_TRAIN, '--rank=0', '--data_dir=data', '--out_dir=ev', '--max_iters=3')
    published_task_files(data)
    return data


def built_in_items(folder, monkeypatch):
    for name, value in [('items', 20), ('context_tokens', 16), ('choice_tokens', 8)]:
        monkeypatch.setattr(evaluate, name, value)
    meta, enc = load_meta(folder / 'data'), ByteEncoding()
    tokens = np.concatenate([read_shard(shard_path(folder / 'data', s)) for s in meta['splits']['val']['shards']])
    return evaluate.next_passage_items(tokens.astype(np.int64), enc, np.random.default_rng(0)), tokens


def test_evaluate_py_scores_the_built_in_tasks_through_lm_eval(trained, monkeypatch):
    r = run(trained, 'evaluate.py', '--out_dir=ev', '--items=20', '--context_tokens=16', '--choice_tokens=8')
    report = json.loads((trained / 'ev' / 'evaluate.json').read_text())
    assert report['scored_by'].startswith('lm-eval 0.4') and r.stderr.startswith('scoring ev/ckpt.pt: the state after iter 3')
    scores = report['scores']
    assert set(scores) == {'next_passage', 'last_word'} and scores['next_passage']['items'] == 20
    assert scores['next_passage']['chance'] == 0.25 and scores['last_word']['chance'] == 0
    assert 'acc_norm' in scores['next_passage'] and scores['last_word']['perplexity'] > 1
    assert '| next_passage | 20 |' in r.stdout
    # acc, recomputed here from the same items and the model's log-probabilities, byte by byte
    items, _ = built_in_items(trained, monkeypatch)
    model = model_from_checkpoint(load_checkpoint(trained / 'ev' / 'ckpt.pt')).eval()
    correct = 0
    for item in items:
        sums = []
        for choice in item['choices']:
            tokens = list((item['context'] + choice).encode())[-(model.config.block_size + 1):]
            with torch.no_grad():
                logp = F.log_softmax(model(torch.tensor([tokens[:-1]]))[0][0], dim=-1)
            n = len(choice.encode())
            sums.append(sum(logp[len(tokens) - 1 - n + i, t].item() for i, t in enumerate(tokens[-n:])))
        correct += int(np.argmax(sums) == item['gold'])
    assert scores['next_passage']['acc'] == correct / len(items)


def test_built_in_items_are_deterministic_text_of_the_split_with_the_true_continuation(trained, monkeypatch):
    items, tokens = built_in_items(trained, monkeypatch)
    assert items == built_in_items(trained, monkeypatch)[0] and len(items) == 20
    text = bytes(tokens.tolist()).decode('utf-8', errors='replace')
    for item in items:
        assert item['context'] + item['choices'][item['gold']] in text  # the true next span follows its context
        assert len(item['context'].encode()) == 16 and all(len(c.encode()) == 8 for c in item['choices'])
    assert 0 < np.mean([item['gold'] == 0 for item in items]) < 0.6  # the answer's position is random


def test_lm_evals_own_command_line_finds_nanocola_through_evaluate_py(trained):
    r = run(trained, 'evaluate.py', 'lm_eval', 'run', '--model', 'nanocola', '--model_args', 'out_dir=ev',
            '--tasks', 'piqa_local', '--include_path', evaluate.TASKS_DIR, '--limit', '2')
    assert "nanocola ({'out_dir': 'ev'})" in r.stdout and '|-piqa|' in r.stdout.replace(' ', '')


@pytest.mark.parametrize('args,message', [
    (['--tasks=hellaswag_locale'], "tasks='hellaswag_locale': not an lm-eval task nor one of"),
    (['--tasks=hellaswag'], "tasks='hellaswag': could not read a task's data"),  # the hub, offline
    (['--tasks=piqa_local', '--out_dir=../elsewhere'], 'does not exist'),
    (['--tasks= , '], "tasks=' , ': expected lm-eval task names, comma-separated"),
    (['--items=0'], 'items=0: expected a positive number'),
    (['--batch_size=0'], 'batch_size=0: expected a positive number'),
    (['--seed=-1'], 'seed=-1, limit=0: expected 0 or more'),
    (['--context_tokens=30'], "context_tokens + choice_tokens = 46: expected at most the model's block_size=32"),
    (['--device=cuda:7' if torch.cuda.device_count() < 8 else '--device=cuda:99'], "expected 'cpu', or 'cuda' on a machine"),
])
def test_bad_tasks_and_settings_are_one_line_errors(trained, args, message):
    offline = {'HF_DATASETS_OFFLINE': '1', 'HF_HUB_OFFLINE': '1'}
    refused(run(trained, 'evaluate.py', '--out_dir=ev', '--items=5', *args, env=offline, check=False), message)


def test_a_local_task_without_its_files_says_where_they_go(trained, tmp_path):
    (tmp_path / 'ev').symlink_to(trained / 'ev')
    refused(run(tmp_path, 'evaluate.py', '--out_dir=ev', '--tasks=piqa_local', check=False),
            f"tasks='piqa_local': no file data/tasks/piqa/piqa_validation.parquet in {tmp_path}: the published data that")


def test_the_built_in_tasks_through_lm_evals_command_line_name_the_way_that_makes_their_items(trained):
    refused(run(trained, 'evaluate.py', 'lm_eval', 'run', '--model', 'nanocola', '--model_args', 'out_dir=ev',
                '--include_path', 'tasks', '--tasks', 'piqa_local', 'next_passage', check=False),
            "--tasks next_passage: the built-in tasks are made from a run's own validation split: "
            "python evaluate.py --out_dir=RUN --tasks=next_passage")


def test_evaluate_py_scores_a_paper_recipe_run_with_its_own_tokenizer(paper_data):
    run(paper_data, 'train.py', '--data_dir=data', '--out_dir=ev-paper', '--n_layer=1', '--n_head=2', '--n_embd=32',
        '--intermediate_size=64', '--rank=8', '--block_size=31', '--batch_size=4', '--max_iters=2', '--eval_tokens=200',
        '--device=cpu', '--compile_model=False')
    r = run(paper_data, 'evaluate.py', '--out_dir=ev-paper', '--items=10', '--context_tokens=16', '--choice_tokens=8',
            '--as_json')
    scores = json.loads(r.stdout)['scores']
    assert scores['next_passage']['items'] == 10 and 0 <= scores['last_word']['acc'] <= 1
