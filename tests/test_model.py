import ast
import glob
import math
from dataclasses import fields, replace

import pytest
import torch
from conftest import TINY
from helpers import ROOT

from bench import VARIANTS, activation_bytes, config_shape, measure_flops
import model as model_module
from model import CoLALinear, ModelConfig, Transformer

SHAPES_1B = dict(n_embd=2048, intermediate_size=5461, n_head=32, rank=512, block_size=256)


def build(config, seed=0, device=None):
    torch.manual_seed(seed)
    with torch.device(device or 'cpu'):
        return Transformer(config)


def closed_form_non_embedding(c):
    d, f, r, L = c.n_embd, c.intermediate_size, c.rank, c.n_layer
    if c.mlp == 'elas':  # up and down, 1.5 f wide (a multiple of 4), no gate
        h = int(1.5 * f) // 4 * 4
        per_layer = 8 * d * r + 2 * r * (d + h) + 2 * d if r else 4 * d * d + 2 * d * h + 2 * d
    else:
        per_layer = 11 * d * r + 3 * r * f + 2 * d if r else 4 * d * d + 3 * d * f + 2 * d
    return L * per_layer + d


@pytest.mark.parametrize('path', sorted(glob.glob('config/*.py')))
def test_parameter_counts_equal_closed_forms(path):
    model = build(config_shape(path)[0], device='meta')
    assert model.num_params() == closed_form_non_embedding(model.config)
    assert model.num_params(non_embedding=False) == model.num_params() + 2 * model.config.vocab_size * model.config.n_embd


def test_parameter_counts_match_the_paper_with_a_32k_vocabulary():
    for path, millions in [('config/cola_60m.py', 42.77), ('config/cola_1b.py', 609.3)]:
        model = build(config_shape(path, vocab_size=32000)[0], device='meta')
        assert round(model.num_params(non_embedding=False) / 1e6, 2 if millions < 100 else 1) == millions


def test_cola_layer_computes_silu_bottleneck_and_has_official_init_scale():
    torch.manual_seed(0)
    layer = CoLALinear(300, 500, 64).double()
    x = torch.randn(3, 7, 300, dtype=torch.float64)
    A, B = layer.A.detach(), layer.B.detach()
    z = torch.einsum('btd,dr->btr', x, A)
    expected = torch.einsum('btr,ro->bto', z * torch.sigmoid(z), B)
    torch.testing.assert_close(layer(x), expected)
    std = 64 ** -0.25 * (300 + 500) ** -0.25
    assert abs(A.std().item() / std - 1) < 0.02 and abs(B.std().item() / std - 1) < 0.02


@pytest.mark.parametrize('rank', [0, 16])
def test_logits_are_causal(rank):
    model = build(replace(TINY, rank=rank)).eval()
    idx = torch.randint(0, 96, (2, 24))
    changed = idx.clone()
    changed[:, 12:] = torch.randint(0, 96, (2, 12))
    logits, _ = model(idx)
    logits_changed, _ = model(changed)
    torch.testing.assert_close(logits[:, :12], logits_changed[:, :12])
    assert not torch.allclose(logits[:, 12:], logits_changed[:, 12:])


def loss_and_grads(config, idx):
    model = build(config)
    _, loss = model(idx, idx)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize('rank,mode', [(0, 'full'), (16, 'full'), (16, 'cola-m')])
