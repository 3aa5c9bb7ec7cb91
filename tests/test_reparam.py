"""Low-Rank, SLTrain and ReLoRA: each layer against a reference built in the test, and their training-loop work."""

import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import TINY, TINY_TRAIN, assert_cola_m_exact
from helpers import refused, run, train_log

from bench import measure_flops
from methods import relora
from methods.lowrank import LowRankLinear
from methods.sltrain import SLTrainLinear
from model import CoLALinear, ModelConfig, Transformer

FLOPS_SHAPE = dict(vocab_size=512, n_layer=2, n_head=4, n_embd=256, intermediate_size=688, rank=64)


def build(config, seed=0):
    torch.manual_seed(seed)
    return Transformer(config)


@pytest.mark.parametrize('overrides', [dict(projection='low-rank'), dict(projection='low-rank', checkpointing='cola-m'),
                                       dict(projection='sltrain'), dict(projection='sltrain', checkpointing='full'),
                                       dict(projection='relora'), dict(projection='relora', checkpointing='full')])
def test_flops_per_token_equals_flop_counter(overrides):
    config = ModelConfig(**{**FLOPS_SHAPE, **overrides})
    measured, _ = measure_flops(config, seq_len=128)  # one sequence per forward call
    with torch.device('meta'):
        analytic = Transformer(config).flops_per_token(128, batch_size=1)
    assert analytic == pytest.approx(measured, rel=1e-9)


# ----------------------------------------------------------------------------- Low-Rank

def test_low_rank_is_cola_with_the_identity_in_place_of_silu():
    torch.manual_seed(0)
    cola = CoLALinear(24, 40, 8, fused=False).double()
    torch.manual_seed(0)
    plain = LowRankLinear(24, 40, 8).double()
    assert torch.equal(plain.A, cola.A) and torch.equal(plain.B, cola.B)  # CoLA's init, draw for draw
    x = torch.randn(3, 5, 24, dtype=torch.float64)
    torch.testing.assert_close(plain(x), (x @ cola.A) @ cola.B, rtol=1e-12, atol=1e-12)


def test_cola_m_is_exact_on_low_rank_layers():
    assert_cola_m_exact(replace(TINY, projection='low-rank'))


# ----------------------------------------------------------------------------- SLTrain

