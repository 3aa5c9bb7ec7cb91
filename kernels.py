"""
A fused low-rank matmul for CoLA layers: y = silu(x @ A) @ B, in Triton, with autograd.

    x: (..., d_in)   A: (d_in, r)   B: (r, d_out)   y: (..., d_out)

Forward, with z = x @ A (M, r) and M the number of tokens:
    z = x @ A                       a plain GEMM (cuBLAS); z is what backward keeps
    y = silu(z) @ B                 silu_mm: SiLU applied to each z tile as it is loaded
                                    (the GEMM's prologue), so silu(z) never goes through memory
Backward, given dy (M, d_out), with silu'(z) = s (1 + z (1 - s)), s = sigmoid(z):
    dz = (dy @ B^T) * silu'(z)      mm_dsilu: the derivative applied in the GEMM's fp32 epilogue
    dB = silu(z)^T @ dy             silu_mm again, on the transposed view of z
    dA = x^T @ dz,  dx = dz @ A^T   plain GEMMs, by autograd through z = x @ A
Saved for backward: x (by the first GEMM) and z. Eager PyTorch, silu(x @ A) @ B, keeps z and
silu(z), so the fused op halves the r-wide activation memory.

Dispatch: CUDA tensors run the Triton kernels; CPU tensors run plain PyTorch, or the same Triton
kernels under Triton's interpreter when TRITON_INTERPRET=1 is set before the first launch (how the
tests exercise them without a GPU). All accumulation is fp32. The ops are registered with
torch.library.triton_op, so torch.compile traces into them without graph breaks, and carry FLOP
formulas so FlopCounterMode counts them.

`python kernels.py` benchmarks forward+backward against eager PyTorch and torch.compile (CUDA).
"""

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton
from torch.utils.flop_counter import register_flop_formula

INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'

if INTERPRET:  # the interpreter is slow per program and cannot autotune: one config with big tiles
    CONFIGS = [triton.Config({'BLOCK_M': 64, 'BLOCK_N': 64, 'BLOCK_K': 64, 'GROUP_M': 8})]
