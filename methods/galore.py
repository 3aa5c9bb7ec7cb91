"""
GaLore and Fira: a full-rank model trained with AdamW whose states live in a low-rank projection of
each projection weight's gradient.

GaLore ("GaLore: Memory-Efficient LLM Training by Gradient Low-Rank Projection", Zhao et al., ICML 2024;
package galore-torch 1.0) and Fira ("Fira: Can We Achieve Full-rank Training of LLMs Under Low-rank
Constraint?", Chen et al. 2024; package fira 1.0.2), as their published code runs them. For a weight W
(m x n, nn.Linear's out x in) with gradient G, at its t-th step (t = 0, 1, ...):

    every T steps (t % T == 0), the projector from the SVD G = U S V^T:
        m >= n:  right side, Q = V^T[:r]  (r x n),   R = G Q^T  (m x r),  back(N) = N Q
        m <  n:  left side,  P = U[:, :r] (m x r),   R = P^T G  (r x n),  back(N) = P N
    Adam on R (moments of R's shape, carried across a refresh unchanged; HF-style: eps added to sqrt(v),
    bias correction in the step size):  N = m_hat / (sqrt(v) + eps)
    GaLore:  W -= lr_t * scale * back(N)
    Fira:    W -= lr_t * (alpha * back(N) + S),  S = (G - alpha * back(R)) * phi, the residual scaled by
             phi = ||N|| / (||R|| + 1e-8) per row of W (right side) or per column (left side), and held to at
             most 1.01x the growth of ||S|| from one step to the next (the norm-growth limiter)
    then decoupled weight decay, W -= lr * weight_decay * W.

Parameter groups are the packages': a group with 'rank' ({'params': ..., 'rank': r, 'update_proj_gap': T,
'scale': a (GaLore) or 'alpha': a (Fira), 'proj_type': 'std'}) is projected, any other group gets the
same optimizer's plain AdamW, so code written for galore-torch or fira runs on these unchanged. The
state is tensors and numbers only (the projector a tensor), so checkpoints load with weights_only=True.

Where the code and the papers' math differ we follow the code: Fira's residual G - alpha * back(R) keeps
1 - alpha of the in-subspace part (the papers' orthogonal complement would be G - back(R)), and neither
re-projects the moments when the projector changes. Ours: the SVD runs in float32 for bf16/fp16
gradients (as the packages) and in the gradient's own precision otherwise (float64 in the tests).
"""

import torch


def projector(G, rank):
    """The basis of G's top-rank singular vectors on the side the packages choose: Q (r x n) when m >= n,
    else P (m x r)."""
    U, _, Vh = torch.linalg.svd(G.float() if G.dtype in (torch.float16, torch.bfloat16) else G, full_matrices=False)
    return (Vh[:rank] if G.size(0) >= G.size(1) else U[:, :rank]).to(G.dtype).contiguous()


def project(G, basis):
    return G @ basis.T if G.size(0) >= G.size(1) else basis.T @ G  # (m, r) or (r, n)


def project_back(N, basis, full_shape):
    return N @ basis if full_shape[0] >= full_shape[1] else basis @ N  # (m, n)