def test_sltrain_output_is_x_times_the_dense_w_built_from_its_state_dict():
    torch.manual_seed(0)
    layer = SLTrainLinear(30, 20, 4, delta=0.1, alpha=8.0).double()
    torch.nn.init.normal_(layer.B)  # B starts at zero: give the low-rank part something to do
    state = layer.state_dict()
    W = 8.0 / 4 * state['B'] @ state['A']
    for flat, value in zip(state['support'].tolist(), state['values'].tolist()):
        W[flat // 30, flat % 30] += value
    x = torch.randn(2, 7, 30, dtype=torch.float64)
    torch.testing.assert_close(layer(x), x @ W.T, rtol=1e-12, atol=1e-12)
    assert len(state['support']) == int(0.1 * 20 * 30) and len(set(state['support'].tolist())) == 60  # no repeats


def test_sltrain_parameters_are_r_times_d_in_plus_d_out_plus_nnz():
    config = replace(TINY, projection='sltrain')
    d, f, r = TINY.n_embd, TINY.intermediate_size, TINY.rank
    shapes = [(d, d)] * 4 + [(d, f)] * 2 + [(f, d)]
    per_block = sum(r * (a + b) + int(0.03 * a * b) for a, b in shapes) + 2 * d
    assert build(config).num_params() == TINY.n_layer * per_block + d


def test_sltrain_support_is_fixed_through_training_and_a_checkpoint(data):
    run(data, 'train.py', *TINY_TRAIN, '--data_dir=data', '--projection=sltrain', '--out_dir=sl', '--max_iters=6',
        '--eval_interval=3')
    saved = torch.load(data / 'sl' / 'ckpt.pt', weights_only=True)['model']
    torch.manual_seed(1337)  # train.py's seed: the same draws give the initial support
    initial = Transformer(ModelConfig(**{**TINY.__dict__, 'vocab_size': 320, 'projection': 'sltrain'})).state_dict()
    supports = [k for k in saved if k.endswith('.support')]
    assert len(supports) == 2 * 7 and all(torch.equal(saved[k], initial[k]) for k in supports)
    assert not torch.equal(saved['blocks.0.attn.q_proj.values'], initial['blocks.0.attn.q_proj.values'])  # values train
    run(data, 'train.py', *TINY_TRAIN, '--data_dir=data', '--projection=sltrain', '--out_dir=sl', '--max_iters=8',
        '--eval_interval=3', '--init_from=resume')
    after = torch.load(data / 'sl' / 'ckpt.pt', weights_only=True)['model']
    assert all(torch.equal(after[k], saved[k]) for k in supports)


# ----------------------------------------------------------------------------- ReLoRA

def test_relora_merge_keeps_the_logits_zeroes_b_and_redraws_a():
    model = build(replace(TINY, projection='relora')).eval()
    for layer in relora.layers(model):
        torch.nn.init.normal_(layer.B, std=0.02)  # as if trained
    idx = torch.randint(0, 96, (2, 32))
    before, _ = model(idx)
    old_A = [layer.A.detach().clone() for layer in relora.layers(model)]
    optimizer = model.configure_optimizers(0.0, 1e-3, (0.9, 0.999), 'cpu')
    assert relora.after_step(model, optimizer, 10, 10, 0.99)
    after, _ = model(idx)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)
    for layer, A in zip(relora.layers(model), old_A):
        assert torch.count_nonzero(layer.B) == 0 and not torch.equal(layer.A, A)
        assert abs(layer.A.std().item() - 1 / math.sqrt(3 * layer.A.size(1))) < 0.2 / math.sqrt(layer.A.size(1))  # kaiming


def test_relora_w_gets_no_gradient_and_is_not_in_the_optimizer():
    model = build(replace(TINY, projection='relora'))
    idx = torch.randint(0, 96, (2, 32))
    model(idx, idx)[1].backward()
    layer = relora.layers(model)[0]
    assert layer.weight.grad is None and layer.A.grad is not None
    optimized = {id(p) for group in model.configure_optimizers(0.0, 1e-3, (0.9, 0.999), 'cpu').param_groups
                 for p in group['params']}
    assert id(layer.weight) not in optimized and id(layer.A) in optimized and id(layer.B) in optimized


@pytest.mark.parametrize('kind', ['random', 'magnitude'])
def test_relora_prunes_that_fraction_of_the_factors_moments_and_keeps_their_step(kind):
    model = build(replace(TINY, projection='relora'))
    for layer in relora.layers(model):
        torch.nn.init.normal_(layer.B, std=0.02)  # as if trained, so that A has a gradient too
    optimizer = model.configure_optimizers(0.0, 1e-3, (0.9, 0.999), 'cpu')
    idx = torch.randint(0, 96, (2, 32))
    model(idx, idx)[1].backward()
    optimizer.step()
    layer = relora.layers(model)[0]
    big = optimizer.state[layer.B]['exp_avg'].abs().flatten().topk(5).values.min()
    relora.after_step(model, optimizer, 5, 5, 0.9, kind)
    for p in (layer.A, layer.B):
        state = optimizer.state[p]
        for key in ('exp_avg', 'exp_avg_sq'):
            zero = (state[key] == 0).float().mean().item()
            assert abs(zero - 0.9) < (0.03 if kind == 'random' else 1 / state[key].numel())
        assert state['step'].item() == 1
    if kind == 'magnitude':  # the largest entries survive
        assert (optimizer.state[layer.B]['exp_avg'].abs() >= big).sum() == 5


