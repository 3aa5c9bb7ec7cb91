"""
ELAS: a squared-ReLU MLP whose hidden activation is 2:4 sparse.

"ELAS: Efficient Pre-Training of Low-Rank LLMs via 2:4 Activation Sparsity" (arXiv 2605.03667). No
official code was found; this follows the first author's development code (github JiaxiLi1/Lora-init,
which predates the paper). SwiGLU's MLP, down(silu(gate(x)) * up(x)), becomes

    h = relu(up(x))^2              (..., f'),  f' = int(1.5 f) rounded down to a multiple of 4
    y = down(sparsify24(h))        in each group of 4 hidden features only the 2 largest survive

with no gate, so that the parameters stay about SwiGLU's (two matrices 1.5x as wide instead of three).
Sparsity is off for a dense warm-up (train.py's elas_warmup_iters optimizer steps, the paper's 1,000 of
10,000), then on. Backward is straight-through: the gradient passes the mask as if nothing was zeroed.

On CUDA in fp16/bf16 (Ampere or newer) the product of the sparse activation with down_proj's first
factor runs through PyTorch's semi-structured sparse kernels (sparse24_matmul); elsewhere it is a
dense product with the same numbers. Our choices: the width rounded down to a multiple of 4; the sparse
product only for CoLA layers, its operands padded with zeros to multiples of 64; dense backward.

`python bench.py --elas_sparse` times the FFN with the sparse product against the same FFN computed dense (CUDA).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def elas_width(intermediate_size):
    """ELAS's hidden width: 1.5x SwiGLU's (which has a gate too), rounded down to a multiple of 4."""
    return int(1.5 * intermediate_size) // 4 * 4


def sparsify24(h):
    """In each group of 4 consecutive features of h (..., n), keep the 2 of largest magnitude (ties: the
    first) and zero the other 2. Backward is straight-through: the gradient passes every position."""
    a = h.unflatten(-1, (-1, 4)).abs().unsqueeze(-1)  # (..., n / 4, 4, 1)
    first = torch.arange(4, device=h.device)[:, None] < torch.arange(4, device=h.device)  # (4, 4): i before j
    ahead = (a > a.mT) | ((a == a.mT) & first)  # (..., n / 4, 4, 4): feature i ranks ahead of feature j
    keep = (ahead.sum(-2) < 2).flatten(-2)  # (..., n): fewer than 2 of its group rank ahead of it
    return h - (h * ~keep).detach()  # forward h * keep; gradient identity


class ElasMLP(nn.Module):
    """down(sparsify24(relu(up(x))^2)); projection(d_in, d_out) builds the model's projections (nn.Linear,
    CoLALinear, ...), so ELAS runs on any of them. Sparse from the start: train.py switches it off for
    the dense warm-up."""

    def __init__(self, d, intermediate_size, projection):
        super().__init__()
        f = elas_width(intermediate_size)
        self.up_proj, self.down_proj = projection(d, f), projection(f, d)
        self.sparse = True

    def projections(self):
        return [self.up_proj, self.down_proj]

    def forward(self, x):
        return self.down_proj(self.hidden_activation(x))

    def hidden_activation(self, x):
        """down_proj's input (B, T, f'), 2:4 sparse while self.sparse."""
        h = F.relu(self.up_proj(x)).square()
        return sparsify24(h) if self.sparse else h


def set_sparsity(model, on):
    """2:4 sparsity on (after the dense warm-up) or off in every ELAS MLP of model; on CoLA layers the
    sparse activation's product with A then goes through the semi-structured kernels."""
    for module in model.modules():
        if isinstance(module, ElasMLP):
            module.sparse = on
            if hasattr(module.down_proj, 'down_product'):  # a CoLA layer: z = x @ A, with x the sparse activation
                module.down_proj.down_product = sparse24_matmul if on else torch.matmul


def sparse_flops_saved(model):
    """Forward FLOPs per token that the 2:4 sparse product skips: half of the product of the sparse
    activation with a CoLA down_proj's A (f', r), the one product it runs for. Not taken off
    flops_per_token, which counts dense FLOPs (backward is dense: straight-through)."""
    return sum(m.down_proj.A.numel() for m in model.modules()
               if isinstance(m, ElasMLP) and hasattr(m.down_proj, 'down_product'))


# ----------------------------------------------------------------------------- the 2:4 sparse product

SEMI_STRUCTURED = True  # False: the sparse products run dense everywhere (bench.py's comparison)


class _Sparse24MatMul(torch.autograd.Function):
    """x @ w with x (M, K) 2:4 sparse, through PyTorch's semi-structured sparse kernels; backward is
    dense (the straight-through estimator passes the gradient to every position of x)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.mm(torch.sparse.to_sparse_semi_structured(x), w)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return dy @ w.t(), x.t() @ dy


def sparse24_matmul(x, w):
    """x @ w for x (..., K) with 2 of every 4 consecutive values zero and w (K, N): on CUDA in fp16 or
    bf16 on Ampere or newer through the semi-structured sparse kernels (cuSPARSELt / CUTLASS);
    everywhere else a dense matmul with the same numbers."""
    x2 = x.reshape(-1, x.size(-1))  # (M, K)
    if not (SEMI_STRUCTURED and x2.is_cuda and x2.dtype in (torch.float16, torch.bfloat16)
            and torch.cuda.get_device_capability(x2.device)[0] >= 8):
        return x @ w
    return padded_to_64(_Sparse24MatMul.apply, x2, w.to(x2.dtype)).view(*x.shape[:-1], w.size(1))


def padded_to_64(mm, x, w):
    """mm(x, w) for x (M, K), w (K, N), with both of x's dimensions padded with zeros to multiples of 64,
    as the semi-structured kernels require (ELAS's widths at 350m and 1b, 4,104 and 8,188, are not): a
    group of 4 zeros is 2:4 sparse, and zero rows and columns add nothing to the product."""
    M, K = x.shape
    if M % 64 or K % 64:
        x, w = F.pad(x, (0, -K % 64, 0, -M % 64)), F.pad(w, (0, 0, 0, -K % 64))
    return mm(x, w)[:M]  # (M, N)
