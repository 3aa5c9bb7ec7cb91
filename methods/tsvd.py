"""
TSVD: projections kept as truncated SVDs that stay orthonormal and shrink their rank during training.

"Efficient Pre-Training of LLMs through Truncated SVD Layers" (Kamali et al., arXiv 2605.28573) states
three ideas, and only those are the paper's: each weight is a truncated SVD W = U S V with U and V
orthonormal throughout training; each layer's rank is chosen adaptively by its spectral energy; a
cached decomposition keeps orthonormality cheap. No code is public. Everything below is nanoCoLA's
own design:

    y = ((x @ U) @ S) @ V          U: (d_in, r), S: (r, r), V: (r, d_out), no activation

- S is a full r x r core, not a diagonal: after each optimizer step U and V are retracted to
  orthonormal by QR (U = Q_u R_u, V^T = Q_v R_v) and the triangular factors move into the core,
  S <- R_u S R_v^T, which a diagonal could not hold; so W = U S V does not change. That QR is the
  "cached decomposition": the SVD is never recomputed from W, only kept. Cost per layer and step:
  O((d_in + d_out) r^2).
- Every tsvd_interval steps the core's own SVD, S = P diag(s) Q^T (r x r, cheap), rotates the factors,
  U <- U P, V <- Q^T V, S <- diag(s), and each layer keeps the smallest rank k (at least min_rank)
  whose singular values hold `energy` of sum(s^2): W loses exactly the dropped s_i^2 of its squared
  Frobenius norm. Ranks never grow.
- AdamW's state follows (the cut factors are new parameters, put in the old ones' places in the
  optimizer): the first moments rotate exactly as the parameters do (they are linear in the
  gradient, and the gradient of U P is the gradient of U times P), the second moments approximately
  (by the squared rotation, which keeps them positive); then both are sliced to the kept rank. At
  the per-step retraction the moments are kept as they are (R_u and R_v are I + O(lr)).
- Weight decay on S only: U and V are orthonormal and carry no scale.
- Init: random orthonormal U and V and S = s I with s chosen so that W's entries have the variance of
  the full-rank init (std 0.02).
"""

import math

import torch
import torch.nn as nn


class TSVDLinear(nn.Module):
    def __init__(self, d_in, d_out, rank, std=0.02):
        super().__init__()
        self.U = nn.Parameter(torch.linalg.qr(torch.randn(d_in, rank))[0])  # (d_in, r), orthonormal columns
        self.V = nn.Parameter(torch.linalg.qr(torch.randn(d_out, rank))[0].T.contiguous())  # (r, d_out), orthonormal rows
        # entries of U V have variance about r / (d_in d_out): scale S so that W's have std^2
        self.S = nn.Parameter(torch.eye(rank) * std * math.sqrt(d_in * d_out / rank))

    @property
    def rank(self):
        return self.S.size(0)

    def forward(self, x):
        return ((x @ self.U) @ self.S) @ self.V

    def dense_weight(self):
        """W^T = (U S V)^T, (d_out, d_in): nn.Linear's layout, formed in float64."""
        return (self.U.double() @ self.S.double() @ self.V.double()).T

    @torch.no_grad()
    def retract(self):
        """U and V back to orthonormal by QR, the triangular factors absorbed into S (W unchanged)."""
        Qu, Ru = signed_qr(self.U)
        Qv, Rv = signed_qr(self.V.T)
        self.S.copy_(Ru @ self.S @ Rv.T)
        self.U.copy_(Qu)
        self.V.copy_(Qv.T)


def signed_qr(A):
    """QR with R's diagonal positive: the orthonormal factor nearest to A when A is nearly orthonormal."""
    Q, R = torch.linalg.qr(A)
    signs = torch.sign(torch.diagonal(R)).masked_fill(torch.diagonal(R) == 0, 1.0)
    return Q * signs, R * signs[:, None]


def layers(model):
    return [m for m in model.modules() if isinstance(m, TSVDLinear)]


def retract(model):
    for layer in layers(model):
        layer.retract()