def test_the_jagged_schedule_drops_to_zero_at_each_merge_and_rewarms_to_the_envelope():
    envelope = lambda it: 1.0 - it / 100  # noqa: E731
    lr = [relora.jagged_lr(envelope, it, 20, 4) for it in range(60)]
    assert lr[:20] == [envelope(it) for it in range(20)]  # before the first merge: the envelope
    assert lr[20:25] == [0.0, envelope(24) / 4, envelope(24) / 2, envelope(24) * 3 / 4, envelope(24)]
    assert lr[40] == 0.0 and lr[43] == envelope(44) * 3 / 4 and lr[45] == envelope(45)


RELORA = [*TINY_TRAIN, '--data_dir=data', '--projection=relora', '--relora_interval=3', '--relora_restart_warmup=2',
          '--eval_interval=4']


def test_relora_resume_across_a_merge_is_exact(data):
    run(data, 'train.py', *RELORA, '--out_dir=relora-straight', '--max_iters=8')
    run(data, 'train.py', *RELORA, '--out_dir=relora-resumed', '--max_iters=4')  # merges at 3, then 6 after the resume
    run(data, 'train.py', *RELORA, '--out_dir=relora-resumed', '--max_iters=8', '--init_from=resume')
    assert train_log(data / 'relora-resumed') == train_log(data / 'relora-straight')
    records = [json.loads(line) for line in open(data / 'relora-straight' / 'log.jsonl')]
    assert [r['iter'] for r in records if r.get('relora_merge')] == [3, 6]
    lrs = {r['iter']: r['lr'] for r in records if 'lr' in r}
    assert lrs[4] == 0.0 and lrs[7] == 0.0  # the step right after a merge (the one that ends at 4, 7) runs at lr 0


def test_relora_two_processes_equal_one(data):
    common = [*RELORA, '--max_iters=6', '--eval_interval=6', '--gradient_accumulation_steps=2']
    run(data, 'train.py', *common, '--out_dir=relora-one', '--batch_size=4')
    run(data, 'train.py', *common, '--out_dir=relora-two', '--batch_size=2', torchrun=2)
    (one, one_val), (two, two_val) = train_log(data / 'relora-one'), train_log(data / 'relora-two')
    assert one.keys() == two.keys() and all(two[i] == pytest.approx(one[i], abs=1e-5) for i in one)
    assert two_val[6] == pytest.approx(one_val[6], abs=1e-5)


def test_relora_warm_starts_from_a_full_rank_run_and_refuses_another(data):
    run(data, 'train.py', *TINY_TRAIN, '--data_dir=data', '--rank=0', '--out_dir=warm-full', '--max_iters=3')
    run(data, 'train.py', *RELORA, '--out_dir=warm-relora', '--max_iters=1', '--relora_warm_start=warm-full')
    full = torch.load(data / 'warm-full' / 'ckpt.pt', weights_only=True)['model']
    ours = torch.load(data / 'warm-relora' / 'ckpt.pt', weights_only=True)['model']
    assert torch.equal(ours['blocks.0.attn.q_proj.weight'], full['blocks.0.attn.q_proj.weight'])  # W frozen: as loaded
    refused(run(data, 'train.py', *RELORA, '--out_dir=never', '--max_iters=1', '--relora_warm_start=relora-straight',
                check=False), "relora_warm_start needs a full-rank run's checkpoint (rank=0)")



def test_sltrain_decays_its_factors_but_not_its_sparse_values():  # as docs/methods.md states
    from model import Transformer
    model = Transformer(replace(TINY, projection='sltrain'))
    decayed, plain = model.configure_optimizers(0.01, 1e-3, (0.9, 0.999), 'cpu').param_groups
    ids = lambda group: {id(p) for p in group['params']}  # noqa: E731
    layer = model.blocks[0].attn.q_proj
    assert decayed['weight_decay'] == 0.01 and {id(layer.A), id(layer.B)} <= ids(decayed)
    assert plain['weight_decay'] == 0.0 and id(layer.values) in ids(plain)
