import json
from dataclasses import replace

import pytest
import torch
from conftest import TINY, TINY_TRAIN
from helpers import refused, run, train_log

from methods import tsvd
from bench import count_flops, measure_flops
from model import ModelConfig, Transformer
from methods.tsvd import TSVDLinear

TSVD = replace(TINY, projection='tsvd')


def orthonormality_error(layer):
    U, V = layer.U.detach(), layer.V.detach()
    eye = torch.eye(layer.rank)
    return max((U.T @ U - eye).abs().max().item(), (V @ V.T - eye).abs().max().item())


def weight(layer):
    return (layer.U @ layer.S @ layer.V).detach().double()


def test_layer_equals_x_times_usv_in_float64():
    torch.manual_seed(0)
    layer = TSVDLinear(48, 80, 12).double()
    x = torch.randn(3, 5, 48, dtype=torch.float64)
    torch.testing.assert_close(layer(x), torch.einsum('btd,do->bto', x, weight(layer)))
    assert orthonormality_error(layer) < 1e-6  # made orthonormal in fp32


def test_init_has_the_variance_of_the_full_rank_init():
    torch.manual_seed(0)
    assert weight(TSVDLinear(512, 1376, 128)).std().item() == pytest.approx(0.02, rel=0.02)


def test_u_and_v_stay_orthonormal_through_training_and_retraction_keeps_w():
    torch.manual_seed(0)
    model = Transformer(TSVD)
    optimizer = model.configure_optimizers(0.01, 1e-2, (0.9, 0.95), 'cpu')
    layer = model.blocks[0].mlp.up_proj
    for _ in range(20):
        idx = torch.randint(0, 96, (4, 32))
        _, loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        assert orthonormality_error(layer) > 1e-4  # the step leaves the manifold ...
        before = weight(layer)
        tsvd.retract(model)
        assert max(orthonormality_error(m) for m in tsvd.layers(model)) < 1e-5  # ... the retraction brings it back
        torch.testing.assert_close(weight(layer), before, rtol=0, atol=1e-6)


def test_optimizer_does_not_decay_the_orthonormal_factors():
    model = Transformer(TSVD)
    decay, no_decay = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu').param_groups
    layer = model.blocks[0].attn.q_proj
    assert any(p is layer.S for p in decay['params']) and not any(p is layer.U or p is layer.V for p in decay['params'])
    assert any(p is layer.U for p in no_decay['params'])


def test_a_rank_cut_keeps_the_smallest_rank_holding_the_energy_and_loses_exactly_the_dropped_energy():
    torch.manual_seed(0)
    model = Transformer(TSVD)
    s = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.5] + [0.1] * 11)  # energy 64, 80, 84, 85, 85.25, ...
    for layer in tsvd.layers(model):
        P, _ = torch.linalg.qr(torch.randn(16, 16))
        Q, _ = torch.linalg.qr(torch.randn(16, 16))
        layer.S.data = P @ torch.diag(s) @ Q.T
    layer = model.blocks[1].attn.v_proj
    before = weight(layer)
    total = (s.double() ** 2).sum()
    optimizer = model.configure_optimizers(0.0, 1e-3, (0.9, 0.95), 'cpu')
    ranks = tsvd.adapt_ranks(model, optimizer, energy=83.9 / total.item(), min_rank=2)
    assert ranks == [3] * len(ranks)  # 64 + 16 + 4 = 84: three singular values
    assert orthonormality_error(layer) < 1e-5 and layer.U.shape == (64, 3) and layer.V.shape == (3, 64)
    torch.testing.assert_close(torch.linalg.matrix_norm(weight(layer) - before) ** 2, total - 84, rtol=1e-4, atol=0)
    assert tsvd.adapt_ranks(model, optimizer, energy=0.5, min_rank=2) == [2] * len(ranks)  # never below min_rank


def test_training_goes_on_after_a_cut_with_matching_optimizer_state_and_counts():
    torch.manual_seed(0)
    model = Transformer(TSVD)
    optimizer = model.configure_optimizers(0.01, 1e-2, (0.9, 0.95), 'cpu')
    for step in range(12):
        idx = torch.randint(0, 96, (4, 32))
        _, loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tsvd.retract(model)
        if step in (3, 7):
            ranks = tsvd.adapt_ranks(model, optimizer, energy=0.9, min_rank=4)
            assert min(ranks) < 16
    assert torch.isfinite(loss)
    for p in model.parameters():
        assert optimizer.state[p]['exp_avg'].shape == p.shape and optimizer.state[p]['exp_avg_sq'].shape == p.shape
        assert (optimizer.state[p]['exp_avg_sq'] >= 0).all()
    forward, backward = count_flops(model, torch.zeros(1, 32, dtype=torch.long))  # at the current ranks
    assert abs(model.flops_per_token(32) / ((forward + backward) / 32) - 1) < 0.05
    assert model.num_params() == sum(p.numel() for n, p in model.named_parameters() if 'emb' not in n and 'lm_head' not in n)
    assert model.num_params() < Transformer(TSVD).num_params()