else:
    CONFIGS = [
        triton.Config({'BLOCK_M': bm, 'BLOCK_N': bn, 'BLOCK_K': bk, 'GROUP_M': 8}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in [
            (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 128, 32, 4, 4),
            (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (64, 64, 32, 2, 5),
        ]
    ]


# ----------------------------------------------------------------------------- Triton kernels

@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output tile, in groups of GROUP_M row blocks so neighbours share operands in L2."""
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size)
    pid_n = (pid % (GROUP_M * grid_n)) // group_size
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.autotune(configs=CONFIGS, key=['M', 'N', 'K'])
@triton.jit
def _silu_matmul_kernel(z_ptr, w_ptr, y_ptr, M, N, K,
                        stride_zm, stride_zk, stride_wk, stride_wn, stride_ym, stride_yn,
                        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """y (M, N) = silu(z (M, K)) @ w (K, N)."""
    rows, cols = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        z = tl.load(z_ptr + rows[:, None] * stride_zm + ks[None, :] * stride_zk,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0).to(tl.float32)
        a = (z * tl.sigmoid(z)).to(w_ptr.dtype.element_ty)  # silu(0) = 0, so masked lanes add nothing
        w = tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, w, input_precision=PRECISION)
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.autotune(configs=CONFIGS, key=['M', 'N', 'K'])
@triton.jit
def _matmul_dsilu_kernel(g_ptr, w_ptr, z_ptr, dz_ptr, M, N, K,
                         stride_gm, stride_gk, stride_wk, stride_wn, stride_zm, stride_zn,
                         PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """dz (M, N) = (g (M, K) @ w (K, N)) * silu'(z (M, N)); dz has z's strides."""
    rows, cols = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        g = tl.load(g_ptr + rows[:, None] * stride_gm + ks[None, :] * stride_gk,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(g, w, input_precision=PRECISION)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None] * stride_zm + cols[None, :] * stride_zn
    z = tl.load(z_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(z)
    tl.store(dz_ptr + offsets, (acc * s * (1.0 + z * (1.0 - s))).to(dz_ptr.dtype.element_ty), mask=mask)


def _precision():
    # fp32 GEMMs follow PyTorch's switch, full fp32 by default; fp16 and bf16 ignore it.
    return 'tf32' if torch.backends.cuda.matmul.allow_tf32 else 'ieee'


def _use_triton(t):
    return t.is_cuda or (INTERPRET and t.device.type == 'cpu')


def _grid(M, N):
    return lambda meta: (triton.cdiv(M, meta['BLOCK_M']) * triton.cdiv(N, meta['BLOCK_N']),)


# ----------------------------------------------------------------------------- the ops

@triton_op('nanocola::silu_mm', mutates_args=())
def silu_mm(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(z) @ w for z (M, K), w (K, N), any strides."""
    if not _use_triton(z):
        return F.silu(z) @ w
    (M, K), N = z.shape, w.shape[1]
    y = z.new_empty(M, N)
    wrap_triton(_silu_matmul_kernel)[_grid(M, N)](
        z, w, y, M, N, K, z.stride(0), z.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
        PRECISION=_precision())
    return y


@triton_op('nanocola::mm_dsilu', mutates_args=())
def mm_dsilu(g: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """(g @ w) * silu'(z) for g (M, K), w (K, N), z (M, N): the gradient through silu(z)."""
    if not _use_triton(z):
        s = torch.sigmoid(z)
        return (g @ w) * (s * (1 + z * (1 - s)))
    (M, K), N = g.shape, w.shape[1]
    dz = torch.empty_like(z)
    wrap_triton(_matmul_dsilu_kernel)[_grid(M, N)](
        g, w, z, dz, M, N, K, g.stride(0), g.stride(1), w.stride(0), w.stride(1), dz.stride(0), dz.stride(1),
        PRECISION=_precision())
    return dz


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # z and w: never silu(z)


def _silu_mm_backward(ctx, dy):
    z, w = ctx.saved_tensors
    dz = mm_dsilu(dy, w.mT, z) if ctx.needs_input_grad[0] else None
    dw = silu_mm(z.mT, dy) if ctx.needs_input_grad[1] else None
    return dz, dw


silu_mm.register_autograd(_silu_mm_backward, setup_context=_save_inputs)


@register_flop_formula([torch.ops.nanocola.silu_mm, torch.ops.nanocola.mm_dsilu])
def _matmul_flops(a_shape, b_shape, *args, **kwargs):
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def silu_matmul(z, B):
    """silu(z) @ B for z (..., r), B (r, d_out): a CoLA layer's up-projection."""
    y = silu_mm(z.reshape(-1, z.size(-1)), B.to(z.dtype))  # under autocast z is bf16, B an fp32 parameter
    return y.view(*z.shape[:-1], B.size(1))


def cola_matmul(x, A, B):
    """silu(x @ A) @ B for x (..., d_in), A (d_in, r), B (r, d_out); differentiable in all three."""
    return silu_matmul(x @ A, B)


# ----------------------------------------------------------------------------- benchmark

def benchmark(tokens=16384, dtype=torch.bfloat16):
    """Forward+backward time of the fused op, eager PyTorch and torch.compile at CoLA's shapes."""
    from triton.testing import do_bench

    def eager(x, A, B):
        return F.silu(x @ A) @ B

    compiled = torch.compile(eager)
    shapes = {  # (d_in, r, d_out): attention d -> r -> d; MLP d -> r -> f and f -> r -> d
        '130m attn': (768, 256, 768), '130m mlp up': (768, 256, 2048), '130m mlp down': (2048, 256, 768),
        '1b attn': (2048, 512, 2048), '1b mlp up': (2048, 512, 5461), '1b mlp down': (5461, 512, 2048),
        '7b attn': (4096, 1024, 4096), '7b mlp up': (4096, 1024, 11008), '7b mlp down': (11008, 1024, 4096),
    }
    print(f'forward+backward, {tokens} tokens, {dtype}, {torch.cuda.get_device_name()}')
    print('| shape | d_in | r | d_out | fused ms | eager ms | compile ms | fused TFLOP/s | vs eager | vs compile |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for name, (d_in, r, d_out) in shapes.items():
        x = torch.randn(tokens, d_in, device='cuda', dtype=dtype, requires_grad=True)
        A = (torch.randn(d_in, r, device='cuda', dtype=dtype) * d_in ** -0.5).requires_grad_()
        B = (torch.randn(r, d_out, device='cuda', dtype=dtype) * r ** -0.5).requires_grad_()
        dy = torch.randn(tokens, d_out, device='cuda', dtype=dtype)
        ms = {}
        for label, fn in [('fused', cola_matmul), ('eager', eager), ('compile', compiled)]:
            ms[label] = do_bench(lambda: torch.autograd.backward(fn(x, A, B), dy), return_mode='median')
        flops = 6 * tokens * r * (d_in + d_out)
        print(f"| {name} | {d_in} | {r} | {d_out} | {ms['fused']:.3f} | {ms['eager']:.3f} | {ms['compile']:.3f} | "
              f"{flops / ms['fused'] / 1e9:.0f} | {ms['eager'] / ms['fused']:.2f}x | {ms['compile'] / ms['fused']:.2f}x |")


if __name__ == '__main__':
    benchmark()
