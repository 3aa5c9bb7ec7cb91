"""cola_gemm.py's fused GEMMs against float64, under Triton's interpreter on the CPU (fp32, fp16; ragged sizes)."""
import pytest
import torch
import torch.nn.functional as F

import cola_gemm

pytestmark = pytest.mark.triton
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2)}  # values of order 1, sums of <= 70 terms


def silu_grad(z):
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
@pytest.mark.parametrize('M,d_in,r,d_out', [(64, 32, 32, 64), (37, 50, 23, 70)])  # tiles whole, and ragged everywhere
def test_both_epilogues_match_float64(dtype, M, d_in, r, d_out):
    torch.manual_seed(0)
    x, A, B, dy = (torch.randn(*s) * 0.5 for s in ((M, d_in), (d_in, r), (r, d_out), (M, d_out)))
    x, A, B, dy = (t.to(dtype) for t in (x, A, B, dy))
    z, h = cola_gemm.matmul_silu(x, A)
    z64 = x.double() @ A.double()
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(z.double(), z64, rtol=rtol, atol=atol)
    torch.testing.assert_close(h.double(), F.silu(z64), rtol=rtol, atol=atol)
    dz, h2 = cola_gemm.matmul_silu_grad(dy, B, z)
    zq = z.double()  # the backward reads z as it was stored
    torch.testing.assert_close(dz.double(), (dy.double() @ B.double().T) * silu_grad(zq), rtol=rtol, atol=atol)
    torch.testing.assert_close(h2.double(), F.silu(zq), rtol=rtol, atol=atol)


def test_the_fused_layer_gives_eager_pytorchs_output_and_gradients_and_keeps_only_x_and_z():
    torch.manual_seed(0)
    x, A, B = (torch.randn(*s, requires_grad=True) for s in ((2, 19, 40), (40, 24), (24, 33)))
    dy = torch.randn(2, 19, 33)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        y = cola_gemm.fused_cola_matmul(x, A, B)
    y.backward(dy)
    grads = [t.grad for t in (x, A, B)]
    x64, A64, B64 = (t.detach().double().requires_grad_() for t in (x, A, B))
    y64 = F.silu(x64 @ A64) @ B64
    y64.backward(dy.double())
    torch.testing.assert_close(y.double(), y64, rtol=1e-4, atol=1e-5)
    for got, expected in zip(grads, (x64.grad, A64.grad, B64.grad)):
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)
    assert sorted(saved) == sorted([torch.Size([38, 40]), torch.Size([40, 24]), torch.Size([24, 33]),
                                    torch.Size([38, 24])])  # x, A, B (parameters) and z: no h
