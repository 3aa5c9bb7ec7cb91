"""cola_gemm.py's fused GEMMs against float64, under Triton's interpreter on the CPU (fp32, fp16; ragged sizes), and
the model's choice of them."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import cola_gemm
from conftest import TINY
from model import Transformer

pytestmark = pytest.mark.triton
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2)}  # values of order 1, sums of <= 70 terms


def silu_grad(z):
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s))


@pytest.mark.parametrize('config', ['p64', 'tma128x64-splitk'])  # plain loads; a tensor descriptor for x and dy
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
@pytest.mark.parametrize('M,d_in,r,d_out', [(64, 32, 32, 64), (600, 50, 23, 70)])  # tiles whole; ragged, and 10 tiles
def test_both_epilogues_match_float64(config, dtype, M, d_in, r, d_out):  # of 64 rows for 8 programs: the persistent loop
    torch.manual_seed(0)
    x, A, B, dy = (torch.randn(*s) * 0.5 for s in ((M, d_in), (d_in, r), (r, d_out), (M, d_out)))
    x, A, B, dy = (t.to(dtype) for t in (x, A, B, dy))
    z, h = cola_gemm.gemm_silu(x, A, config)
    z64 = x.double() @ A.double()
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(z.double(), z64, rtol=rtol, atol=atol)
    torch.testing.assert_close(h.double(), F.silu(z64), rtol=rtol, atol=atol)
    dz, h2 = cola_gemm.gemm_silu_grad([dy], [B], z, config)
    zq = z.double()  # the backward reads z as it was stored
    torch.testing.assert_close(dz.double(), (dy.double() @ B.double().T) * silu_grad(zq), rtol=rtol, atol=atol)
    torch.testing.assert_close(h2.double(), F.silu(zq), rtol=rtol, atol=atol)


def test_the_tensor_descriptor_is_used_only_on_16_byte_aligned_rows():
    config = cola_gemm.CONFIGS['tma128']
    assert cola_gemm._tma(torch.zeros(8, 8, dtype=torch.float16), config)  # 16-byte rows
    assert not cola_gemm._tma(torch.zeros(8, 7, dtype=torch.float16), config)  # 14-byte rows: plain loads
    assert not cola_gemm._tma(torch.zeros(8, 8, dtype=torch.float16), cola_gemm.CONFIGS['p128'])


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
@pytest.mark.parametrize('M,N,splits', [(20, 40, 3), (130, 100, 2)])  # one tile: 128 + 128 + 44 tokens; 6 tiles
def test_split_k_weight_gradients_match_float64_and_repeat_bit_for_bit(dtype, M, N, splits):
    torch.manual_seed(0)
    a, b = torch.randn(300, M + 5).to(dtype), torch.randn(300, N).to(dtype)  # 300 tokens
    c = cola_gemm.tn_matmul(a[:, 5:], b, 'p64-splitk')  # a column slice: strided, as h_i and x are passed
    torch.testing.assert_close(c.double(), a[:, 5:].double().T @ b.double(), **dict(zip(('rtol', 'atol'), {
        torch.float32: (1e-5, 1e-4), torch.float16: (1e-2, 5e-2)}[dtype])))
    assert torch.equal(c, cola_gemm.tn_matmul(a[:, 5:], b, 'p64-splitk'))  # a fixed order of sums: the same bits
    config = cola_gemm.CONFIGS['p64-splitk']
    assert -(-300 // cola_gemm.split_size(300, M, N, config, sms=8)) == splits  # the interpreter's 8 SMs
    assert cola_gemm.split_size(300, M, N, cola_gemm.CONFIGS['p64'], sms=8) == 300  # this configuration never splits


@pytest.mark.parametrize('ranks', [(24,), (16, 16, 16)])  # o or down alone; q, k, v side by side
def test_the_fused_layers_give_eager_outputs_and_gradients_keeping_only_x_a_z_and_b(ranks):
    torch.manual_seed(0)
    d_in, d_outs = 40, [33, 20, 33][:len(ranks)]
    x = torch.randn(2, 19, d_in, requires_grad=True)
    A = torch.randn(d_in, sum(ranks), requires_grad=True)
    Bs = [torch.randn(r, d_out, requires_grad=True) for r, d_out in zip(ranks, d_outs)]
    dys = [torch.randn(2, 19, d_out) for d_out in d_outs]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        ys = cola_gemm.cola_layers(x, A, Bs, 'p64-splitk')
    torch.autograd.backward(ys, dys)
    x64, A64, *B64s = (t.detach().double().requires_grad_() for t in (x, A, *Bs))
    y64s = [F.silu(z) @ B for z, B in zip((x64 @ A64).split(list(ranks), dim=-1), B64s)]
    torch.autograd.backward(y64s, [dy.double() for dy in dys])
    got = [*ys, x.grad, A.grad, *(B.grad for B in Bs)]
    for g, expected in zip(got, [*y64s, x64.grad, A64.grad, *(B.grad for B in B64s)]):
        torch.testing.assert_close(g.double(), expected, rtol=1e-4, atol=1e-4)
    x_a_z = [(38, d_in), (d_in, sum(ranks)), (38, sum(ranks))]  # no h: it is rebuilt in backward
    assert sorted(saved) == sorted(x_a_z + list(zip(ranks, d_outs)))


def faster_for_qkv(config, name='p64'):
    """FASTER naming the fused path for the attention's q, k, v of a model of this config on this CPU."""
    r, d = config.rank, config.n_embd
    return {('cpu', 'float32', 2 * 16, d, ((r, d),) * 3): (name, 1.5)}  # 2 sequences of 16 tokens


