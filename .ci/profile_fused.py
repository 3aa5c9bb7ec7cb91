"""
Where the fused op's time goes on a CUDA GPU, at the 130m attention shape (16k tokens, bf16): the op, the
Triton kernel called directly, the kernel replayed in a CUDA graph (no launch cost) and eager PyTorch, each
timed on the GPU (do_bench) and on the CPU side (50 calls, no synchronisation), then the profiler's table.
On an H200 on 2026-12-04 the op took 1.3 ms forward+backward at this shape where eager took 0.25 ms
(python kernels.py): this says whether launch costs or the kernels are to blame. Run by .ci/gpu_check.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import torch
import torch.nn.functional as F
from triton.testing import do_bench
import kernels

tokens, d_in, r, d_out = 16384, 768, 256, 768
dt = torch.bfloat16
x = torch.randn(tokens, d_in, device='cuda', dtype=dt, requires_grad=True)
A = (torch.randn(d_in, r, device='cuda', dtype=dt) * d_in ** -0.5).requires_grad_()
B = (torch.randn(r, d_out, device='cuda', dtype=dt) * r ** -0.5).requires_grad_()
z = (x @ A).detach()
dy = torch.randn(tokens, d_out, device='cuda', dtype=dt)
y = torch.empty(tokens, d_out, device='cuda', dtype=dt)

def direct():  # the Triton kernel alone, no torch.library op
    kernels._gemm(z, B.detach(), z, y, silu_prologue=True, dsilu_epilogue=False)

cases = {
    'silu_mm op fwd': lambda: kernels.silu_mm(z, B.detach()),
    'direct kernel fwd': direct,
    'eager silu(z)@B fwd': lambda: F.silu(z) @ B.detach(),
    'fused fwd+bwd': lambda: torch.autograd.backward(kernels.cola_matmul(x, A, B), dy),
    'eager fwd+bwd': lambda: torch.autograd.backward(F.silu(x @ A) @ B, dy),
}
for name, fn in cases.items():
    fn(); torch.cuda.synchronize()
    gpu_ms = do_bench(fn, return_mode='median')
    t0 = time.perf_counter()
    for _ in range(50):
        fn()
    cpu_ms = (time.perf_counter() - t0) / 50 * 1e3
    torch.cuda.synchronize()
    print(f'{name}: do_bench {gpu_ms:.3f} ms, CPU-side per call (no sync) {cpu_ms:.3f} ms')
print('best config:', kernels._gemm_kernel.best_config)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    direct()
print('direct kernel in a CUDA graph:', f"{do_bench(g.replay, return_mode='median'):.3f} ms")
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        cases['fused fwd+bwd']()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by='cpu_time_total', row_limit=18, max_name_column_width=60))