def test_first_moments_rotate_exactly():
    torch.manual_seed(0)
    layer = TSVDLinear(20, 30, 6)
    layer.S.data = torch.randn(6, 6)
    optimizer = torch.optim.AdamW(layer.parameters())
    x = torch.randn(5, 20)
    layer(x).sum().backward()
    for p in layer.parameters():  # moments as after steps whose gradients were all this one
        optimizer.state[p] = {'step': torch.tensor(1.0), 'exp_avg': p.grad.clone(), 'exp_avg_sq': p.grad.square()}
    tsvd.adapt_ranks(layer, optimizer, energy=1.0, min_rank=6)  # rotate, keep every direction: the same W
    layer.zero_grad()
    layer(x).sum().backward()  # the gradient at the rotated parameters
    for name, p in layer.named_parameters():
        torch.testing.assert_close(optimizer.state[p]['exp_avg'], p.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize('config,message', [
    (dict(projection='tsvd', rank=0), "projection='tsvd': expected 'cola', or 'tsvd', 'low-rank', 'sltrain' or 'relora' with rank > 0"),
    (dict(projection='tsvd', checkpointing='cola-m'), 'without DLR or CoLA-M'),
    (dict(projection='svd'), "projection='svd'"),
])
def test_bad_tsvd_settings_are_one_line_errors(config, message):
    with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
        replace(TINY, **config)


TSVD_TRAIN = [*TINY_TRAIN, '--projection=tsvd', '--tsvd_interval=3', '--tsvd_energy=0.9', '--tsvd_min_rank=4']


def test_resume_across_a_rank_change_equals_an_uninterrupted_run(data):
    common = [*TSVD_TRAIN, '--data_dir=data', '--eval_interval=4']
    run(data, 'train.py', *common, '--out_dir=tsvd_straight', '--max_iters=8')
    run(data, 'train.py', *common, '--out_dir=tsvd_resumed', '--max_iters=4')  # ranks changed at iter 3
    run(data, 'train.py', *common, '--out_dir=tsvd_resumed', '--max_iters=8', '--init_from=resume')
    assert train_log(data / 'tsvd_resumed') == train_log(data / 'tsvd_straight')
    records = [json.loads(line) for line in open(data / 'tsvd_straight' / 'log.jsonl')]
    adapted = [r for r in records if 'tsvd_ranks' in r]
    assert [r['iter'] for r in adapted] == [3, 6] and len(adapted[0]['tsvd_ranks']) == 14
    assert adapted[1]['model_params'] < adapted[0]['model_params'] < records[0]['model_params']
    assert adapted[-1]['flops'] < 6 * records[0]['flops_per_token'] * 4 * 32  # FLOPs spent follow the ranks


def test_two_processes_across_a_rank_change_equal_one(data):
    common = [*TSVD_TRAIN, '--data_dir=data', '--eval_interval=6', '--max_iters=6', '--gradient_accumulation_steps=2']
    run(data, 'train.py', *common, '--out_dir=tsvd_one', '--batch_size=4')
    run(data, 'train.py', *common, '--out_dir=tsvd_two', '--batch_size=2', torchrun=2)
    one, one_val = train_log(data / 'tsvd_one')
    two, two_val = train_log(data / 'tsvd_two')
    for it in one:
        assert two[it] == pytest.approx(one[it], abs=1e-5), it
    assert two_val[6] == pytest.approx(one_val[6], abs=1e-5)


def test_tsvd_refuses_fsdp_and_samples_from_a_checkpoint(data):
    refused(run(data, 'train.py', *TSVD_TRAIN, '--data_dir=data', '--parallel=fsdp', check=False),
            "projection='tsvd' with parallel='fsdp'")
    run(data, 'train.py', *TSVD_TRAIN, '--data_dir=data', '--out_dir=tsvd_sample', '--max_iters=6', '--eval_interval=6')
    r = run(data, 'sample.py', '--out_dir=tsvd_sample', '--start=the cat', '--num_samples=1', '--max_new_tokens=10',
            '--device=cpu', '--dtype=float32')
    assert r.stdout.startswith('the cat')


def test_flops_per_token_follows_the_config_shapes_for_every_layer_kind():
    for overrides in [dict(projection='tsvd'), dict(projection='tsvd', mlp='elas'), dict(rank=0)]:
        config = ModelConfig(**{**dict(vocab_size=512, n_layer=2, n_head=4, n_embd=256, intermediate_size=688, rank=64), **overrides})
        measured, _ = measure_flops(config, seq_len=128)
        with torch.device('meta'):
            assert abs(Transformer(config).flops_per_token(128) / measured - 1) < 0.05