def kept_rank(s, energy, min_rank):
    """The smallest k (at least min_rank, at most len(s)) with sum(s[:k]^2) >= energy * sum(s^2), s descending."""
    cumulative = torch.cumsum(s.double() ** 2, 0)
    k = int(torch.searchsorted(cumulative, energy * cumulative[-1]).item()) + 1
    return max(min(min_rank, len(s)), min(k, len(s)))


@torch.no_grad()
def adapt_ranks(model, optimizer, energy, min_rank):
    """Rotate every TSVD layer to its core's singular vectors and cut it to the rank that holds energy
    of its spectrum; AdamW's state is rotated and cut with the parameters, which are new tensors
    (new shapes), swapped into the optimizer in place of the old. Returns the new ranks."""
    ranks = []
    for layer in layers(model):
        P, s, Qt = torch.linalg.svd(layer.S.double())  # S = P diag(s) Q^T
        P, Qt, k = P.to(layer.S.dtype), Qt.to(layer.S.dtype), kept_rank(s, energy, min_rank)
        Psq, Qtsq = P * P, Qt * Qt  # second moments rotate approximately, by the squared rotations
        rotations = {  # name -> (new value, rotation of a first moment, of a second moment), before the cut
            'U': (layer.U @ P, lambda m: m @ P, lambda v: v @ Psq),
            'V': (Qt @ layer.V, lambda m: Qt @ m, lambda v: Qtsq @ v),
            'S': (torch.diag(s.to(layer.S.dtype)), lambda m: P.T @ m @ Qt.T, lambda v: Psq.T @ v @ Qtsq.T),
        }
        for name, (value, rotate_first, rotate_second) in rotations.items():
            old = getattr(layer, name)
            new = nn.Parameter(cut(name, value, k))
            setattr(layer, name, new)
            state = optimizer.state.pop(old, {})
            for key, rotate in (('exp_avg', rotate_first), ('exp_avg_sq', rotate_second)):
                if key in state:
                    state[key] = cut(name, rotate(state[key]), k)
            optimizer.state[new] = state
            for group in optimizer.param_groups:
                group['params'] = [new if q is old else q for q in group['params']]
        ranks.append(k)
    return ranks


def cut(name, t, k):
    """A tensor shaped like a layer's U, V or S, cut to rank k."""
    return {'U': lambda: t[:, :k], 'V': lambda: t[:k], 'S': lambda: t[:k, :k]}[name]().contiguous()


def match_ranks(model, state_dict):
    """Resize the TSVD layers of a freshly built model to the ranks of a saved state, so it loads."""
    for name, module in model.named_modules():
        if isinstance(module, TSVDLinear):
            k = state_dict[f'{name}.S'].shape[0]
            for param, shape in (('U', (module.U.size(0), k)), ('S', (k, k)), ('V', (k, module.V.size(1)))):
                setattr(module, param, nn.Parameter(getattr(module, param).new_empty(shape)))


def after_step(model, optimizer, step, interval, energy, min_rank):
    """TSVD's work after optimizer step number `step` (train.py's per-step place): every layer retracted,
    and every `interval` steps its rank adapted. Returns the new ranks after an adaptation (the factors
    are then new tensors of new shapes), else None."""
    retract(model)
    if step % interval == 0:
        if not all(torch.isfinite(layer.S).all() for layer in layers(model)):
            raise SystemExit(f"iter {step}: a TSVD core S holds NaN or infinite values, so its ranks cannot be adapted: "
                             f"the run diverged (lower learning_rate); the last checkpoint is kept")
        return adapt_ranks(model, optimizer, energy, min_rank)
    return None


def retraction_flops(model):
    """FLOPs of one retraction of every TSVD layer: two Householder QRs, about 2 m r^2 each for an
    m x r matrix, and the two r x r products that move the factors into S."""
    return sum(2 * (layer.U.size(0) + layer.V.size(1)) * layer.rank ** 2 + 4 * layer.rank ** 3 for layer in layers(model))
