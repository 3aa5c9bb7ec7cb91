import os
from dataclasses import replace

import pytest
import torch
from helpers import ROOT, run

from model import ModelConfig, Transformer

TINY = ModelConfig(vocab_size=64, block_size=24, n_layer=2, n_head=2, n_embd=32, intermediate_size=48)


def greedy_by_recomputing(model, idx, n):
    """The reference: each new token from a full forward pass over the (last block_size) tokens."""
    for _ in range(n):
        logits, _ = model(idx[:, -model.config.block_size:])
        idx = torch.cat([idx, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return idx


@pytest.mark.parametrize('rank', [0, 8])
def test_kv_cached_greedy_generation_equals_recomputing_the_context(rank):
    torch.manual_seed(0)
    model = Transformer(replace(TINY, rank=rank)).eval()
    prompt = torch.randint(0, 64, (3, 5))
    with torch.no_grad():
        expected = greedy_by_recomputing(model, prompt, 19)  # up to block_size: no window slides
    assert torch.equal(model.generate(prompt, 19, temperature=0), expected)


def test_generation_past_block_size_slides_the_window():
    torch.manual_seed(0)
    model = Transformer(replace(TINY, rank=8)).eval()
    prompt = torch.randint(0, 64, (1, 30))  # already longer than block_size
    out = model.generate(prompt, 40, temperature=0)
    assert out.shape == (1, 70) and torch.equal(out[:, :30], prompt)
    with torch.no_grad():  # the first new token sees the last block_size / 2 prompt tokens
        logits, _ = model(prompt[:, -12:])
    assert out[0, 30] == logits[0, -1].argmax()


def test_sampling_is_reproducible_and_top_k_1_is_greedy():
    torch.manual_seed(0)
    model = Transformer(replace(TINY, rank=8)).eval()
    prompt = torch.randint(0, 64, (2, 4))
    samples = []
    for _ in range(2):
        torch.manual_seed(123)
        samples.append(model.generate(prompt, 15, temperature=1.0, top_k=10))
    assert torch.equal(samples[0], samples[1])
    assert torch.equal(model.generate(prompt, 15, temperature=0.7, top_k=1), model.generate(prompt, 15, temperature=0))


def test_sample_py_end_to_end_on_a_tiny_training_run(tmp_path):
    (tmp_path / 'text.txt').write_text('to be or not to be, that is the question. ' * 300)
    run(tmp_path, 'prepare.py', '--input=text.txt', '--encoding=byte', '--out_dir=data', '--val_tokens=1000')
    run(tmp_path, 'train.py', '--data_dir=data', '--out_dir=out', '--n_layer=1', '--n_head=2', '--n_embd=32',
        '--intermediate_size=64', '--rank=8', '--block_size=32', '--batch_size=4', '--max_iters=30', '--eval_interval=30',
        '--eval_tokens=256', '--warmup_iters=3', '--lr_decay_iters=30', '--learning_rate=1e-2', '--checkpointing=cola_m',
        '--device=cpu', '--compile=False')
    (tmp_path / 'prompt.txt').write_text('to be or')
    r = run(tmp_path, 'sample.py', '--out_dir=out', '--start=FILE:prompt.txt', '--num_samples=2', '--max_new_tokens=20',
            '--device=cpu', '--dtype=float32')
    samples = r.stdout.split('---------------\n')
    assert len(samples) == 3 and all(s.startswith('to be or') for s in samples[:2])
    (tmp_path / 'empty.txt').write_text('')
    r = run(tmp_path, 'sample.py', '--out_dir=out', '--start=FILE:empty.txt', '--device=cpu', check=False)
    assert r.returncode != 0 and 'the prompt is empty' in r.stderr
    r = run(tmp_path, 'sample.py', '--out_dir=missing', '--device=cpu', check=False)
    assert r.returncode != 0 and 'no checkpoint missing/ckpt.pt' in r.stderr
    run(tmp_path, 'prepare.py', '--input=text.txt', '--encoding=gpt2', '--out_dir=data2', '--val_tokens=100')
    os.rename(tmp_path / 'data', tmp_path / 'data_byte')
    os.rename(tmp_path / 'data2', tmp_path / 'data')  # the checkpoint's data folder now holds another vocabulary
    r = run(tmp_path, 'sample.py', '--out_dir=out', '--device=cpu', check=False)
    assert r.returncode != 0 and "trained on encoding='byte' tokens but data/ now holds 'gpt2'" in r.stderr


def test_sample_bench_compares_cola_with_full_rank():
    r = run(ROOT, 'sample.py', '--bench=True', '--n_layer=1', '--n_embd=64', '--n_head=2', '--intermediate_size=128',
            '--rank=16', '--block_size=64', '--max_new_tokens=8', '--device=cpu', '--dtype=float32')
    assert '| full-rank |' in r.stdout and '| CoLA |' in r.stdout and 'less memory for weights + KV cache' in r.stdout