def test_checkpointing_gives_the_same_loss_and_gradients(rank, mode):
    idx = torch.randint(0, 96, (3, 32))
    loss, grads = loss_and_grads(replace(TINY, rank=rank), idx)
    loss_ck, grads_ck = loss_and_grads(replace(TINY, rank=rank, checkpointing=mode), idx)
    torch.testing.assert_close(loss_ck, loss, rtol=1e-6, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads_ck[name], grads[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('field,value,message', [
    ('rank', -4, 'rank=-4: expected 0 (full-rank) or a bottleneck narrower than n_embd=64 and intermediate_size=128'),
    ('rank', 64, 'rank=64: expected 0'),  # as wide as n_embd: CoLA-M could not tell z from other outputs
    ('n_layer', 0, 'n_layer=0: expected a positive integer'),
    ('vocab_size', -1, 'vocab_size=-1: expected a positive integer'),
    ('n_head', 3, 'n_embd=64 must split into n_head=3 heads of even size'),
    ('norm_eps', 0.0, 'norm_eps=0.0, rope_theta=10000.0: expected positive numbers'),
    ('checkpointing', 'selective', "checkpointing='selective': expected 'none', 'full' or 'cola-m'"),
])
def test_bad_model_settings_are_one_line_errors_naming_the_value(field, value, message):
    with pytest.raises(ValueError) as error:
        replace(TINY, **{field: value})
    assert message in str(error.value) and '\n' not in str(error.value)


def test_cola_m_without_cola_layers_is_an_error():
    with pytest.raises(ValueError, match='needs CoLA layers'):
        replace(TINY, rank=0, checkpointing='cola-m')


def test_train_py_has_every_model_field_with_the_same_default():
    settings = {}
    for node in ast.parse(open(f'{ROOT}/train.py').read()).body:  # train.py's module-level constants
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                settings[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    for field in fields(ModelConfig):
        assert field.name in settings, field.name
        if field.name != 'vocab_size':  # train.py's None: the data's vocabulary, padded
            assert settings[field.name] == field.default, field.name


def saved_tensor_bytes(config, batch_size, seq_len):
    """The independent count: bytes of the unique storages saved for backward, seen by
    saved_tensors_hooks, per token and layer (two depths subtracted). Blind to what selective
    checkpointing caches, so only for 'none' and 'full'."""
    per_depth = []
    for n_layer in (1, 2):
        model = build(replace(config, n_layer=n_layer))
        weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        storages = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        idx = torch.randint(0, config.vocab_size, (batch_size, seq_len))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(idx, idx)
        per_depth.append(sum(storages.values()))
    return (per_depth[1] - per_depth[0]) / (batch_size * seq_len)


@pytest.mark.parametrize('rank,mode', [(0, 'none'), (0, 'full'), (16, 'none'), (16, 'full')])
def test_activation_probe_agrees_with_saved_tensors_hooks(rank, mode):
    config = replace(TINY, rank=rank, checkpointing=mode)
    assert activation_bytes(config, 8, 32) == saved_tensor_bytes(config, 8, 32)


@pytest.mark.parametrize('d,r', [(128, 32), (96, 32), (64, 32)])  # 3r = d and 2r = d: the merged z as wide as q or h
def test_saved_activations_per_token_and_layer(d, r):
    config = replace(TINY, n_embd=d, rank=r)
    values = {mode: activation_bytes(replace(config, checkpointing=mode), 8, 32) / 4 for mode in ('none', 'full', 'cola-m')}
    assert values['full'] == d  # only the block's input
    assert values['cola-m'] == 2 * d + 7 * r  # x, h and the seven z = x @ A
    assert values['none'] > 4 * values['cola-m']


@pytest.mark.parametrize('fused', [True, False])
def test_merged_down_projections_compute_the_separate_layers_function_and_gradients(monkeypatch, fused):
    config = replace(TINY, fused_cola=fused)
    idx = torch.randint(0, 96, (3, 32))
    results = []
    for merged in (True, False):
        model = build(config).double()
        if not merged:  # each layer on its own: x @ A_q, x @ A_k, x @ A_v, ...
            monkeypatch.setattr(model_module, 'fan_out', lambda layers, x: [layer(x) for layer in layers])
        logits, loss = model(idx, idx)
        loss.backward()
        results.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    (logits, grads), (logits_separate, grads_separate) = results
    torch.testing.assert_close(logits, logits_separate, rtol=1e-12, atol=1e-12)
    for name in grads:
        torch.testing.assert_close(grads[name], grads_separate[name], rtol=1e-12, atol=1e-12)
    assert {n for n in grads if '.attn.' in n} == {f'blocks.{i}.attn.{p}_proj.{w}' for i in range(2) for p in 'qkvo'
                                                     for w in 'AB'}  # the layers and their names stay separate


@pytest.mark.parametrize('mode', ['full', 'cola-m'])
def test_model_flops_leave_out_what_checkpointing_recomputes(mode):
    config = replace(TINY, checkpointing=mode)
    assert build(config).flops_per_token(32, recomputation=False) == build(replace(config, checkpointing='none')).flops_per_token(32)
    assert build(config).flops_per_token(32) > build(config).flops_per_token(32, recomputation=False)


def test_cola_m_recomputes_under_a_quarter_of_full_rank_checkpointing_at_1b():
    config = ModelConfig(vocab_size=64, n_layer=1, **SHAPES_1B)
    _, cola_m = measure_flops(replace(config, checkpointing='cola-m'), seq_len=256)
    _, full = measure_flops(replace(config, rank=0, checkpointing='full'), seq_len=256)
    _, cola_full = measure_flops(replace(config, checkpointing='full'), seq_len=256)
    assert cola_m > 0 and cola_m / full <= 0.25
    assert cola_m < cola_full / 2  # and well under CoLA's own whole-block checkpointing


@pytest.mark.parametrize('rank,mode,fused', [(0, 'none', True), (0, 'full', True), (64, 'none', True),
                                             (64, 'full', True), (64, 'full', False), (64, 'cola-m', True)])
def test_flops_per_token_matches_flop_counter(rank, mode, fused):
    config = ModelConfig(vocab_size=512, n_layer=2, n_head=4, n_embd=256, intermediate_size=688, rank=rank,
                         checkpointing=mode, fused_cola=fused)
    measured, _ = measure_flops(config, seq_len=128)
    analytic = build(config, device='meta').flops_per_token(128)
    assert abs(analytic / measured - 1) < 0.05


@pytest.mark.parametrize('rank', [0, 16])
def test_tiny_model_overfits_one_batch(rank):
    model = build(replace(TINY, rank=rank))
    idx = torch.randint(0, 96, (4, 32))
    optimizer = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95), 'cpu')
    for _ in range(150):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1, f'loss {loss.item():.3f} after 150 steps on one batch (log 96 = {math.log(96):.2f})'


def test_optimizer_decays_matrices_only():
    model = build(TINY)
    decay, no_decay = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu').param_groups
    name = {id(p): n for n, p in model.named_parameters()}
    decayed = sorted(name[id(p)] for p in decay['params'])
    assert decay['weight_decay'] == 0.1 and no_decay['weight_decay'] == 0.0
    assert sorted(name[id(p)] for p in no_decay['params']) == sorted(n for n in name.values() if n.endswith('norm.weight'))
    assert 'tok_emb.weight' in decayed and 'lm_head.weight' in decayed and 'blocks.0.attn.q_proj.A' in decayed
    assert 'blocks.1.mlp.down_proj.B' in decayed and len(decayed) + len(no_decay['params']) == len(name)


@pytest.mark.parametrize('name,changes', VARIANTS)
def test_every_method_trains_under_bfloat16_autocast(name, changes):
    # GPU training runs under bf16 autocast, where a product of two fp32 parameters comes out bf16:
    # every method's layers must take that (SLTrain's sparse values once did not, found on an H200).
    model = build(replace(TINY, **changes))
    idx = torch.randint(0, TINY.vocab_size, (2, 16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
