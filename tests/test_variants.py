import json
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, TINY_TRAIN
from helpers import run, train_log

from bench import activation_bytes, measure_flops
from model import CoLALinear, ModelConfig, Transformer, load_checkpoint, sparsify24

DLR = replace(TINY, dlr_alpha=1.0)
ELAS = replace(TINY, mlp='elas')


def build(config, seed=0):
    torch.manual_seed(seed)
    return Transformer(config)


# ----------------------------------------------------------------------------- DLR

@pytest.mark.parametrize('d_in,d_out,rank', [(40, 96, 16), (40, 100, 16), (40, 1376 // 16, 16), (40, 10, 16)])
def test_dlr_layer_equals_the_formula_in_float64(d_in, d_out, rank):
    torch.manual_seed(0)
    layer = CoLALinear(d_in, d_out, rank, fused=False, dlr_alpha=0.7).double()
    x = torch.randn(3, 5, d_in, dtype=torch.float64)
    s = F.silu(x @ layer.A.detach())  # (3, 5, r)
    K = math.ceil(d_out / rank)  # d_out < r: K = 1
    expand = torch.stack([s[..., o // K] for o in range(d_out)], dim=-1)  # column o copies latent o // K
    expected = s @ layer.B.detach() + 0.7 / math.sqrt(K) * expand
    torch.testing.assert_close(layer(x), expected, rtol=1e-6, atol=1e-7)  # the residual is built in fp32


def test_dlr_at_d_out_1376_and_rank_128_uses_126_latents():
    layer = CoLALinear(8, 1376, 128, dlr_alpha=1.0)
    used = (layer.dlr_residual != 0).any(dim=1)
    assert used.sum() == 126 and layer.dlr_residual.max() == pytest.approx(1 / math.sqrt(11))


def test_dlr_leaves_b_gradient_as_colas_and_scope_picks_the_layers():
    torch.manual_seed(0)
    plain, dlr = CoLALinear(24, 40, 8, fused=False), CoLALinear(24, 40, 8, fused=False, dlr_alpha=1.0)
    dlr.load_state_dict({**plain.state_dict(), 'dlr_residual': dlr.dlr_residual})
    x, dy = torch.randn(6, 24), torch.randn(6, 40)
    plain(x).backward(dy)
    dlr(x).backward(dy)
    torch.testing.assert_close(dlr.B.grad, plain.B.grad)  # dL/dB = silu(z)^T dy either way
    attn_only = build(replace(DLR, dlr_scope='attn'))
    assert attn_only.blocks[0].attn.q_proj.dlr_residual is not None and attn_only.blocks[0].mlp.up_proj.dlr_residual is None


def test_folding_dlr_keeps_the_logits_and_gives_colas_names_and_counts():
    model, cola = build(DLR).eval(), build(TINY)
    idx = torch.randint(0, 96, (2, 32))
    before, _ = model(idx)
    model.fold_dlr()
    after, _ = model(idx)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    assert list(model.state_dict()) == list(cola.state_dict()) and model.num_params() == cola.num_params()
    assert model.config == TINY


def test_a_dlr_checkpoint_cannot_be_loaded_into_a_cola_model_by_mistake():
    with pytest.raises(RuntimeError, match='Unexpected key.*dlr_residual'):
        build(TINY).load_state_dict(build(DLR).state_dict())


# ----------------------------------------------------------------------------- ELAS

def test_sparsify24_keeps_exactly_the_two_largest_magnitudes_of_every_four():
    torch.manual_seed(0)
    h = torch.randn(5, 7, 64)
    h[0, 0, :4] = torch.tensor([1.0, -1.0, 1.0, 0.5])  # a tie: the first two of the largest are kept
    out = sparsify24(h)
    groups, kept = h.view(-1, 4), out.view(-1, 4)
    assert ((kept != 0).sum(dim=1) == 2).all()
    for g, k in zip(groups, kept):
        top = sorted(range(4), key=lambda i: (-abs(g[i].item()), i))[:2]
        assert torch.equal(k[top], g[top]) and all(k[i] == 0 for i in range(4) if i not in top)
    assert torch.equal(out[0, 0, :4], torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_sparsify24_gradient_is_straight_through():
    h = torch.randn(3, 16, requires_grad=True)
    w = torch.randn(16, 5)
    (sparsify24(h) @ w).sum().backward()
    masked = (h.detach() * (sparsify24(h).detach() != 0)).requires_grad_()
    (masked @ w).sum().backward()  # the dense gradient through the mask taken as identity
    torch.testing.assert_close(h.grad, masked.grad)


def test_elas_mlp_shapes_and_sparsity_switch():
    model = build(replace(ELAS, intermediate_size=5461 // 16))  # 341 * 1.5 = 511.5: rounded down to 508
    mlp = model.blocks[0].mlp
    assert mlp.up_proj.B.shape[1] == 508 and not hasattr(mlp, 'gate_proj') and mlp.sparse
    x = torch.randn(2, 8, 64)
    assert ((mlp.hidden_activation(x).view(2, 8, -1, 4) != 0).sum(-1) <= 2).all()
    model.set_sparsity(False)
    assert not mlp.sparse and not mlp.down_proj.sparse_input
    full_rank = build(replace(ELAS, rank=0))
    assert full_rank.num_params() == build(replace(TINY, rank=0)).num_params()  # 2 x 1.5 f = 3 f


# ----------------------------------------------------------------------------- both

@pytest.mark.parametrize('config', [DLR, ELAS, replace(ELAS, dlr_alpha=1.0)], ids=['dlr', 'elas', 'elas+dlr'])
def test_cola_m_gives_the_same_loss_and_gradients(config):
    idx = torch.randint(0, 96, (3, 32))
    results = []
    for mode in ('none', 'cola_m'):
        model = build(replace(config, checkpointing=mode))
        _, loss = model(idx, idx)
        loss.backward()
        results.append((loss, {n: p.grad for n, p in model.named_parameters()}))
    (loss, grads), (loss_m, grads_m) = results
    torch.testing.assert_close(loss_m, loss, rtol=1e-6, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads_m[name], grads[name], rtol=1e-5, atol=1e-6)


def test_cola_m_keeps_2d_plus_6r_values_per_token_and_layer_with_elas_and_2d_plus_7r_with_dlr():
    d, r = TINY.n_embd, TINY.rank
    assert activation_bytes(replace(ELAS, checkpointing='cola_m'), 4, 32) / 4 == 2 * d + 6 * r  # no gate: six z
    # DLR: the same per token, plus the summed weight B + R (r x d) of o_proj and of down_proj, whose
    # up-projections run outside the checkpoints: per layer, not per token (here 4 x 32 tokens)
    assert activation_bytes(replace(DLR, checkpointing='cola_m'), 4, 32) / 4 == 2 * d + 7 * r + 2 * r * d / (4 * 32)


@pytest.mark.parametrize('overrides', [dict(dlr_alpha=1.0), dict(mlp='elas'), dict(mlp='elas', rank=0),
                                       dict(mlp='elas', checkpointing='cola_m'), dict(mlp='elas', checkpointing='full')])
def test_flops_per_token_matches_flop_counter(overrides):
    config = ModelConfig(**{**dict(vocab_size=512, n_layer=2, n_head=4, n_embd=256, intermediate_size=688, rank=64), **overrides})
    measured, _ = measure_flops(config, seq_len=128)
    with torch.device('meta'):
        analytic = Transformer(config).flops_per_token(128)
    assert abs(analytic / measured - 1) < 0.05


def test_elas_warm_up_switches_at_its_step_and_resume_is_exact(data):
    common = [*TINY_TRAIN, '--data_dir=data', '--mlp=elas', '--elas_warmup_iters=4', '--eval_interval=3']
    run(data, 'train.py', *common, '--out_dir=elas_straight', '--max_iters=8')
    run(data, 'train.py', *common, '--out_dir=elas_resumed', '--max_iters=3')
    run(data, 'train.py', *common, '--out_dir=elas_resumed', '--max_iters=8', '--init_from=resume')
    records = [json.loads(line) for line in open(data / 'elas_straight' / 'log.jsonl')]
    sparse = {r['iter']: r['sparse_24'] for r in records if 'loss' in r}
    assert sparse == {i: i > 4 for i in range(1, 9)}  # the step that ends at iter i ran at iter_num i - 1
    assert train_log(data / 'elas_resumed') == train_log(data / 'elas_straight')


def test_a_dlr_checkpoint_samples_the_same_greedy_tokens_after_folding(data):
    run(data, 'train.py', *TINY_TRAIN, '--data_dir=data', '--dlr_alpha=1.0', '--out_dir=dlr', '--max_iters=10',
        '--eval_interval=10')
    checkpoint = load_checkpoint(str(data / 'dlr' / 'ckpt.pt'))
    unfolded = Transformer(ModelConfig(**checkpoint['model_config'])).eval()
    unfolded.load_state_dict(checkpoint['model'])
    prompt = 'the cat sees'
    idx = torch.tensor([list(prompt.encode())])
    expected = bytes(t for t in unfolded.generate(idx, 30, temperature=0)[0].tolist() if t < 256).decode(errors='replace')
    r = run(data, 'sample.py', '--out_dir=dlr', f'--start={prompt}', '--temperature=0', '--num_samples=1',
            '--max_new_tokens=30', '--device=cpu', '--dtype=float32')
    assert r.stdout.split('---------------')[0].rstrip('\n') == expected
