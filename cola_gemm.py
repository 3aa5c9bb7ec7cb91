"""
The fused low-rank matmul: the CoLA layers that read one x (q, k, v; gate, up; or o, down alone), with SiLU in the
epilogues of Triton GEMMs. (Named so as not to be `kernels`: a top-level kernels.py would shadow the Hugging Face
package of that name, which transformers imports.)

    x: (M, d_in)   A = [A_1 | ... | A_n]: (d_in, R)   B_i: (r_i, d_out_i)   R = r_1 + ... + r_n   M tokens

Forward:   z = x @ A,  h = silu(z)              GEMM 1 (gemm_silu): its epilogue writes z, kept for backward, and
                                                h, a temporary: one sigmoid per value, no pass of its own
           y_i = h_i @ B_i                      cuBLAS (h_i: layer i's r_i columns of h)
Backward:  dz_i = (dy_i @ B_i^T) * silu'(z_i)   GEMM 1 again, layer by layer (gemm_silu_grad): the epilogue loads
           h_i = silu(z_i)                      z_i's tile and writes dz_i and h_i, never the product itself;
                                                silu'(z) = s (1 + z (1 - s)), s = sigmoid(z)
           dB_i = h_i^T @ dy_i,  dA = x^T @ dz  sums over all M tokens into small outputs (tn_matmul): GEMM 2, split-K,
                                                where the output has fewer tiles than the GPU has SMs (130m's dB: 12
                                                tiles of 128 x 128 for 132 SMs), else cuBLAS
           dx = dz @ A^T                        cuBLAS

Against cola_op.py (cuBLAS for every product, one Triton pass over z and g in backward), this saves that pass and the
forward's SiLU pass: g never reaches memory. Both keep only x and z. Whether it pays depends on the GEMMs keeping
cuBLAS's pace, which only a GPU can tell.

How the GEMMs are built. GEMM 1 is persistent: as many programs as the GPU has SMs (or fewer tiles), each walking the
output's (BM, BN) tiles in turn, so a grid of more tiles than SMs runs in one wave with no launch tail. With tensor
descriptors (`tl.make_tensor_descriptor`, Hopper's TMA: bulk asynchronous tile loads, bounds checked in hardware;
Triton 3.4+) the streamed operand, x or dy, is read through one when its rows are 16-byte aligned; the weights, small
and L2-resident, through plain loads. GEMM 2 splits the long sum: split s sums its share of the tokens into an fp32
partial, and one sum over the partials (deterministic: no atomics) gives the result. CONFIGS holds the tile
shapes, at most six; each is compiled and checked on its own, and a configuration that fails is set aside.

Chosen by measurement: the model (model.fused_layers) takes this path in training for a shape and micro-batch only
where FASTER, a table committed from one GPU measurement (`python cola_gemm.py`), names a configuration that beat
cola_op.py there by more than 2% and twice the timings' spread; everywhere else (other GPUs and micro-batches,
evaluation and generation, CoLA-M), cola_op.py's path. No GPU has run it yet, FASTER is
empty, and every shape takes cola_op.py.

Checked against float64 under Triton's interpreter (TRITON_INTERPRET=1 before the first launch) in fp32 and fp16,
ragged sizes included (tests/test_cola_gemm.py); the interpreter computes bf16 products wrongly, so bf16 is checked
on a GPU, by the benchmark, before any timing.
"""

import os
import sys
import time
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

import cola_op

INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'
INTERPRETER_SMS = 8  # the interpreter's stand-in for a GPU's SM count: small, so that the tests' small shapes split


class Config(NamedTuple):
    block_m: int  # output tile rows (tokens in GEMM 1)
    block_n: int  # output tile columns
    block_k: int  # the sum's step
    warps: int
    stages: int  # software-pipeline depth of the K loop
    tma: bool  # GEMM 1 reads x / dy through a tensor descriptor, where Triton has them and the rows are aligned
    split_k: bool  # dB and dA through GEMM 2, split over the tokens, where their outputs have fewer tiles than SMs


