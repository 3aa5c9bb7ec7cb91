import json
from dataclasses import replace

import pytest
import torch
from conftest import TINY
from helpers import refused, run

from model import KVCache, Transformer


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
    prompt = torch.randint(0, 96, (3, 5))
    with torch.no_grad():
        expected = greedy_by_recomputing(model, prompt, 19)  # up to block_size: no window slides
    assert torch.equal(model.generate(prompt, 19, temperature=0), expected)


def test_generation_past_block_size_slides_the_window():
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    prompt = torch.randint(0, 96, (1, 40))  # already longer than block_size
    out = model.generate(prompt, 40, temperature=0)
    assert out.shape == (1, 80) and torch.equal(out[:, :40], prompt)
    with torch.no_grad():  # the first new token sees the last block_size / 2 prompt tokens
        logits, _ = model(prompt[:, -16:])
    assert out[0, 40] == logits[0, -1].argmax()


@pytest.mark.parametrize('rank', [0, 8])
def test_several_new_tokens_after_a_filled_cache_see_the_right_positions(rank):
    # chunked prefill: 5 tokens, then 4 at once, then 1: each chunk's logits equal the full forward's
    torch.manual_seed(0)
    model = Transformer(replace(TINY, rank=rank)).eval()
    idx = torch.randint(0, 96, (2, 10))
    full, _ = model(idx)
    caches = [KVCache(TINY.block_size) for _ in model.blocks]
    with torch.no_grad():
        chunks = [model(idx[:, a:b], kv_caches=caches)[0] for a, b in [(0, 5), (5, 9), (9, 10)]]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)


def test_sampling_is_reproducible_and_top_k_1_is_greedy():
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    prompt = torch.randint(0, 96, (2, 4))
    samples = []
    for _ in range(2):
        torch.manual_seed(123)
        samples.append(model.generate(prompt, 15, temperature=1.0, top_k=10))
    assert torch.equal(samples[0], samples[1])
    assert torch.equal(model.generate(prompt, 15, temperature=0.7, top_k=1), model.generate(prompt, 15, temperature=0))


def test_sample_py_end_to_end_on_a_tiny_training_run(tmp_path):
    (tmp_path / 'text.txt').write_text('to be or not to be, that is the question. ' * 300)
    run(tmp_path, 'prepare.py', '--input_files=text.txt', '--encoding=byte', '--out_dir=data', '--val_tokens=1000')
    run(tmp_path, 'train.py', '--data_dir=data', '--out_dir=out', '--n_layer=1', '--n_head=2', '--n_embd=32',
        '--intermediate_size=64', '--rank=8', '--block_size=32', '--batch_size=4', '--max_iters=30', '--eval_interval=30',
        '--eval_tokens=256', '--warmup_iters=3', '--lr_decay_iters=30', '--learning_rate=1e-2', '--checkpointing=cola-m',
        '--device=cpu', '--compile_model=False')
    (tmp_path / 'prompt.txt').write_text('to be or')
    r = run(tmp_path, 'sample.py', '--out_dir=out', '--start=FILE:prompt.txt', '--num_samples=2', '--max_new_tokens=20',
            '--device=cpu', '--dtype=float32')
    samples = r.stdout.split('---------------\n')
    assert r.stderr.startswith("sampling from out/ckpt.pt: the state after iter 30 of 30 (the run's best validation loss")
    assert len(samples) == 3 and all(s.startswith('to be or') for s in samples[:2])
    (tmp_path / 'empty.txt').write_text('')
    refused(run(tmp_path, 'sample.py', '--out_dir=out', '--start=FILE:empty.txt', '--device=cpu', check=False),
            'the prompt is empty')
    refused(run(tmp_path, 'sample.py', '--out_dir=missing', '--device=cpu', check=False), 'no checkpoint missing/ckpt.pt')
    meta = json.loads((tmp_path / 'data' / 'meta.json').read_text())
    (tmp_path / 'data' / 'meta.json').write_text(json.dumps({**meta, 'encoding': 'gpt2'}))  # now another vocabulary
    refused(run(tmp_path, 'sample.py', '--out_dir=out', '--device=cpu', check=False),
            "trained on encoding='byte' tokens but data/ now holds 'gpt2'")


@pytest.mark.parametrize('args,message', [
    (['--temperature=-1.0'], 'temperature=-1.0: expected 0 (greedy) or more'),
    (['--top_k=0'], 'top_k=0: expected at least 1'),
    (['--max_new_tokens=-5'], 'max_new_tokens=-5: expected at least 0'),
    (['--dtype=float8'], "dtype=float8: expected 'float32' or 'bfloat16'"),
    (['--start=\udc80abc'], "the prompt is not valid text: '\\udc80' at character 0"),
    (['--out_dir=truncated'], 'truncated/ckpt.pt is truncated or corrupt'),
    (['--out_dir=garbage'], 'garbage/ckpt.pt is truncated or corrupt'),
    (['--out_dir=other'], 'other/ckpt.pt is not a checkpoint of train.py'),
])
def test_bad_sampling_settings_and_broken_checkpoints_are_one_line_errors(tmp_path, args, message):
    for name, content in [('truncated', None), ('garbage', b'not a checkpoint at all'), ('other', None)]:
        (tmp_path / name).mkdir()
        path = tmp_path / name / 'ckpt.pt'
        if name == 'other':
            torch.save({'weights': torch.zeros(3)}, path)
        else:
            torch.save({'model': Transformer(TINY).state_dict()}, path)
            path.write_bytes(content or path.read_bytes()[:5000])
    refused(run(tmp_path, 'sample.py', '--device=cpu', '--out_dir=truncated', *args, check=False), message)
