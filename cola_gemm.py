"""
CoLA's layer y = silu(x @ A) @ B with the SiLU fused into the epilogues of two Triton GEMMs, the design's fused
low-rank matmul. (Named so as not to be `kernels`: a top-level kernels.py would shadow the Hugging Face package
of that name, which transformers imports.)

    x: (M, d_in)   A: (d_in, r)   B: (r, d_out)   M the number of tokens

Forward:   z = x @ A,  h = silu(z)              one GEMM; its epilogue writes z (kept for backward) and h (temporary),
                                                one sigmoid per output value
           y = h @ B                            cuBLAS
Backward:  g = dy @ B^T                         one GEMM; its epilogue loads the z tile and writes
           dz = g * silu'(z),  h = silu(z)      dz and h, never g: silu'(z) = s (1 + z (1 - s)), s = sigmoid(z)
           dB = h^T @ dy,  dA = x^T @ dz,       cuBLAS
           dx = dz @ A^T

Against cola_op.py (cuBLAS for every product and one Triton pass over z and g), this saves the pass that reads z
and g and writes h and dz: g never reaches memory, and the forward's SiLU costs no pass of its own. Both keep only
x and z for backward. Whether that pays depends on the GEMMs running at cuBLAS's speed, which only a GPU can tell:
`python cola_gemm.py` times both at every config's shape. The rule is that the model takes this path for a shape
only where a GPU measurement, committed in FASTER_SHAPES, found it faster than cola_op.py by more than 2%, so that a
user never gets the slower one; no GPU has run it yet, FASTER_SHAPES is empty and the model calls cola_op.py alone
(the switch in CoLALinear comes with the first measurement). Not yet here: split-K for the long reductions, tensor
descriptors (TMA) and a persistent grid on Hopper.

Checked against float64 under Triton's interpreter (TRITON_INTERPRET=1 before the first launch) in fp32 and fp16,
ragged sizes included (tests/test_cola_gemm.py); the interpreter computes bf16 products wrongly, so bf16 is checked
on a GPU only.
"""

import torch
import triton
import triton.language as tl

FASTER_SHAPES = {}  # {(device name, dtype, d_in, r, d_out): measured speed-up over cola_op}, from a GPU run; none yet


@triton.jit
def _matmul_silu_kernel(a_ptr, b_ptr, z_ptr, out_ptr, h_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        GRAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """acc = a @ b for one (BM, BN) tile, in fp32; then the epilogue, on row-major (M, N) outputs:
    GRAD False: acc is z; writes out = z and h = silu(z).
    GRAD True:  acc is g; loads z, writes out = dz = g * silu'(z) and h = silu(z)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    offsets, mask = rm[:, None] * N + rn[None, :], (rm[:, None] < M) & (rn[None, :] < N)
    if GRAD:
        z = tl.load(z_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(z)
        tl.store(out_ptr + offsets, (acc * s * (1.0 + z * (1.0 - s))).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        z = acc.to(out_ptr.dtype.element_ty)  # h from z as stored, as eager PyTorch's silu(z) sees it
        tl.store(out_ptr + offsets, z, mask=mask)
        z = z.to(tl.float32)
        s = tl.sigmoid(z)
    tl.store(h_ptr + offsets, (z * s).to(h_ptr.dtype.element_ty), mask=mask)


def _launch(a, b, z, grad):
    """(out, h) of the kernel for a (M, K) @ b (K, N), both of any strides."""
    M, K = a.shape
    N = b.shape[1]
    out, h = (torch.empty(M, N, device=a.device, dtype=a.dtype) for _ in range(2))
    BM, BN, BK = 64, (32 if N <= 32 else 64), 32  # tiles of at least 16 for tl.dot; a GPU run is to tune them
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _matmul_silu_kernel[grid](a, b, z if grad else out, out, h, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                              b.stride(1), GRAD=grad, BM=BM, BN=BN, BK=BK)
    return out, h


def matmul_silu(x, A):
    """(z, h) = (x @ A, silu(x @ A)) for x (M, d_in), A (d_in, r): one GEMM with SiLU in its epilogue."""
    return _launch(x, A, None, grad=False)


def matmul_silu_grad(dy, B, z):
    """(dz, h) = ((dy @ B^T) * silu'(z), silu(z)) for dy (M, d_out), B (r, d_out), z (M, r): one GEMM, g unwritten."""
    return _launch(dy, B.mT, z.contiguous(), grad=True)


class FusedCoLA(torch.autograd.Function):
    """y = silu(x @ A) @ B, keeping x and z for backward (x (M, d_in) contiguous)."""

    @staticmethod
    def forward(ctx, x, A, B):
        z, h = matmul_silu(x, A)
        ctx.save_for_backward(x, A, B, z)
        return h @ B

    @staticmethod
    def backward(ctx, dy):
        x, A, B, z = ctx.saved_tensors
        dz, h = matmul_silu_grad(dy.contiguous(), B, z)
        return dz @ A.mT, x.mT @ dz, h.mT @ dy


def fused_cola_matmul(x, A, B):
    """silu(x @ A) @ B for x of any leading shape (..., d_in), through FusedCoLA."""
    return FusedCoLA.apply(x.reshape(-1, x.shape[-1]).contiguous(), A, B).view(*x.shape[:-1], B.shape[1])


def benchmark(dtype=torch.bfloat16):
    """Forward+backward of the fused path against cola_op.py's and eager PyTorch at every config's shapes and
    micro-batch, after checking the fused path against float64 on each: the table that FASTER_SHAPES records."""
    import torch.nn.functional as F
    from triton.testing import do_bench

    import cola_op
    print(f'{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, {dtype}')
    print('| shape | tokens | d_in | r | d_out | fused ms | op ms | eager ms | fused / op | max error vs float64 |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for name, (d_in, r, d_out) in cola_op.SHAPES.items():
        tokens = 16384
        x = torch.randn(tokens, d_in, device='cuda', dtype=dtype, requires_grad=True)
        A = (torch.randn(d_in, r, device='cuda', dtype=dtype) * d_in ** -0.5).requires_grad_()
        B = (torch.randn(r, d_out, device='cuda', dtype=dtype) * r ** -0.5).requires_grad_()
        dy = torch.randn(tokens, d_out, device='cuda', dtype=dtype)
        reference = F.silu(x.double() @ A.double()) @ B.double()
        error = (fused_cola_matmul(x, A, B).double() - reference).abs().max().item()
        ms = {label: do_bench(lambda: torch.autograd.backward(fn(x, A, B), dy), grad_to_none=[x, A, B],
                              return_mode='median')
              for label, fn in [('fused', fused_cola_matmul), ('op', cola_op.cola_matmul),
                                ('eager', lambda x, A, B: F.silu(x @ A) @ B)]}
        print(f"| {name} | {tokens} | {d_in} | {r} | {d_out} | {ms['fused']:.3f} | {ms['op']:.3f} | {ms['eager']:.3f} | "
              f"{ms['op'] / ms['fused']:.2f}x | {error:.2e} |")


if __name__ == '__main__':
    import sys
    if '--help' in sys.argv or '-h' in sys.argv:
        print(__doc__.strip())
        raise SystemExit(0)
    if not torch.cuda.is_available():
        raise SystemExit("python cola_gemm.py benchmarks the fused GEMMs on a CUDA GPU, and this machine has none")
    benchmark()