CONFIGS = {  # named by their loads (p: plain, tma: a tensor descriptor), tiles and split-K; at most six
    'p64': Config(64, 64, 32, 4, 3, tma=False, split_k=False),
    'p64-splitk': Config(64, 64, 32, 4, 3, tma=False, split_k=True),
    'p128': Config(128, 128, 64, 8, 3, tma=False, split_k=False),
    'tma128': Config(128, 128, 64, 8, 3, tma=True, split_k=False),
    'tma128-splitk': Config(128, 128, 64, 8, 3, tma=True, split_k=True),
    'tma128x64-splitk': Config(128, 64, 64, 4, 4, tma=True, split_k=True),
}

# {(GPU name, dtype, tokens, d_in, ((r_1, d_out_1), ...)): (configuration, speed-up over cola_op.py)}: the shapes and
# micro-batches where one GPU measurement found the fused path faster (python cola_gemm.py prints it); none yet.
FASTER = {}

POISON = False  # the benchmark's check sets it: new outputs start as NaN, so that a value never written shows


# ----------------------------------------------------------------------------- the kernels

@triton.jit
def _gemm_silu_kernel(a_ptr, b_ptr, z_ptr, out_ptr, h_ptr, M, N, K, stride_am, stride_bk, stride_bn, stride_out,
                      GRAD: tl.constexpr, TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """GEMM 1, persistent: the programs take the (BM, BN) tiles of the (M, N) output in turn. Per tile
    acc = a @ b in fp32 (a (M, K) with unit column stride, b (K, N) of any strides), then the epilogue, on outputs
    whose rows are stride_out apart (column slices of (M, R) tensors):
        GRAD False: acc is z;  writes out = z and h = silu(z)
        GRAD True:  acc is g;  loads z, writes out = dz = g * silu'(z) and h = silu(z)
    (z_ptr is read only when GRAD.)"""
    tiles_n = tl.cdiv(N, BN)
    if TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BM, BK])
    for tile in range(tl.program_id(0), tl.cdiv(M, BM) * tiles_n, tl.num_programs(0)):
        rm = (tile // tiles_n) * BM + tl.arange(0, BM)
        rn = (tile % tiles_n) * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            rk = k + tl.arange(0, BK)
            if TMA:
                a = a_desc.load([(tile // tiles_n) * BM, k])  # out-of-bounds rows and columns read as zeros
            else:
                a = tl.load(a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :],
                            mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
        offsets = rm[:, None].to(tl.int64) * stride_out + rn[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
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


@triton.jit
def _split_k_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, k_per_split,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """GEMM 2: one (BM, BN) tile of split s's partial product a[:, ks] @ b[ks, :] for a (M, K) and b (K, N) of any
    strides, ks split s's k_per_split of the K columns (whole steps of BK), in fp32 into c[s] of c (splits, M, N)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    start = tl.program_id(2) * k_per_split
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(start, tl.minimum(start + k_per_split, K), BK):
        rk = k + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :].to(tl.int64) * stride_ak,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None].to(tl.int64) * stride_bk + rn[None, :] * stride_bn,
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + tl.program_id(2).to(tl.int64) * M * N + rm[:, None] * N + rn[None, :], acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def split_size(K, M, N, config, sms):
    """How many of the K summed rows each split of GEMM 2 takes for an (M, N) output: enough splits for every SM to
    have a tile, each of whole steps of BK and at least four of them; K (one split: cuBLAS) where the output's tiles
    alone fill the SMs or the configuration does not split."""
    tiles = triton.cdiv(M, config.block_m) * triton.cdiv(N, config.block_n)
    if not config.split_k or tiles >= sms:
        return K
    splits = min(triton.cdiv(sms, tiles), triton.cdiv(K, 4 * config.block_k))
    return triton.cdiv(triton.cdiv(K, splits), config.block_k) * config.block_k  # rounded up to whole steps of BK


def _sms(device):
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == 'cuda' else INTERPRETER_SMS


def _empty_or_nan(rows, cols, like):
    empty = torch.empty(rows, cols, device=like.device, dtype=like.dtype)
    return empty.fill_(float('nan')) if POISON else empty


def _tma(a, config):
    """Whether GEMM 1 reads a through a tensor descriptor: the configuration asks, Triton has them, the GPU is a
    Hopper or later (or the interpreter runs), and a's rows start on 16-byte boundaries."""
    if not (config.tma and hasattr(tl, 'make_tensor_descriptor')):
        return False
    if a.is_cuda:
        if torch.cuda.get_device_capability(a.device)[0] < 9:
            return False
        device = a.device  # the descriptor's scratch memory; the lambda must not hold a itself alive
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))
    return a.stride(1) == 1 and (a.stride(0) * a.element_size()) % 16 == 0 and a.data_ptr() % 16 == 0


def _launch_gemm_silu(a, b, z, out, h, config):
    """GEMM 1 for a (M, K) with unit column stride and b (K, N), into out and h (and reading z when given: the
    backward), the three with one row stride."""
    (M, K), N = a.shape, b.shape[1]
    assert out.stride(1) == h.stride(1) == 1 and out.stride(0) == h.stride(0)
    assert z is None or z.stride() == out.stride()
    tiles = triton.cdiv(M, config.block_m) * triton.cdiv(N, config.block_n)
    _gemm_silu_kernel[(min(tiles, _sms(a.device)),)](  # persistent: no more programs than SMs
        a, b, out if z is None else z, out, h, M, N, K, a.stride(0), b.stride(0), b.stride(1), out.stride(0),
        GRAD=z is not None, TMA=_tma(a, config), BM=config.block_m, BN=config.block_n, BK=config.block_k,
        num_warps=config.warps, num_stages=config.stages)


# ----------------------------------------------------------------------------- the ops (opaque to torch.compile)

@torch.library.custom_op('nanocola::gemm_silu', mutates_args=())
def gemm_silu(x: torch.Tensor, A: torch.Tensor, config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(z, h) = (x @ A, silu(x @ A)) for x (M, d_in), A (d_in, R): GEMM 1 with SiLU in its epilogue."""
    x = x if x.stride(1) == 1 else x.contiguous()
    z, h = _empty_or_nan(x.shape[0], A.shape[1], x), _empty_or_nan(x.shape[0], A.shape[1], x)
    _launch_gemm_silu(x, A, None, z, h, CONFIGS[config])
    return z, h


@torch.library.custom_op('nanocola::gemm_silu_grad', mutates_args=())
def gemm_silu_grad(dys: list[torch.Tensor], Bs: list[torch.Tensor], z: torch.Tensor,
                   config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dz, h), layer by layer into layer i's columns: dz_i = (dy_i @ B_i^T) * silu'(z_i), h_i = silu(z_i), for
    dy_i (M, d_out_i), B_i (r_i, d_out_i), z (M, R): GEMM 1 with the SiLU derivative in its epilogue."""
    z = z.contiguous()
    dz, h = _empty_or_nan(*z.shape, z), _empty_or_nan(*z.shape, z)
    start = 0
    for dy, B in zip(dys, Bs):
        columns = slice(start, start + B.shape[0])
        _launch_gemm_silu(dy if dy.stride(1) == 1 else dy.contiguous(), B.mT, z[:, columns], dz[:, columns],
                          h[:, columns], CONFIGS[config])
        start += B.shape[0]
    return dz, h


@torch.library.custom_op('nanocola::tn_matmul', mutates_args=())
def tn_matmul(a: torch.Tensor, b: torch.Tensor, config: str) -> torch.Tensor:
    """a^T @ b for a (K, M), b (K, N), K the tokens, M and N weight-sized: a weight's gradient. Split over K (GEMM 2)
    where the configuration says so and the output has fewer tiles than the GPU has SMs; else cuBLAS."""
    c = CONFIGS[config]
    (K, M), N = a.shape, b.shape[1]
    k_per_split = split_size(K, M, N, c, _sms(a.device)) if a.is_cuda or INTERPRET else K
    if k_per_split >= K:
        return a.mT @ b
    splits = triton.cdiv(K, k_per_split)
    partials = torch.empty(splits, M, N, device=a.device, dtype=torch.float32)
    at = a.mT  # (M, K)
    _split_k_kernel[(triton.cdiv(M, c.block_m), triton.cdiv(N, c.block_n), splits)](
        at, b, partials, M, N, K, at.stride(0), at.stride(1), b.stride(0), b.stride(1), k_per_split,
        BM=c.block_m, BN=c.block_n, BK=c.block_k, num_warps=c.warps, num_stages=c.stages)
    return partials.sum(0).to(a.dtype)  # one reduction in a fixed order: the same bits every run


@gemm_silu.register_fake
def _(x, A, config):
    return x.new_empty(x.shape[0], A.shape[1]), x.new_empty(x.shape[0], A.shape[1])


@gemm_silu_grad.register_fake
def _(dys, Bs, z, config):
    return z.new_empty(z.shape), z.new_empty(z.shape)


@tn_matmul.register_fake
def _(a, b, config):
    return a.new_empty(a.shape[1], b.shape[1])


@register_flop_formula(torch.ops.nanocola.gemm_silu)
def _gemm_silu_flops(x_shape, A_shape, *args, **kwargs):
    return 2 * x_shape[0] * x_shape[1] * A_shape[1]


@register_flop_formula(torch.ops.nanocola.gemm_silu_grad)
def _gemm_silu_grad_flops(dys_shapes, Bs_shapes, z_shape, *args, **kwargs):
    return sum(2 * dy[0] * dy[1] * B[0] for dy, B in zip(dys_shapes, Bs_shapes))


@register_flop_formula(torch.ops.nanocola.tn_matmul)
def _tn_matmul_flops(a_shape, b_shape, *args, **kwargs):
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


class FusedCoLA(torch.autograd.Function):
    """y_i = silu(x @ A_i) @ B_i for the n layers that read x (M, d_in), A = [A_1 | ... | A_n]; keeps x and z."""

    @staticmethod
    def forward(ctx, x, A, config, *Bs):
        z, h = gemm_silu(x, A, config)  # (M, R) each
        ctx.save_for_backward(x, A, z, *Bs)
        ctx.config = config
        return tuple(h_i @ B for h_i, B in zip(h.split([B.shape[0] for B in Bs], dim=1), Bs))

    @staticmethod
    def backward(ctx, *dys):
        x, A, z, *Bs = ctx.saved_tensors
        dz, h = gemm_silu_grad(list(dys), Bs, z, ctx.config)  # (M, R) each
        dBs = [tn_matmul(h_i, dy, ctx.config) for h_i, dy in zip(h.split([B.shape[0] for B in Bs], dim=1), dys)]
        dx = dz @ A.mT if ctx.needs_input_grad[0] else None
        dA = tn_matmul(x, dz, ctx.config) if ctx.needs_input_grad[1] else None
        return dx, dA, None, *dBs


def compute_dtype(x):
    """The dtype the layer's products run in: autocast's where it is on (train.py's bf16), else x's."""
    return torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype


def cola_layers(x, A, Bs, config):
    """[silu(x @ A_i) @ B_i for each layer] through FusedCoLA, for x (..., d_in), A (d_in, R) the layers' A's side by
    side, Bs their B's; `config` one of CONFIGS."""
    dtype = compute_dtype(x)
    ys = FusedCoLA.apply(x.reshape(-1, x.shape[-1]).to(dtype), A.to(dtype), config, *(B.to(dtype) for B in Bs))
    return [y.view(*x.shape[:-1], y.shape[1]) for y in ys]


@torch.compiler.assume_constant_result
def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == 'cuda' else device.type


def chosen(x, d_in, shapes):
    """The configuration FASTER names for these layers ((r_i, d_out_i) each, reading d_in) at x's GPU, dtype and
    number of tokens, in training (FASTER's timings are forward and backward), or None: cola_op.py's path."""
    if not FASTER or not torch.is_grad_enabled() or not (x.is_cuda or INTERPRET):
        return None
    dtype = str(compute_dtype(x)).removeprefix('torch.')
    entry = FASTER.get((device_name(x.device), dtype, x.numel() // x.shape[-1], d_in, tuple(map(tuple, shapes))))
    return entry[0] if entry else None


# ----------------------------------------------------------------------------- the GPU stage: check, time, choose

MODELS = {  # d, f, r and the tokens of one micro-batch (config/cola_*.py: batch_size x block_size 256)
    '60m': (512, 1376, 128, 64 * 256), '130m': (768, 2048, 256, 64 * 256), '350m': (1024, 2736, 256, 32 * 256),
    '1b': (2048, 5461, 512, 16 * 256), '7b': (4096, 11008, 1024, 8 * 256),
}


def layer_groups(d, f, r):
    """The block's groups of CoLA layers that read one input (model.fan_out): d_in and each layer's (r, d_out)."""
    return {'q,k,v': (d, [(r, d)] * 3), 'o': (d, [(r, d)]), 'gate,up': (d, [(r, f)] * 2), 'down': (f, [(r, d)])}


def op_layers(x, A, Bs):
    """cola_op.py's path, the model's today: one down product (model.shared_down), then each up-product's op."""
    return [cola_op.silu_matmul(z, B) for z, B in zip((x @ A).split([B.shape[0] for B in Bs], dim=-1), Bs)]


def eager_layers(x, A, Bs):
    return [F.silu(z) @ B for z, B in zip((x @ A).split([B.shape[0] for B in Bs], dim=-1), Bs)]


class CompilerCoLA(torch.autograd.Function):
    """The same layers written for the compiler to fuse: aten products and elementwise work, keeping x and z, for
    torch.compile(mode='max-autotune-no-cudagraphs'), whose Triton GEMM templates may take the SiLU as an epilogue."""

    @staticmethod
    def forward(ctx, x, A, *Bs):
        z = x @ A
        ctx.save_for_backward(x, A, z, *Bs)
        return tuple(F.silu(z_i) @ B for z_i, B in zip(z.split([B.shape[0] for B in Bs], dim=1), Bs))

    @staticmethod
    def backward(ctx, *dys):
        x, A, z, *Bs = ctx.saved_tensors
        s = torch.sigmoid(z)
        h, dsilu = z * s, s * (1 + z * (1 - s))
        ranks = [B.shape[0] for B in Bs]
        dz = torch.cat([dy @ B.mT for dy, B in zip(dys, Bs)], dim=1) * dsilu
        return dz @ A.mT, x.mT @ dz, *(h_i.mT @ dy for h_i, dy in zip(h.split(ranks, dim=1), dys))


def layer_inputs(tokens, d_in, shapes, dtype, device, seed=0):
    """x, A, Bs (leaves that want gradients) and the upstream gradients dys at one group's shape."""
    g = torch.Generator(device).manual_seed(seed)
    R = sum(r for r, _ in shapes)
    x = torch.randn(tokens, d_in, device=device, generator=g).to(dtype).requires_grad_()
    A = (torch.randn(d_in, R, device=device, generator=g) * d_in ** -0.5).to(dtype).requires_grad_()
    Bs = [(torch.randn(r, d_out, device=device, generator=g) * r ** -0.5).to(dtype).requires_grad_()
          for r, d_out in shapes]
    dys = [torch.randn(tokens, d_out, device=device, generator=g).to(dtype) for _, d_out in shapes]
    return x, A, Bs, dys


def check(config, tokens, d_in, shapes, dtype, device):
    """The fused layers' outputs and gradients against float64, every output first filled with NaN: the largest
    error over the largest reference value, per output and gradient (nan where a value was never written)."""
    global POISON
    x, A, Bs, dys = layer_inputs(tokens, d_in, shapes, dtype, device)
    POISON = True
    try:
        ys = cola_layers(x, A, Bs, config)
        torch.autograd.backward(ys, dys)
    finally:
        POISON = False
    x64, A64, *B64s = (t.detach().double().requires_grad_() for t in (x, A, *Bs))
    references = eager_layers(x64, A64, B64s)
    torch.autograd.backward(references, [dy.double() for dy in dys])
    got, want = [*ys, x.grad, A.grad, *(B.grad for B in Bs)], [*references, x64.grad, A64.grad, *(B.grad for B in B64s)]
    return max(((g.double() - w).abs().max() / w.abs().max()).item() for g, w in zip(got, want))


def timer(device):
    """ms(fn) -> (median, spread): do_bench's median and the 20-80% quantile range on a GPU (the gradients cleared
    by fn itself), a plain median of 3 calls under the interpreter."""
    if device == 'cuda':
        from triton.testing import do_bench

        def ms(fn):
            q20, median, q80 = do_bench(fn, rep=60, warmup=15, quantiles=[0.2, 0.5, 0.8])
            return median, q80 - q20
        return ms

    def ms(fn):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        return times[1], times[2] - times[0]
    return ms


def check_configs(dtype, device, dry_run):
    """Each configuration compiled and checked against float64 (check) at 4,099 tokens and at the 1b MLP's 5,461:
    ragged everywhere, rows not 16-byte aligned for TMA. Prints a row each; returns the working ones."""
    checks = ([(37, 40, [(16, 24), (16, 24)])] if dry_run else
              [(4099, 768, [(256, 768)] * 3), (4099, 5461, [(512, 2048)])])
    working = {}
    print('\n| configuration | tiles (BM, BN, BK) | warps, stages | TMA | split-K | compile and check, s | '
          'error vs float64 (max / max) |')
    print('|---|---|---|---|---|---|---|')
    for label, c in CONFIGS.items():
        t0 = time.time()
        try:
            error = max(check(label, tokens, d_in, shapes, dtype, device) for tokens, d_in, shapes in checks)
            verdict = f'{error:.1e}'
            if error < (2e-2 if dtype == torch.bfloat16 else 1e-4):  # nan fails too
                working[label] = c
            else:
                verdict += ': WRONG, set aside'
        except Exception as e:  # a configuration this GPU or Triton cannot compile: set aside, the others go on
            lines = str(e).strip().splitlines()
            verdict = f'failed: {type(e).__name__}: {lines[0][:120] if lines else ""}'
        print(f'| {label} | {c.block_m}, {c.block_n}, {c.block_k} | {c.warps}, {c.stages} | {c.tma} | {c.split_k} | '
              f'{time.time() - t0:.1f} | {verdict} |', flush=True)
    return working


def time_group(tokens, d_in, shapes, working, dtype, device, ms, compile_it):
    """One layer group's forward+backward timings: {variant: (ms, spread)} for the six products alone, cola_op.py's
    path, eager PyTorch, each working configuration and (compile_it) torch.compile max-autotune of CompilerCoLA; and
    CUDA-graph timings of the op, eager and the fastest configuration (a string)."""
    x, A, Bs, dys = layer_inputs(tokens, d_in, shapes, dtype, device)

    def step(layers):  # what is timed: forward and backward, the gradients cleared first (none accumulated)
        def fn():
            for t in (x, A, *Bs):
                t.grad = None
            torch.autograd.backward(layers(x, A, Bs), dys)
        return fn

    with torch.no_grad():
        xd, Ad, Bds = x.detach(), A.detach(), [B.detach() for B in Bs]
        z = xd @ Ad  # also dz's stand-in: the products' floor does not depend on the values
        hs = F.silu(z).split([B.shape[0] for B in Bs], dim=1)

    def products():  # x @ A, h_i @ B_i, dy_i @ B_i^T, h_i^T @ dy_i, x^T @ dz, dz @ A^T
        with torch.no_grad():
            xd @ Ad
            for h_i, B, dy in zip(hs, Bds, dys):
                h_i @ B, dy @ B.mT, h_i.mT @ dy
            xd.mT @ z, z @ Ad.mT

    t = {'products': ms(products), 'op': ms(step(op_layers)), 'eager': ms(step(eager_layers))}
    for label in working:
        t[label] = ms(step(lambda x, A, Bs, label=label: cola_layers(x, A, Bs, label)))
    if compile_it:
        torch._dynamo.reset()  # one fresh static-shape compile per group, never a dynamic-shape graph reused
        try:
            compiled = torch.compile(lambda x, A, Bs: CompilerCoLA.apply(x, A, *Bs), mode='max-autotune-no-cudagraphs',
                                     dynamic=False)
            t['compile'] = ms(step(compiled))
        except Exception as e:
            print(f'torch.compile max-autotune failed: {type(e).__name__}: {e}'[:300], flush=True)
    best = min(working, key=lambda label: t[label][0]) if working else None
    graphs = '-'
    if device == 'cuda' and best:
        from triton.testing import do_bench_cudagraph
        try:
            graphs = ' / '.join(f'{do_bench_cudagraph(step(fn), rep=60):.3f}' for fn in
                                (op_layers, eager_layers, lambda x, A, Bs: cola_layers(x, A, Bs, best)))
        except Exception as e:
            graphs = f'failed: {type(e).__name__}'
    return t, best, graphs


def stage(budget_s=170, dry_run=False):
    """The GPU stage: the device's facts; each configuration compiled and checked in bf16 against float64 with
    poisoned outputs (check_configs); then every model's four layer groups at its micro-batch (time_group), each
    timed variant printed with the fused path's choice; last, FASTER for cola_gemm.py. torch.compile max-autotune
    only for q, k, v at 60m-350m while the budget lasts (each compile takes tens of seconds).
    dry_run: the same steps at tiny shapes under the interpreter on the CPU (fp32; timings that mean nothing)."""
    end = time.time() + budget_s
    device = 'cpu' if dry_run else 'cuda'
    dtype = torch.float32 if dry_run else torch.bfloat16
    name = device_name(torch.device(device))
    print(f'{name}, {_sms(torch.device(device))} SMs, torch {torch.__version__}, triton {triton.__version__}, {dtype}, '
          f'tensor descriptors: {hasattr(tl, "make_tensor_descriptor")}', flush=True)
    working = check_configs(dtype, device, dry_run)
    ms = timer(device)
    faster = {}
    print('\n| model | layers | tokens | products ms | op ms | eager ms | best fused ms (config) | fused / op | '
          'compile max-autotune ms | graphs: op / eager / fused ms | chosen |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for model, (d, f, r, tokens) in ({'tiny': (32, 48, 16, 40)} if dry_run else MODELS).items():
        for group, (d_in, shapes) in layer_groups(d, f, r).items():
            if time.time() > end - 5:
                print(f'| {model} | {group} | not run: the budget is spent |')
                continue
            compile_it = (not dry_run and group == 'q,k,v' and model in ('60m', '130m', '350m')
                          and time.time() < end - 60)
            t, best, graphs = time_group(tokens, d_in, shapes, working, dtype, device, ms, compile_it)
            (op_ms, op_spread), choice, fused_text = t['op'], 'op', '- | -'
            if best:
                fused_ms, fused_spread = t[best]
                fused_text = f'{fused_ms:.3f} ({best}) | {op_ms / fused_ms:.2f}x'
                if op_ms / fused_ms > 1.02 and op_ms - fused_ms > 2 * max(op_spread, fused_spread):
                    choice = best
                    key = (name, str(dtype).removeprefix('torch.'), tokens, d_in, tuple(map(tuple, shapes)))
                    faster[key] = (best, round(op_ms / fused_ms, 3))
            compiled = f"{t['compile'][0]:.3f}" if 'compile' in t else '-'
            print(f"| {model} | {group} | {tokens} | {t['products'][0]:.3f} | {op_ms:.3f} ± {op_spread:.3f} | "
                  f"{t['eager'][0]:.3f} | {fused_text} | {compiled} | {graphs} | {choice} |", flush=True)
    print('\nFASTER for cola_gemm.py (where the fused path beat the op by more than 2% and twice the spread):')
    entries = ''.join(f'\n    {key!r}: {value!r},' for key, value in faster.items())
    print('FASTER = {' + entries + ('\n}' if faster else '}'))
    return faster


if __name__ == '__main__':
    if '--help' in sys.argv or '-h' in sys.argv:
        print(__doc__.strip())
        print('\nusage: python cola_gemm.py [--budget_s=170]   (a CUDA GPU: check, time and choose, printing FASTER)\n'
              '       TRITON_INTERPRET=1 python cola_gemm.py --dry_run   (the same steps at tiny shapes on the CPU)')
        raise SystemExit(0)
    budget = next((float(a.split('=', 1)[1]) for a in sys.argv[1:] if a.startswith('--budget_s=')), 170.0)
    if '--dry_run' in sys.argv:
        if not INTERPRET:
            raise SystemExit("--dry_run runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1")
        stage(budget, dry_run=True)
    elif not torch.cuda.is_available():
        raise SystemExit("python cola_gemm.py benchmarks the fused GEMMs on a CUDA GPU, and this machine has none "
                         "(TRITON_INTERPRET=1 python cola_gemm.py --dry_run runs its steps at tiny shapes on the CPU)")
    else:
        stage(budget)
