"""
SLTrain: each projection a low-rank product plus a sparse matrix with a fixed random support.

"SLTrain: a sparse plus low-rank approach for parameter and memory efficient pretraining" (Han et al.,
NeurIPS 2024; code github andyjm3/SLTrain), as its code runs it. In nn.Linear's layout (W: d_out x d_in,
y = x W^T):

    W = (alpha / r) B A + S          B: (d_out, r) zeros,  A: (r, d_in) uniform(+-1/sqrt(d_in))
    S: int(delta * d_out * d_in) entries on a support drawn once (uniform, without replacement) from the
       run's seed and fixed for all of training (a buffer of flat indices, saved with the weights); its
       values a 1-D parameter, uniform(+-1/sqrt(d_in))

Linear, no activation. Defaults of the 60m script: delta 0.03, alpha 32 (alpha / r is the scale). The
parameters are what they are: r (d_in + d_out) + nnz per projection. Ours: weight decay applies to A and B,
not to S's values (a 1-D parameter, so in train.py's no-decay group).

How to compute it (ours, measured: docs/methods.md): like the official code we rebuild the dense W in
every forward and run one dense matmul, rather than a low-rank product plus a sparse product: on the CPU
PyTorch's sparse-dense product at 3% density was slower than the dense matmul it replaces, and the
rebuild's cost, 2 d_out r d_in FLOPs per forward call, is shared by all the call's tokens.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SLTrainLinear(nn.Module):
    def __init__(self, d_in, d_out, rank, delta=0.03, alpha=32.0):
        super().__init__()
        bound = 1 / math.sqrt(d_in)
        self.scale = alpha / rank
        self.B = nn.Parameter(torch.zeros(d_out, rank))
        self.A = nn.Parameter(torch.empty(rank, d_in).uniform_(-bound, bound))
        nnz = int(delta * d_out * d_in)
        self.register_buffer('support', torch.randperm(d_out * d_in)[:nnz].sort().values)  # flat indices into W, fixed
        self.values = nn.Parameter(torch.empty(nnz).uniform_(-bound, bound))

    def dense_weight(self):
        """The dense W = (alpha / r) B A + S, (d_out, d_in)."""
        W = self.scale * (self.B @ self.A)  # under autocast a bf16 product: S joins it in that dtype
        return W.flatten().index_add(0, self.support, self.values.to(W.dtype)).view_as(W)

    def forward(self, x):
        return F.linear(x, self.dense_weight())

    def rebuild_flops(self):
        """Training FLOPs of one rebuild of W: the product B A (2 d_out r d_in) forward, twice that backward."""
        return 6 * self.B.size(0) * self.B.size(1) * self.A.size(1)
