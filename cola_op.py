"""
CoLA's fused up-projection y = silu(z) @ B, with autograd, keeping only z for backward.

    z: (M, r) = x @ A, M the number of tokens   B: (r, d_out)   y: (M, d_out)

Eager PyTorch, silu(z) @ B, keeps both z and silu(z) for backward. This op keeps z alone and rebuilds
silu(z) in backward, inside the one elementwise pass that backward needs anyway:

Forward:   h = silu(z)                              temporary, freed once y exists
           y = h @ B                                cuBLAS
Backward:  g = dy @ B^T                             cuBLAS
           h, dz = silu(z), g * silu'(z)            one Triton pass over z and g (silu_and_grad):
                                                    silu'(z) = s (1 + z (1 - s)), s = sigmoid(z), in fp32
           dB = h^T @ dy                            cuBLAS

So the r-wide activations of a CoLA layer halve (CoLA-M's 2d + 7r layout rests on it) for the price of one
extra write of h in backward. Why the products are cuBLAS's and only the elementwise work is fused: the
previous version applied SiLU inside Triton GEMMs (a prologue on z, an epilogue for silu'); on an H200
(2026-12-04, docs/efficiency.md) it was slower than eager PyTorch at every CoLA shape, 0.19x at 130m, where
dB = silu(z)^T @ dy has an output of only r x d_out tiles to spread over 132 SMs while it sums over every
token, and its GEMMs reached 430-520 TFLOP/s at 7b where cuBLAS reached 595-655. Fusion can only save the
elementwise passes over z, a small share of the products' time; cuBLAS does the products better than
our kernel did.

Dispatch: CUDA tensors run the Triton pass; CPU tensors run plain PyTorch (aten's silu_backward), or the
same Triton pass under Triton's interpreter when TRITON_INTERPRET=1 is set before the first launch (how the
tests check it without a GPU). The op and its backward are torch.library custom ops: torch.compile calls
them as they are, with no graph break, and FlopCounterMode counts them by the formulas below.

`python cola_op.py` benchmarks forward+backward on a CUDA GPU against eager PyTorch, torch.compile and
the same six products alone.
"""

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'
BLOCK = 1024  # elements per program of the elementwise pass; no autotuning, so no start-up search