def test_the_model_takes_the_fused_path_only_at_the_shapes_faster_names(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(TINY)
    idx = torch.randint(0, TINY.vocab_size, (2, 16))
    _, plain_loss = model(idx, idx)
    plain_grads = torch.autograd.grad(plain_loss, list(model.parameters()))
    calls = []
    monkeypatch.setattr(cola_gemm, 'FASTER', faster_for_qkv(TINY))
    monkeypatch.setattr(cola_gemm, 'cola_layers', lambda x, A, Bs, config, run=cola_gemm.cola_layers:
                        calls.append(len(Bs)) or run(x, A, Bs, config))
    _, loss = model(idx, idx)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert calls == [3] * TINY.n_layer  # q, k, v of each block; o, gate, up, down not in the table: the plain path
    with torch.no_grad():
        model(idx[:, :8])
        model(idx, idx)
    assert calls == [3] * TINY.n_layer  # another micro-batch, or no backward to come (evaluation): the plain path
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-6)
    for got, expected in zip(grads, plain_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    cola_m = Transformer(replace(TINY, checkpointing='cola-m'))
    cola_m(idx, idx)[1].backward()
    assert calls == [3] * TINY.n_layer  # CoLA-M keeps the plain path: its checkpoint saves the z of aten's products


def test_the_fused_path_compiles_without_graph_breaks(monkeypatch):
    monkeypatch.setattr(cola_gemm, 'FASTER', faster_for_qkv(TINY))
    torch._dynamo.reset()
    block = Transformer(TINY).blocks[0].attn
    x = torch.randn(2, 16, TINY.n_embd)
    fn = (lambda x: cola_gemm.cola_layers(x, torch.cat([p.A for p in (block.q_proj, block.k_proj, block.v_proj)], 1),
                                          [p.B for p in (block.q_proj, block.k_proj, block.v_proj)], 'p64'))
    explanation = torch._dynamo.explain(fn)(x)
    assert explanation.graph_break_count == 0
    torch.testing.assert_close(torch.compile(fn, backend='eager', fullgraph=True)(x), fn(x))


def test_the_gpu_stage_runs_its_steps_on_the_cpu_and_sets_a_failing_configuration_aside(monkeypatch, capsys):
    monkeypatch.setitem(cola_gemm.CONFIGS, 'broken', cola_gemm.Config(48, 64, 32, 4, 3, tma=False, split_k=False))
    monkeypatch.setattr(cola_gemm, 'CONFIGS', {k: cola_gemm.CONFIGS[k] for k in ('p64', 'tma128x64-splitk', 'broken')})
    cola_gemm.stage(budget_s=300, dry_run=True)
    out = capsys.readouterr().out
    rows = {line.split('|')[1].strip(): line for line in out.splitlines() if line.startswith('| ')}
    assert 'failed' in rows['broken'] and 'failed' not in rows['p64'] and 'WRONG' not in rows['p64']
    assert all(f'| tiny | {group} |' in out for group in ('q,k,v', 'o', 'gate,up', 'down'))
    assert 'FASTER = {' in out and not cola_gemm.POISON


@pytest.mark.cuda
def test_a_compiled_model_trains_a_bf16_step_through_the_fused_path_on_the_gpu(monkeypatch):
    """train.py's GPU step (torch.compile, bf16 autocast, AdamW) with every CoLA group on the fused path, against the
    same step on the plain path."""
    config = replace(TINY, n_embd=256, n_head=4, intermediate_size=688, rank=64, block_size=128)
    groups = cola_gemm.layer_groups(config.n_embd, config.intermediate_size, config.rank)
    faster = {(torch.cuda.get_device_name(), 'bfloat16', 4 * 128, d_in, tuple(shapes)): ('tma128-splitk', 1.5)
              for d_in, shapes in groups.values()}
    torch.manual_seed(0)
    model = Transformer(config).cuda()
    idx = torch.randint(0, config.vocab_size, (4, 128), device='cuda')
    with torch.autocast('cuda', dtype=torch.bfloat16):
        _, plain_loss = model(idx, idx)
        monkeypatch.setattr(cola_gemm, 'FASTER', faster)
        calls = []
        monkeypatch.setattr(cola_gemm, 'cola_layers', lambda x, A, Bs, c, run=cola_gemm.cola_layers:
                            calls.append(len(Bs)) or run(x, A, Bs, c))
        _, loss = torch.compile(model)(idx, idx)
    loss.backward()
    model.configure_optimizers(0.0, 1e-3, (0.9, 0.95), 'cuda').step()
    assert sorted(set(calls)) == [1, 2, 3]  # q, k, v; gate, up; o and down: every group fused
    assert abs(loss.item() - plain_loss.item()) < 2e-2 * plain_loss.item()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
