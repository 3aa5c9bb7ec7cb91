"""
Low-Rank: the plain factorisation W = A B of GaLore's and CoLA's Table 2 (Kamalakara et al. 2022), CoLA
without its activation, the ablation that shows what CoLA's non-linearity buys:

    z = x @ A        (..., r)       A: (d_in, r)
    y = z @ B        (..., d_out)   B: (r, d_out)

No public code exists for it in these comparisons; ours is CoLA's layer with the identity in place of
SiLU: the same init (A, B ~ N(0, 1) * r^(-1/4) * (d_in + d_out)^(-1/4), so that the product has the variance
of a (d_in + d_out)^(-1/2)-scaled full-rank layer) and the same down() / up() halves, so that CoLA-M's
checkpoint (it keeps z, recomputes the up-projections) runs on it exactly.
"""

import torch
import torch.nn as nn


class LowRankLinear(nn.Module):
    def __init__(self, d_in, d_out, rank):
        super().__init__()
        std = rank ** -0.25 * (d_in + d_out) ** -0.25
        self.A = nn.Parameter(torch.randn(d_in, rank) * std)
        self.B = nn.Parameter(torch.randn(rank, d_out) * std)

    def forward(self, x):
        return self.up(self.down(x))

    def down(self, x):
        return x @ self.A

    def up(self, z):
        return z @ self.B