@triton.jit
def _silu_and_grad_kernel(z_ptr, g_ptr, h_ptr, dz_ptr, n, BLOCK: tl.constexpr):
    """h = silu(z) and dz = g * silu'(z), elementwise over n values, in fp32."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    z = tl.load(z_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(z)
    tl.store(h_ptr + offsets, (z * s).to(h_ptr.dtype.element_ty), mask=mask)
    tl.store(dz_ptr + offsets, (g * s * (1.0 + z * (1.0 - s))).to(dz_ptr.dtype.element_ty), mask=mask)


def _use_triton(t):
    return t.is_cuda or (INTERPRET and t.device.type == 'cpu')


def silu_and_grad(z, g):
    """(silu(z), g * silu'(z)) for z and g of one shape: one pass over both on CUDA."""
    if not _use_triton(z):
        return F.silu(z), torch.ops.aten.silu_backward(g, z)
    z, g = z.contiguous(), g.contiguous()
    h, dz = torch.empty_like(z), torch.empty_like(z)
    _silu_and_grad_kernel[(triton.cdiv(z.numel(), BLOCK),)](z, g, h, dz, z.numel(), BLOCK=BLOCK)
    return h, dz


# ----------------------------------------------------------------------------- the op

@torch.library.custom_op('nanocola::silu_mm', mutates_args=())
def silu_mm(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(z) @ w for z (M, K), w (K, N)."""
    return F.silu(z) @ w


@torch.library.custom_op('nanocola::silu_mm_backward', mutates_args=())
def silu_mm_backward(dy: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dz, dw) of y = silu(z) @ w, given dy (M, N)."""
    h, dz = silu_and_grad(z, dy @ w.mT)  # (M, K) each
    return dz, h.mT @ dy


@silu_mm.register_fake
def _(z, w):
    return z.new_empty(z.shape[0], w.shape[1])


@silu_mm_backward.register_fake
def _(dy, z, w):
    return torch.empty_like(z), torch.empty_like(w)


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # z and w: never silu(z)


def _silu_mm_grad(ctx, dy):
    z, w = ctx.saved_tensors
    return silu_mm_backward(dy, z, w)


silu_mm.register_autograd(_silu_mm_grad, setup_context=_save_inputs)


@register_flop_formula(torch.ops.nanocola.silu_mm)
def _forward_flops(z_shape, w_shape, *args, **kwargs):
    return 2 * z_shape[0] * z_shape[1] * w_shape[1]


@register_flop_formula(torch.ops.nanocola.silu_mm_backward)
def _backward_flops(dy_shape, z_shape, w_shape, *args, **kwargs):
    return 4 * z_shape[0] * z_shape[1] * w_shape[1]  # dy @ w^T and silu(z)^T @ dy


def silu_matmul(z, B):
    """silu(z) @ B for z (..., r), B (r, d_out): a CoLA layer's up-projection."""
    y = silu_mm(z.reshape(-1, z.size(-1)), B.to(z.dtype))  # under autocast z is bf16, B an fp32 parameter
    return y.view(*z.shape[:-1], B.size(1))


def cola_matmul(x, A, B):
    """silu(x @ A) @ B for x (..., d_in), A (d_in, r), B (r, d_out); differentiable in all three."""
    return silu_matmul(x @ A, B)


# ----------------------------------------------------------------------------- benchmark

SHAPES = {  # (d_in, r, d_out): attention d -> r -> d; MLP d -> r -> f and f -> r -> d
    '130m attn': (768, 256, 768), '130m mlp up': (768, 256, 2048), '130m mlp down': (2048, 256, 768),
    '1b attn': (2048, 512, 2048), '1b mlp up': (2048, 512, 5461), '1b mlp down': (5461, 512, 2048),
    '7b attn': (4096, 1024, 4096), '7b mlp up': (4096, 1024, 11008), '7b mlp down': (11008, 1024, 4096),
}


def benchmark(tokens=16384, dtype=torch.bfloat16):
    """Forward+backward time of the op, eager PyTorch, torch.compile of the eager expression, and the
    six products alone (x @ A, h @ B, dy @ B^T, h^T @ dy, x^T @ dz and dz @ A^T: the floor of any fused version),
    at CoLA's shapes; the op's first call apart (its one-time compilation of the Triton pass)."""
    import time
    from triton.testing import do_bench

    def eager(x, A, B):
        return F.silu(x @ A) @ B

    compiled = torch.compile(eager)
    print(f'forward+backward, {tokens} tokens, {dtype}, {torch.cuda.get_device_name()}, '
          f'torch {torch.__version__}, triton {triton.__version__}')
    x, A, B = (torch.randn(*size, device='cuda', dtype=dtype, requires_grad=True) for size in ((tokens, 768), (768, 256), (256, 768)))
    torch.cuda.synchronize()
    t0 = time.perf_counter()  # the op's first call: it compiles the Triton pass (no autotuning to wait for)
    torch.autograd.backward(cola_matmul(x, A, B), torch.randn(tokens, 768, device='cuda', dtype=dtype))
    torch.cuda.synchronize()
    print(f'the op\'s first call, compilation included: {time.perf_counter() - t0:.2f} s\n')
    print('| shape | d_in | r | d_out | op ms | eager ms | compile ms | products alone ms | op TFLOP/s | '
          'vs eager | vs compile | products / op |')
    print('|---|---|---|---|---|---|---|---|---|---|---|---|')
    for name, (d_in, r, d_out) in SHAPES.items():
        x = torch.randn(tokens, d_in, device='cuda', dtype=dtype, requires_grad=True)
        A = (torch.randn(d_in, r, device='cuda', dtype=dtype) * d_in ** -0.5).requires_grad_()
        B = (torch.randn(r, d_out, device='cuda', dtype=dtype) * r ** -0.5).requires_grad_()
        dy = torch.randn(tokens, d_out, device='cuda', dtype=dtype)
        xd, Ad, Bd = x.detach(), A.detach(), B.detach()
        h, dz = F.silu(xd @ Ad), torch.randn(tokens, r, device='cuda', dtype=dtype)

        def products():
            xd @ Ad, h @ Bd, dy @ Bd.mT, h.mT @ dy, xd.mT @ dz, dz @ Ad.mT

        ms = {}
        for label, fn in [('op', lambda: torch.autograd.backward(cola_matmul(x, A, B), dy)),
                          ('eager', lambda: torch.autograd.backward(eager(x, A, B), dy)),
                          ('compile', lambda: torch.autograd.backward(compiled(x, A, B), dy)),
                          ('products', products)]:
            ms[label] = do_bench(fn, grad_to_none=[x, A, B], return_mode='median')  # no gradient accumulation timed
        flops = 6 * tokens * r * (d_in + d_out)
        print(f"| {name} | {d_in} | {r} | {d_out} | {ms['op']:.3f} | {ms['eager']:.3f} | {ms['compile']:.3f} | "
              f"{ms['products']:.3f} | {flops / ms['op'] / 1e9:.0f} | {ms['eager'] / ms['op']:.2f}x | "
              f"{ms['compile'] / ms['op']:.2f}x | {ms['products'] / ms['op']:.2f} |")


if __name__ == '__main__':
    import sys
    if '--help' in sys.argv or '-h' in sys.argv:
        print(__doc__.strip())
        print('\nusage: python cola_op.py   (needs a CUDA GPU; prints the benchmark table)')
        raise SystemExit(0)
    if not torch.cuda.is_available():
        raise SystemExit("python cola_op.py benchmarks the fused op on a CUDA GPU, and this machine has none")
    benchmark()