@torch.no_grad()
def adamw_step(group, p, state, fira):
    """One step of the packages' AdamW on p, through the projection when the group has a rank."""
    beta1, beta2 = group['betas']
    G = p.grad
    projected = 'rank' in group
    if projected:
        if state.get('step', 0) % group['update_proj_gap'] == 0:
            state['projector'] = projector(G, group['rank'])
        R = project(G, state['projector'])
    else:
        R = G
    if 'exp_avg' not in state:
        state['step'], state['exp_avg'], state['exp_avg_sq'] = 0, torch.zeros_like(R), torch.zeros_like(R)
    state['step'] += 1
    exp_avg, exp_avg_sq, t = state['exp_avg'], state['exp_avg_sq'], state['step']
    exp_avg.mul_(beta1).add_(R, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(R, R, value=1 - beta2)
    step_size = group['lr'] * (1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t) if group['correct_bias'] else group['lr']
    N = exp_avg / (exp_avg_sq.sqrt() + group['eps'])
    if projected:
        scale = group['alpha' if fira else 'scale']
        update = scale * project_back(N, state['projector'], G.shape)
        if fira:
            update += limited(state, residual_scaled(G, R, N, state['projector'], scale))
        N = update
    p.add_(N, alpha=-step_size)
    if group['weight_decay'] > 0:
        p.add_(p, alpha=-group['lr'] * group['weight_decay'])


def residual_scaled(G, R, N, basis, alpha):
    """Fira: the gradient's residual G - alpha * back(R), scaled per row of W (N wider than tall: per
    column) by the ratio of the Adam update's norm to the projected gradient's, ||N|| / (||R|| + 1e-8)."""
    dim = 0 if N.size(0) < N.size(1) else 1
    phi = N.norm(dim=dim) / (R.norm(dim=dim) + 1e-8)
    return (G - alpha * project_back(R, basis, G.shape)) * (phi.unsqueeze(1) if dim == 1 else phi)


def limited(state, S, gamma=1.01):
    """Fira's norm-growth limiter: ||S|| may grow by at most gamma from one step to the next."""
    norm = S.norm()
    if 'scaling_grad' in state:
        limiter = torch.clamp(norm / (state['scaling_grad'] + 1e-8), min=gamma) / gamma
        S, norm = S / limiter, norm / limiter
    state['scaling_grad'] = norm
    return S


class GaLoreAdamW(torch.optim.Optimizer):
    """galore_torch.GaLoreAdamW's update: groups with 'rank' projected (with 'scale'), others plain AdamW."""
    fira = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, correct_bias=correct_bias))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group['params']:
                if p.grad is not None:
                    adamw_step(group, p, self.state[p], self.fira)


class FiraAdamW(GaLoreAdamW):
    """fira.FiraAdamW's update: groups with 'rank' projected (with 'alpha') plus the scaled, limited residual
    (the same optimizer with Fira's step: a subclass for the packages' class name only)."""
    fira = True


def build_optimizer(model, kind, learning_rate, betas, weight_decay, rank, update_proj_gap, scale):
    """The published scripts' groups for a full-rank model: the seven projections of every block projected,
    embeddings and lm_head plain AdamW with weight decay, norms without."""
    projected = [proj.weight for block in model.blocks for proj in block.projections()]
    ids = {id(p) for p in projected}
    rest = [p for p in model.parameters() if id(p) not in ids]
    groups = [{'params': [p for p in rest if p.dim() >= 2], 'weight_decay': weight_decay},
              {'params': [p for p in rest if p.dim() < 2], 'weight_decay': 0.0},
              {'params': projected, 'weight_decay': weight_decay, 'rank': rank, 'update_proj_gap': update_proj_gap,
               'alpha' if kind == 'fira' else 'scale': scale, 'proj_type': 'std'}]
    return (FiraAdamW if kind == 'fira' else GaLoreAdamW)(groups, lr=learning_rate, betas=betas)


def state_bytes(optimizer):
    """Bytes of the optimizer's own tensors (moments, projectors, Fira's norms)."""
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))


def flops_per_step(optimizer):
    """The projection's FLOPs per optimizer step, beyond AdamW's elementwise work: the SVD of each projected
    m x n gradient, 6 max(m, n) min(m, n)^2 + 20 min(m, n)^3 (Golub and Van Loan's count for the thin
    R-SVD with both singular bases), amortised over its update_proj_gap steps; and every step the
    projection and the way back, 2 m n r each (Fira: once more, for the residual)."""
    total = 0.0
    for group in optimizer.param_groups:
        if 'rank' in group:
            for p in group['params']:
                (m, n), r = p.shape, min(group['rank'], *p.shape)
                svd = 6 * max(m, n) * min(m, n) ** 2 + 20 * min(m, n) ** 3
                total += svd / group['update_proj_gap'] + 2 * m * n * r * (3 if 'alpha' in group else 2)
    return total
