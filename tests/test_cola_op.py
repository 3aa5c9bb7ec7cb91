from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import cola_op
from bench import activation_bytes
from conftest import TINY
from helpers import ROOT, refused, run
from model import CoLALinear, Transformer

# Per dtype: (rtol, atol) against a float64 reference, for values of order 1 summed over <= 75 terms
# (longer sums: check_against_reference).
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-2, 2e-2), torch.bfloat16: (5e-2, 5e-2)}


def forward_backward(op, x, A, B, dy):
    """op(x, A, B) and its three gradients, in the inputs' dtype, on fresh copies of them."""
    x, A, B = (t.detach().clone().requires_grad_() for t in (x, A, B))
    y = op(x, A, B)
    y.backward(dy)
    return y, x.grad, A.grad, B.grad


def eager_cola(x, A, B):
    return F.silu(x @ A) @ B


def check_against_reference(lead, d_in, r, d_out, dtype, device='cpu'):
    torch.manual_seed(0)
    x = torch.randn(*lead, d_in, device=device).to(dtype)
    A = (torch.randn(d_in, r, device=device) * d_in ** -0.5).to(dtype)
    B = (torch.randn(r, d_out, device=device) * r ** -0.5).to(dtype)
    dy = torch.randn(*lead, d_out, device=device).to(dtype)
    rtol, atol = TOLERANCES[dtype]
    fused, eager = (forward_backward(op, x, A, B, dy) for op in (cola_op.cola_matmul, eager_cola))
    reference = forward_backward(eager_cola, *(t.double() for t in (x, A, B, dy)))  # float64
    for name, got, plain, want in zip(['y', 'dx', 'dA', 'dB'], fused, eager, reference):
        assert got.dtype == dtype and got.shape == want.shape, name
        # Rounding error grows with the length of the sums (dA and dB sum over every token): beyond the
        # tolerance for short sums, allow twice what eager PyTorch in the same dtype is off by.
        bound = max(atol, 2 * (plain.double() - want).abs().max().item())
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=bound, msg=lambda m: f'{name}: {m}')


@pytest.mark.triton
@pytest.mark.parametrize('lead,d_in,r,d_out', [((37,), 75, 19, 51), ((3, 13), 75, 19, 51), ((70,), 33, 65, 130)])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16])  # the elementwise pass: bf16 too
def test_fused_op_and_gradients_match_float64_reference(lead, d_in, r, d_out, dtype):
    check_against_reference(lead, d_in, r, d_out, dtype)


@pytest.mark.triton
def test_fused_op_takes_a_non_contiguous_input():
    x = torch.randn(13, 3, 75).transpose(0, 1)  # (3, 13, 75), not contiguous
    A, B = torch.randn(75, 19) * 0.1, torch.randn(19, 51) * 0.2
    torch.testing.assert_close(cola_op.cola_matmul(x, A, B), F.silu(x @ A) @ B, rtol=1e-4, atol=1e-5)


def test_pytorch_fallback_matches_reference():  # CPU without the interpreter: plain PyTorch
    check_against_reference((37,), 75, 19, 51, torch.float32)


@pytest.mark.triton
def test_fused_op_keeps_only_z_where_eager_keeps_z_and_silu_z():
    x, A, B = torch.randn(64, 40, requires_grad=True), torch.randn(40, 16, requires_grad=True), torch.randn(16, 24, requires_grad=True)
    sizes = {}
    for name, fn in [('fused', cola_op.cola_matmul), ('eager', eager_cola)]:
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            fn(x, A, B)
        activations = {t.untyped_storage().data_ptr(): t.numel() for t in saved if t.shape[0] == 64}  # per-token tensors
        sizes[name] = sum(activations.values()) // 64
    assert sizes['fused'] == 40 + 16  # x and z
    assert sizes['eager'] == 40 + 16 + 16  # x, z and silu(z)


@pytest.mark.triton
@pytest.mark.parametrize('mode', ['none', 'cola-m'])
def test_model_with_fused_op_equals_model_without(mode):
    idx = torch.randint(0, 96, (2, 16))
    results = []
    for fused_cola in (True, False):
        torch.manual_seed(0)
        model = Transformer(replace(TINY, fused_cola=fused_cola, checkpointing=mode))
        _, loss = model(idx, idx)
        loss.backward()
        results.append((loss, [p.grad for p in model.parameters()]))
    (loss_fused, grads_fused), (loss_eager, grads_eager) = results
    torch.testing.assert_close(loss_fused, loss_eager)
    for g_fused, g_eager in zip(grads_fused, grads_eager):
        torch.testing.assert_close(g_fused, g_eager, rtol=1e-4, atol=1e-6)


@pytest.mark.triton
def test_cola_m_with_fused_op_keeps_its_activation_bound():
    d, r = TINY.n_embd, TINY.rank
    values = activation_bytes(replace(TINY, checkpointing='cola-m'), 4, 16) / 4
    assert values == 2 * d + 7 * r


def test_compiled_cola_layer_has_no_graph_breaks():
    torch._dynamo.reset()
    layer = CoLALinear(24, 40, 8)
    x = torch.randn(2, 5, 24, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True)
    y = compiled(x)
    y.sum().backward()
    torch.testing.assert_close(y, F.silu(x @ layer.A) @ layer.B)
    explanation = torch._dynamo.explain(layer)(x)
    assert explanation.graph_break_count == 0


@pytest.mark.cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_kernels_match_reference(dtype):
    check_against_reference((4099,), 1000, 129, 777, dtype, device='cuda')
    check_against_reference((8, 256), 768, 256, 2048, dtype, device='cuda')


@pytest.mark.cuda
@pytest.mark.parametrize('checkpointing', ['none', 'cola-m'])
def test_a_compiled_cola_model_trains_a_bf16_step_on_the_gpu(checkpointing):
    """What train.py runs on a GPU, at 2 layers: torch.compile (Inductor, the custom op, CoLA-M's selective
    checkpoint), bf16 autocast, a backward and an AdamW step; the loss near the eager one's and finite gradients."""
    torch.manual_seed(0)
    model = Transformer(replace(TINY, n_embd=256, n_head=4, intermediate_size=688, rank=64, block_size=128,
                                checkpointing=checkpointing)).cuda()
    idx = torch.randint(0, TINY.vocab_size, (4, 128), device='cuda')
    with torch.autocast('cuda', dtype=torch.bfloat16):
        _, eager_loss = model(idx, idx)
        _, loss = torch.compile(model)(idx, idx)
    loss.backward()
    optimizer = model.configure_optimizers(0.0, 1e-3, (0.9, 0.95), 'cuda')
    optimizer.step()
    assert abs(loss.item() - eager_loss.item()) < 2e-2 * eager_loss.item()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_the_kernel_benchmark_says_it_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip('this machine has a GPU')
    refused(run(ROOT, 'cola_op.py', check=False), 'benchmarks the fused op on a CUDA GPU, and this machine has none')
