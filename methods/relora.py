"""
ReLoRA: a frozen full-rank weight plus a LoRA branch, merged into the weight and restarted every few
hundred steps, so that a sum of low-rank updates trains a full-rank model.

"ReLoRA: High-Rank Training Through Low-Rank Updates" (Lialin et al., ICLR 2024; code github
Guitaricet/relora), as its code runs it. In nn.Linear's layout (y = x W^T):

    y = x W^T + s (dropout(x) A^T) B^T      W: (d_out, d_in) frozen (no gradient, not in the optimizer)
                                             A: (r, d_in) kaiming-uniform, B: (d_out, r) zeros, s = alpha / r
    every `interval` steps (train.py's per-step place):
        merge     W += s B A                 (the function is unchanged: B A's contribution moves into W)
        restart   A re-drawn (kaiming-uniform), B = 0
        prune     `prune` of the entries of A's and B's Adam moments zeroed, at random (the comparisons' choice)
                  or those of smallest magnitude; the step counts for bias correction kept
    the jagged cosine schedule: the learning rate drops to 0 at each merge and climbs linearly over
    `restart_warmup` steps back to the cosine envelope.

Not copied: the official training script also zeroes A at init, so its LoRA branch learns nothing until the
first merge (github.com/Guitaricet/relora/issues/18); here A starts kaiming-uniform, B zero, as LoRA intends.
The paper's warm start (a full-rank model trained for some steps first) is a full-rank run's checkpoint named by train.py's
relora_warm_start, whose weights W start from (GaLore's and Beyond Perplexity's comparisons ran ReLoRA
from scratch, our default). LoRA dropout is a setting; ours defaults to 0 (the official 0.1; nanoCoLA's
other methods have no dropout, and 0 keeps the merge exact in the logits).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ReLoRALinear(nn.Module):
    def __init__(self, d_in, d_out, rank, alpha=32.0, dropout=0.0, std=0.02):
        super().__init__()
        self.scale = alpha / rank
        self.weight = nn.Parameter(torch.randn(d_out, d_in) * std, requires_grad=False)  # W: nn.Linear's name and init
        self.A = nn.Parameter(torch.empty(rank, d_in))
        self.B = nn.Parameter(torch.zeros(d_out, rank))
        self.dropout = nn.Dropout(dropout)
        self.restart()

    def forward(self, x):
        return F.linear(x, self.weight) + self.scale * F.linear(F.linear(self.dropout(x), self.A), self.B)

    @torch.no_grad()
    def restart(self):
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # nn.Linear's (and PEFT's) init of lora_A
        self.B.zero_()

    @torch.no_grad()
    def merge(self):
        self.weight += self.scale * (self.B @ self.A)
        self.restart()

    def dense_weight(self):
        """W + s B A, (d_out, d_in): the function as one matrix."""
        return self.weight + self.scale * (self.B @ self.A)


def layers(model):
    return [m for m in model.modules() if isinstance(m, ReLoRALinear)]


@torch.no_grad()
def after_step(model, optimizer, step, interval, prune, prune_kind='random'):
    """ReLoRA's work after optimizer step number `step` (train.py's per-step place): every `interval` steps,
    merge each layer and restart it, and prune its factors' Adam moments. Returns True after a merge."""
    if step % interval != 0:
        return False
    for layer in layers(model):
        layer.merge()
        for p in (layer.A, layer.B):
            state = optimizer.state.get(p, {})
            for key in ('exp_avg', 'exp_avg_sq'):
                if key in state:
                    state[key].mul_(~pruned_mask(state[key], prune, prune_kind))
    return True


def pruned_mask(moment, fraction, kind):
    """The entries to zero: a random `fraction` of them, or the `fraction` of smallest magnitude."""
    if kind == 'random':
        return torch.rand(moment.shape, device=moment.device) < fraction
    k = round(fraction * moment.numel())
    if k == 0:
        return torch.zeros_like(moment, dtype=torch.bool)
    threshold = moment.abs().flatten().kthvalue(k).values
    return moment.abs() <= threshold


def jagged_lr(envelope, it, interval, restart_warmup):
    """The learning rate at step `it`: the cosine envelope(it), except in the first restart_warmup steps after
    each merge (at it = interval, 2 interval, ...), where it climbs linearly from 0 to the envelope's value at
    the end of that re-warm-up."""
    since = it % interval
    if it >= interval and since < restart_warmup:
        return envelope(it - since + restart_warmup) * since / restart_warmup
    return envelope(it)


def warm_start(model, checkpoint, path):
    """The paper's warm start: W from a full-rank run's checkpoint of the same shapes (A and B as initialised)."""
    if checkpoint['model_config'].get('rank') != 0:
        raise SystemExit(f"{path}: relora_warm_start needs a full-rank run's checkpoint (rank=0), not "
                         f"rank={checkpoint['model_config'].get('rank')}")
    try:
        missing, unexpected = model.load_state_dict(checkpoint['model'], strict=False)
    except RuntimeError as e:
        raise SystemExit(f"{path}: its weights do not fit this model ({str(e).splitlines()[1].strip()[:200]})") from None
    if unexpected or any(not k.endswith(('.A', '.B')) for k in missing):
        raise SystemExit(f"{path}: its weights do not fit this model (missing {missing[:3]}, unexpected {unexpected[:3]})")

