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


@triton.autotune(configs=CONFIGS, key=['M', 'N', 'K', 'SILU_PROLOGUE', 'DSILU_EPILOGUE'])
@triton.jit
def _gemm_kernel(a_ptr, b_ptr, z_ptr, c_ptr, M, N, K,
                 stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 SILU_PROLOGUE: tl.constexpr, DSILU_EPILOGUE: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """c (M, N) = silu(a (M, K)) @ b (K, N) with SILU_PROLOGUE, or (a @ b) * silu'(z (M, N)) with
    DSILU_EPILOGUE (z has c's strides); fp32 accumulation."""
    rows, cols = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        if SILU_PROLOGUE:  # silu(0) = 0, so masked lanes still add nothing
            a = a.to(tl.float32)
            a = (a * tl.sigmoid(a)).to(b_ptr.dtype.element_ty)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision=PRECISION)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None] * stride_cm + cols[None, :] * stride_cn
    if DSILU_EPILOGUE:
        z = tl.load(z_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(z)
        acc = acc * s * (1.0 + z * (1.0 - s))
    tl.store(c_ptr + offsets, acc.to(c_ptr.dtype.element_ty), mask=mask)


def _precision():
    # fp32 GEMMs follow PyTorch's switch, full fp32 by default; fp16 and bf16 ignore it.
    return 'tf32' if torch.backends.cuda.matmul.allow_tf32 else 'ieee'


def _use_triton(t):
    return t.is_cuda or (INTERPRET and t.device.type == 'cpu')


def _gemm(a, b, z, c, silu_prologue, dsilu_epilogue):
    (M, K), N = a.shape, b.shape[1]
    grid = lambda meta: (triton.cdiv(M, meta['BLOCK_M']) * triton.cdiv(N, meta['BLOCK_N']),)  # noqa: E731
    wrap_triton(_gemm_kernel)[grid](
        a, b, z, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        SILU_PROLOGUE=silu_prologue, DSILU_EPILOGUE=dsilu_epilogue, PRECISION=_precision())
    return c


# ----------------------------------------------------------------------------- the ops

@triton_op('nanocola::silu_mm', mutates_args=())
def silu_mm(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(z) @ w for z (M, K), w (K, N), any strides."""
    if not _use_triton(z):
        return F.silu(z) @ w
    y = z.new_empty(z.shape[0], w.shape[1])
    return _gemm(z, w, z, y, silu_prologue=True, dsilu_epilogue=False)  # the kernel's z is unread here


@triton_op('nanocola::mm_dsilu', mutates_args=())
def mm_dsilu(g: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """(g @ w) * silu'(z) for g (M, K), w (K, N), z (M, N): the gradient through silu(z)."""
    if not _use_triton(z):
        s = torch.sigmoid(z)
        return (g @ w) * (s * (1 + z * (1 - s)))
    return _gemm(g, w, z, torch.empty_like(z), silu_prologue=False, dsilu_epilogue=True)


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


# ----------------------------------------------------------------------------- benchmarks

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
    if not torch.cuda.is_available():
        raise SystemExit("python kernels.py benchmarks the Triton kernels on a CUDA GPU, and this machine has none")
    benchmark()
