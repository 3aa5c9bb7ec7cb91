"""
What trained low-rank models converge to, beyond their loss: CoLA's low-rank-activation observation
and the "Beyond Perplexity" geometry (arXiv 2605.13652), measured on train.py's checkpoints.

    python analyze.py --runs=out-compare/full-rank-seed1,out-compare/cola-seed1 --reference=out-compare/full-rank-seed1
    python analyze.py --runs=out-a --landscape=False --directions=20     # every metric has a switch and a size

For each run (its out_dir/ckpt.pt, and its ckpt_{iter}.pt series when train.py ran with
keep_checkpoints=True), on the first eval_tokens tokens of the validation split of the run's data:
- activations: for each projection type and layer, the singular values of its outputs over
  activation_tokens tokens: the ranks holding 90/95/99% of the energy (sum s^2) and the effective
  rank exp(entropy(s / sum s)); for CoLA also of its r-wide latent z = x @ A (CoLA's observation is
  that a full-rank model's outputs are effectively low rank);
- weights: per matrix (nn.Linear's W; CoLA's A, B and their product A @ B, the layer without its
  non-linearity; TSVD's S, whose singular values are W's): rank (s > 1e-12), effective rank, stable
  rank sum(s^2) / s_1^2, spectral gap (s_1 - s_2) / s_1, spectral norm s_1; averaged per run;
- updates: the same for dW = W_t - W_{t-1} between consecutive checkpoints, with ||dW||_F and
  ||dW||_F / ||W_{t-1}||_F;
- landscape: the loss at theta + t d along `directions` random directions (a Gaussian per parameter,
  unnormalised as in the paper's code, or filter-normalised) on a grid of t in [-t_max, t_max], and
  the expected sharpness ES = mean over t > 0 of (L(t) + L(-t)) / 2 - L(0); and along each matrix's
  top-k singular directions s_k u_k v_k^T (all matrices at once, vectors and norms held still);
- interpolation: the loss at (1 - a) theta_t + a theta_{t+1} between consecutive checkpoints, at
  `alphas` points (ReLoRA: each checkpoint merged first), and the barrier: the largest excess of L(a) over the
  straight line from L(0) to L(1) (Beyond Perplexity's max_a L(a) - (L(0) + L(1)) / 2 is kept for two models
  at the same step: --reference);
- similarity to the reference run: per layer (after the embedding and after each block), linear CKA
  on column-centred hidden states, mean cosine and relative L2.
Writes out_dir/analysis.json, out_dir/analysis.md and, with matplotlib, out_dir/landscape.png and
out_dir/cka.png.
"""

import glob
import json
import os
import re
import sys
from dataclasses import replace

import numpy as np
import torch
from tqdm import tqdm

from configurator import configure, public_settings
from methods.lowrank import LowRankLinear
import model as model_module
from model import CoLALinear, Transformer, load_checkpoint, model_from_checkpoint
from shards import load_meta, make_writable_folder, read_shard, shard_path, write_durably

# ----------------------------------------------------------------------------- config
runs = ''  # comma-separated out_dirs of train.py runs
reference = ''  # an out_dir to compare hidden states with ('' = no similarity)
out_dir = 'analysis'  # where analysis.md and the plots go
data_dir = ''  # '' = each run's own data_dir
eval_tokens = 65536  # the loss of each point of a landscape or interpolation: exact mean over these tokens
batch_size = 8  # sequences per forward pass
activations = True  # the hidden states' effective rank per layer
activation_tokens = 2048  # tokens whose hidden states are analysed
weights = True  # the weights' spectra and effective ranks
updates = True  # the rank of each layer's change over training (needs a trajectory)
landscape = True  # loss along random and top singular directions
directions = 5  # random directions of the landscape
grid = 7  # points of t on [-t_max, t_max], odd so that it holds 0
t_max = 0.003  # the landscape's range of t, [-t_max, t_max]
filter_norm = False  # filter-normalised directions (each row of d scaled to its weight row's norm)
top_k = 3  # singular directions u_k v_k^T for k = 1 .. top_k (0: off; the paper: 20, averaged over top-5/10/20)
top_k_t_max = 0.05  # their own t range, [-top_k_t_max, top_k_t_max] (the paper's +-0.05)
interpolation = True  # loss along the straight line between consecutive checkpoints (the barrier)
alphas = 21  # points of that line
similarity = True  # CKA of hidden states against the reference run
device = 'cpu'  # 'cpu' or 'cuda'
seed = 0  # the random directions' seed


# ----------------------------------------------------------------------------- metrics

def energy_rank(s, fraction):
    """The smallest k with sum(s[:k]^2) >= fraction * sum(s^2), for s in descending order."""
    energy = np.cumsum(np.asarray(s, dtype=np.float64) ** 2)
    return int(np.searchsorted(energy, fraction * energy[-1] * (1 - 1e-12))) + 1


def spectrum(s, size=None):
    """Statistics of singular values s (descending) of a matrix whose longer side is size (default len(s)).
    The numerical rank counts s_i > s_1 * size * eps(float32), as numpy's matrix_rank defines it, with the
    rounding of the float32 weights the matrices come from (a fixed cut such as 1e-12 counts the noise of a
    product formed in float32: CoLA's A @ B of rank r showed rank 2r)."""
    s = np.asarray(s, dtype=np.float64)
    p = s / s.sum() if s.sum() > 0 else s
    nonzero = p[p > 0]
    cut = s[0] * (size or len(s)) * np.finfo(np.float32).eps
    return {'rank': int((s > cut).sum()), 'above_0.1': int((s > 0.1).sum()),
            'effective_rank': float(np.exp(-(nonzero * np.log(nonzero)).sum())),
            'stable_rank': float((s ** 2).sum() / s[0] ** 2) if s[0] > 0 else 0.0,
            'spectral_gap': float((s[0] - s[1]) / s[0]) if len(s) > 1 and s[0] > 0 else 0.0,
            'spectral_norm': float(s[0]), 'rank_90': energy_rank(s, 0.9), 'rank_95': energy_rank(s, 0.95),
            'rank_99': energy_rank(s, 0.99)}


def singular_values(matrix):
    return torch.linalg.svdvals(matrix.detach().double()).cpu().numpy()


def linear_cka(X, Y):
    """Linear CKA of X (n, p) and Y (n, q): ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F), columns centred."""
    X, Y = X.double() - X.double().mean(0), Y.double() - Y.double().mean(0)
    return float((Y.T @ X).norm() ** 2 / ((X.T @ X).norm() * (Y.T @ Y).norm()))


def similarity_of(layer, h, r):
    """Hidden states h of a model against r of the reference on the same tokens, (tokens, d) each: linear CKA,
    mean cosine, mean L2 (per position), and the paper's relative L2: the mean per-position L2 over the
    reference's mean per-position norm."""
    h, r = h.double(), r.double()
    mean_l2 = float((h - r).norm(dim=-1).mean())
    return {'layer': layer, 'cka': linear_cka(h, r), 'cosine': float(torch.nn.functional.cosine_similarity(h, r, dim=-1).mean()),
            'mean_l2': mean_l2, 'relative_l2': mean_l2 / float(r.norm(dim=-1).mean())}


def expected_sharpness(losses):
    """ES of losses on a symmetric grid with 0 at the centre: mean over k of (L(+k) + L(-k)) / 2 - L(0)."""
    c = len(losses) // 2
    return float(np.mean([(losses[c + k] + losses[c - k]) / 2 - losses[c] for k in range(1, c + 1)]))


def barrier(losses):
    """Between consecutive checkpoints: the largest excess of the loss at an interior point over the straight
    line between the endpoints' losses (the loss falls from one checkpoint to the next, so max L - (L(0) +
    L(1)) / 2 would report that fall: a straight line from 3.0 to 2.8 would score 0.1)."""
    line = np.linspace(losses[0], losses[-1], len(losses))
    return float(max(np.asarray(losses[1:-1]) - line[1:-1]))


def barrier_between_models(losses):
    """Beyond Perplexity's barrier between two models at the same step: max over interior a of
    L(a) - (L(0) + L(1)) / 2."""
    return float(max(losses[1:-1]) - (losses[0] + losses[-1]) / 2)


# ----------------------------------------------------------------------------- the model's matrices

def matrices(model):
    """name -> 2-D weight matrix as the layer computes it (x @ M): nn.Linear's W^T, CoLA's and Low-Rank's A,
    B and A @ B (CoLA's product without its non-linearity), TSVD's S (its singular values are W's), and the
    effective dense W^T of SLTrain (s B A + S) and ReLoRA (W + s B A)."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, (CoLALinear, LowRankLinear)):  # factors; their product in float64
            out[name + '.A'], out[name + '.B'], out[name + '.A@B'] = module.A, module.B, module.A.double() @ module.B.double()
        elif name.startswith('blocks.') and name.endswith('_proj'):
            out[name] = dense_weight(module).T
    return out


def dense_weight(module):
    """A projection's W (d_out, d_in) as one matrix, or None for CoLA-style factors (non-linear, or kept as
    factors): nn.Linear's weight; TSVD's (U S V)^T; SLTrain's s B A + S; ReLoRA's W + s B A."""
    if isinstance(module, torch.nn.Linear):
        return module.weight
    return module.dense_weight() if hasattr(module, 'dense_weight') else None


def dense_state(model):
    """The state dict of the full-rank model (rank=0) that computes what model computes, when every
    projection has a dense W (full-rank, TSVD, SLTrain, ReLoRA); else None. In that form two checkpoints,
    or two methods, interpolate meaningfully."""
    state = {}
    for name, module in model.named_modules():
        if name.startswith('blocks.') and name.endswith('_proj'):
            W = dense_weight(module)
            if W is None:
                return None
            state[name + '.weight'] = W.detach().float()
    for name, tensor in model.state_dict().items():
        if not re.search(r'_proj\.', name):
            state[name] = tensor
    return state


def full_rank_twin(model):
    """A full-rank model of model's shapes (rank=0), into which dense_state loads."""
    return Transformer(replace(model.config, rank=0, projection='cola', dlr_alpha=0.0)).to(device).eval()


def projection_type(name):
    return re.search(r'\.(q|k|v|o|gate|up|down)_proj', name).group(1)


def mean_spectra(named):
    """Per run: each statistic averaged over the matrices."""
    stats = [spectrum(singular_values(m), max(m.shape)) for m in named.values()]
    return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}


# ----------------------------------------------------------------------------- losses along paths

class Loss:
    """The exact mean loss per token over the first tokens of a validation split."""

    def __init__(self, data_dir, tokens, block_size):
        parts = []  # the split's first tokens + 1, read from as few shards as that takes
        for shard in load_meta(data_dir)['splits']['val']['shards']:
            parts.append(read_shard(shard_path(data_dir, shard))[:tokens + 1 - sum(map(len, parts))])
            if sum(map(len, parts)) == tokens + 1:
                break
        stream = np.concatenate(parts)
        n = min(tokens, len(stream) - 1) // block_size
        if n == 0:
            raise SystemExit(f"the val split of {data_dir}/ holds fewer than block_size={block_size} tokens")
        window = torch.from_numpy(stream[:n * block_size + 1].astype(np.int64)).to(device)
        self.x, self.y = window[:-1].view(n, block_size), window[1:].view(n, block_size)

    @torch.no_grad()
    def __call__(self, model):
        total = 0.0
        for i in range(0, len(self.x), batch_size):
            _, loss = model(self.x[i:i + batch_size], self.y[i:i + batch_size])
            total += loss.item() * self.y[i:i + batch_size].numel()
        return total / self.y.numel()


@torch.no_grad()
def along(model, loss_fn, direction, ts):
    """Losses at theta + t * direction (direction: a tensor per parameter, or None for 0) for t in ts;
    the model's parameters are restored afterwards, bit for bit."""
    params = [p for p in model.parameters()]
    saved = [p.detach().clone() for p in params]
    losses = []
    for t in ts:
        for p, p0, d in zip(params, saved, direction):
            p.copy_(p0 if d is None else p0 + t * d)
        losses.append(loss_fn(model))
    for p, p0 in zip(params, saved):
        p.copy_(p0)
    return losses


def random_direction(model, generator, normalise):
    out = []
    for p in model.parameters():
        d = torch.randn(p.shape, generator=generator).to(p)
        if normalise and p.dim() >= 2:  # filter-normalised: each row as long as the weight's row
            d *= p.norm(dim=-1, keepdim=True) / d.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        elif normalise:
            d *= p.norm() / d.norm().clamp_min(1e-12)
        out.append(d)
    return out


def singular_direction(model, k):
    """Direction s_k u_k v_k^T in every 2-D parameter at once, embeddings and lm_head included (its k-th
    singular triple, scaled by its singular value as one of the paper code's options, so that t is relative
    to the weight), 0 for vectors."""
    out = []
    for name, p in model.named_parameters():
        if p.dim() == 2 and min(p.shape) >= k:
            U, s, Vh = torch.linalg.svd(p.detach().double(), full_matrices=False)
            out.append((s[k - 1] * torch.outer(U[:, k - 1], Vh[k - 1])).to(p))
        else:
            out.append(None)
    return out


def interpolate(model, first, second, loss_fn, points):
    """Losses at (1 - a) first + a second (two state dicts of model's shapes) for a in [0, 1]."""
    losses = []
    with torch.no_grad():
        for a in np.linspace(0, 1, points):
            model.load_state_dict({k: (1 - a) * first[k] + a * second[k] if first[k].is_floating_point() else first[k]
                                   for k in first})
            losses.append(loss_fn(model))
    return losses


# ----------------------------------------------------------------------------- activations

@torch.no_grad()
def outputs(model, idx):
    """Per projection: its output activations (tokens, d_out), and for CoLA its latent z (tokens, r);
    and the hidden states after the embedding and after each block (tokens, d)."""
    captured, hidden, hooks = {}, [], []
    for name, module in model.named_modules():
        if name.startswith('blocks.') and name.endswith('_proj'):  # every projection, whichever its kind
            def hook(module, args, output, name=name):
                captured[name] = output.reshape(-1, output.size(-1))
                if isinstance(module, CoLALinear):
                    captured[name + '.z'] = module.down(args[0]).reshape(-1, module.A.size(1))
            hooks.append(module.register_forward_hook(hook))
    for module in [model.tok_emb, *model.blocks, model.norm]:  # the last: the final hidden state, after the final norm
        hooks.append(module.register_forward_hook(lambda m, a, out: hidden.append(out.reshape(-1, out.size(-1)))))
    merged = model_module.fan_out  # q, k, v (gate, up) one by one, so that each projection's own hook sees it: the same
    model_module.fan_out = lambda layers, x: [layer(x) for layer in layers]  # function as the merged down products
    try:
        model(idx)
    finally:
        model_module.fan_out = merged
        for h in hooks:
            h.remove()
    return captured, hidden


# ----------------------------------------------------------------------------- one run

def load_run(path):
    """The model of a checkpoint file, in eval mode, with its config."""
    checkpoint = load_checkpoint(path)
    return model_from_checkpoint(checkpoint, device, path).eval(), checkpoint


def run_data_dir(checkpoint, path):
    """The data folder to measure a run on: data_dir if given, else the run's own, which must still hold
    data of the run's encoding."""
    folder = data_dir or checkpoint['config']['data_dir']
    if not os.path.exists(os.path.join(folder, 'meta.json')):
        raise SystemExit(f"{path} was trained on {folder}/, which holds no meta.json now: give --data_dir= the "
                         f"folder where that data is (or remake it with prepare.py)")
    if load_meta(folder)['encoding'] != checkpoint['encoding']:
        raise SystemExit(f"{path} was trained on encoding={checkpoint['encoding']!r} tokens, but {folder}/ holds "
                         f"{load_meta(folder)['encoding']!r} tokens")
    return folder


def series(run_dir):
    """ckpt_{iter}.pt files of a run in order, or [] without keep_checkpoints."""
    files = [f for f in glob.glob(os.path.join(glob.escape(run_dir), 'ckpt_*.pt')) if re.search(r'ckpt_\d+\.pt$', f)]
    return sorted(files, key=lambda f: int(re.search(r'ckpt_(\d+)\.pt$', f).group(1)))  # (not a stray ckpt_final.pt)


def analyze(run_dir, reference_hidden, reference_dense=None):
    path = os.path.join(run_dir, 'ckpt.pt')
    if not os.path.exists(path):
        raise SystemExit(f"no checkpoint {path}: analyze.py reads train.py's out_dir")
    model, checkpoint = load_run(path)
    loss_fn = Loss(run_data_dir(checkpoint, path), eval_tokens, model.config.block_size)
    result = {'run': run_dir, 'iter': checkpoint['iter_num'], 'val_loss': loss_fn(model),
              'checkpoints': len(series(run_dir))}  # the trajectory's length: the metrics between checkpoints need 2
    scores = os.path.join(run_dir, 'evaluate.json')  # downstream scores, when evaluate.py has scored this checkpoint
    if os.path.exists(scores):
        try:
            report = json.load(open(scores))
            downstream = {task: s['acc'] for task, s in report['scores'].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SystemExit(f"{scores} is not evaluate.py's output: rerun evaluate.py --out_dir={run_dir}, or delete it") from None
        if report.get('iter') == checkpoint['iter_num']:
            result['downstream'] = downstream
    captured, hidden = outputs(model, loss_fn.x[:max(1, activation_tokens // model.config.block_size)])
    if activations:
        table, widths = {}, {}
        for name, acts in tqdm(captured.items(), desc='activation spectra', leave=False):
            kind = projection_type(name) + (' z' if name.endswith('.z') else '')
            table.setdefault(kind, []).append(spectrum(singular_values(acts), max(acts.shape)))
            widths[kind] = acts.size(1)
        result['activations'] = {kind: {'width': widths[kind], **{k: float(np.mean([s[k] for s in stats])) for k in stats[0]}}
                                 for kind, stats in table.items()}
    if weights:
        named = matrices(model)  # as the paper: statistics averaged over the matrices trained (CoLA: its factors) ...
        result['weights'] = mean_spectra({k: v for k, v in named.items() if not k.endswith('.A@B')})
        if any(k.endswith('.A@B') for k in named):  # ... and the factors' product apart
            result['weights_product'] = mean_spectra({k: v for k, v in named.items() if k.endswith('.A@B')})
    if updates and len(series(run_dir)) >= 2:
        steps, previous = [], None
        for file in tqdm(series(run_dir), desc='update spectra', leave=False):
            current = {k: v.detach().clone() for k, v in matrices(load_run(file)[0]).items()}
            if previous is not None and previous.keys() == current.keys() and all(previous[k].shape == current[k].shape for k in current):
                dW = {k: current[k] - previous[k] for k in current}
                stats = mean_spectra(dW)
                stats['norm'] = float(np.mean([d.norm().item() for d in dW.values()]))
                stats['relative_norm'] = float(np.mean([dW[k].norm().item() / previous[k].norm().item() for k in dW]))
                steps.append({'iter': int(re.search(r'(\d+)\.pt$', file).group(1)), **stats})
            previous = current
        result['updates'] = steps
    if landscape:
        ts = np.linspace(-t_max, t_max, grid)
        generator = torch.Generator().manual_seed(seed)
        curves = [along(model, loss_fn, random_direction(model, generator, filter_norm), ts)
                  for _ in tqdm(range(directions), desc='random directions', leave=False)]
        sharpness = [expected_sharpness(c) for c in curves]
        result['landscape'] = {'t': ts.tolist(), 'curves': curves, 'sharpness_mean': float(np.mean(sharpness)),
                               'sharpness_std': float(np.std(sharpness)),  # and the paper's average variance over t:
                               'variance_mean': float(np.mean(np.var(curves, axis=0))) if curves else float('nan')}
        ts_k = np.linspace(-top_k_t_max, top_k_t_max, grid)
        result['top_k'] = [{'k': k, 't': ts_k.tolist(), 'sharpness': expected_sharpness(
            along(model, loss_fn, singular_direction(model, k), ts_k))}
            for k in tqdm(range(1, top_k + 1), desc='singular directions', leave=False)]
        result['top_k_means'] = {f'top_{n}': float(np.mean([d['sharpness'] for d in result['top_k'][:n]]))
                                 for n in (5, 10, 20) if top_k >= n}
    if interpolation and len(series(run_dir)) >= 2:
        # dense W where the method has one (TSVD's rotating factors, ReLoRA merged), the factors as trained otherwise
        files, barriers = series(run_dir), []
        twin = full_rank_twin(model) if dense_state(model) is not None else None
        second = load_run(files[0])[0]
        for a, b in tqdm(list(zip(files, files[1:])), desc='interpolation', leave=False):
            first, second = second, load_run(b)[0]  # each checkpoint read once
            if twin is not None:
                losses = interpolate(twin, dense_state(first), dense_state(second), loss_fn, alphas)
            elif all(p.shape == q.shape for p, q in zip(first.state_dict().values(), second.state_dict().values())):
                losses = interpolate(first, first.state_dict(), second.state_dict(), loss_fn, alphas)
            else:
                continue
            barriers.append({'from': a, 'to': b, 'losses': losses, 'barrier': barrier(losses)})
        result['interpolation'] = barriers
    if reference_dense is not None:  # Beyond Perplexity's barrier between this model and the reference's
        ours = dense_state(model)
        if ours is None:
            result['barrier_to_reference'] = 'not computed: CoLA-style factors (CoLA, DLR, Low-Rank) have no dense W; ' \
                                             'their factors of two models do not interpolate meaningfully'
        elif {k: v.shape for k, v in ours.items()} != {k: v.shape for k, v in reference_dense.items()}:
            result['barrier_to_reference'] = 'not computed: other shapes than the reference'
        else:
            losses = interpolate(full_rank_twin(model), reference_dense, ours, loss_fn, alphas)
            result['barrier_to_reference'] = {'losses': losses, 'barrier': barrier_between_models(losses)}
    if similarity and reference_hidden is not None:
        result['similarity'] = [similarity_of(i, h, r) for i, (h, r) in enumerate(zip(hidden, reference_hidden))]
    return result


# ----------------------------------------------------------------------------- downstream

def leave_one_out_error(X, y):
    """Root mean squared error of predicting each y_i from a least-squares fit (with an intercept) on the
    other runs' features X."""
    X = np.column_stack([np.ones(len(y)), np.asarray(X, dtype=np.float64)])
    errors = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        coef, *_ = np.linalg.lstsq(X[keep], y[keep], rcond=None)
        errors.append(X[i] @ coef - y[i])
    return float(np.sqrt(np.mean(np.square(errors))))


def downstream_prediction(results):
    """Over the runs with downstream scores (evaluate.json in their out_dir): how well validation loss alone
    predicts each task's accuracy, and whether the geometric and spectral metrics improve the prediction
    (Beyond Perplexity's claim): the leave-one-out error of a linear fit on val loss, and on val loss plus
    the random-direction sharpness and the weights' effective rank. Needs 6 runs or more (else None)."""
    runs = [r for r in results if 'downstream' in r and 'landscape' in r and 'weights' in r]
    if len(runs) < 6:
        return None
    out = {}
    for task in runs[0]['downstream']:
        y = np.array([r['downstream'][task] for r in runs])
        loss = [[r['val_loss']] for r in runs]
        geometry = [[r['val_loss'], r['landscape']['sharpness_mean'], r['weights']['effective_rank']] for r in runs]
        out[task] = {'runs': len(runs), 'spread': float(np.std(y)), 'error_loss_only': leave_one_out_error(loss, y),
                     'error_loss_and_geometry': leave_one_out_error(geometry, y)}
    return out


# ----------------------------------------------------------------------------- report

def markdown(results):
    """analysis.md: a table per kind of metric, a row per run (named by its folder); where a cell is empty it
    says why (the metric switched off, or what the run lacks)."""
    def cell(value, form='.3g', why='off'):
        return why if value is None else f'{value:{form}}'

    def trajectory_why(switch, r):  # an empty cell of the metrics between consecutive checkpoints
        return ('off' if not switch else 'no trajectory: train with keep_checkpoints=True' if r.get('checkpoints', 0) < 2
                else 'checkpoints of other shapes')

    def name(r):
        return os.path.basename(os.path.normpath(r['run']))

    lines = ['Losses and landscape (sharpness: the expected sharpness along random directions, mean ± spread, and along '
             'the top singular directions s_k u_k v_k^T of every 2-D parameter at once; barriers: between consecutive '
             'checkpoints, the excess over the straight line, mean and largest; to the reference: on dense W at the '
             'same step):', '',
             '| run | iter | val loss | sharpness (random) | top-1 | top-5 mean | barriers between checkpoints | '
             'barrier to the reference | downstream accuracy |', '|---|---|---|---|---|---|---|---|---|']
    for r in results:
        land, barriers, imib = r.get('landscape'), [b['barrier'] for b in r.get('interpolation', [])], r.get('barrier_to_reference')
        lines.append(f"| {name(r)} | {r['iter']} | {r['val_loss']:.4f} | "
                     + (f"{land['sharpness_mean']:.3g} ± {land['sharpness_std']:.2g}" if land else 'off') + ' | '
                     + f"{cell(r['top_k'][0]['sharpness'] if r.get('top_k') else None)} | "
                     + f"{cell(r.get('top_k_means', {}).get('top_5'), why='off' if not land else 'top_k < 5')} | "
                     + (f"{np.mean(barriers):.3g}, {max(barriers):.3g}" if barriers else trajectory_why(interpolation, r)) + ' | '
                     + (f"{imib['barrier']:.3g}" if isinstance(imib, dict) else 'n/a (factors)' if imib
                        else 'off' if not interpolation else 'no --reference') + ' | '
                     + (', '.join(f'{t} {a:.3f}' for t, a in r['downstream'].items()) if r.get('downstream')
                        else 'no scores: run evaluate.py on it') + ' |')
    if any(r.get('weights') for r in results):
        lines += ['', 'Weight spectra (mean over the matrices trained; CoLA-style: the factors, their product A @ B apart) '
                  'and updates dW between consecutive checkpoints (first -> last):', '',
                  '| run | effective rank | stable rank | spectral gap | s > 0.1 | product A @ B: eff. rank | '
                  'relative update ‖dW‖ / ‖W‖ | update eff. rank |', '|---|---|---|---|---|---|---|---|']
        for r in results:
            w, product, steps = r.get('weights', {}), r.get('weights_product', {}), r.get('updates', [])
            lines.append(f"| {name(r)} | {cell(w.get('effective_rank'), '.1f')} | {cell(w.get('stable_rank'), '.2f')} | "
                         f"{cell(w.get('spectral_gap'), '.3f')} | {cell(w.get('above_0.1'), '.1f')} | "
                         f"{cell(product.get('effective_rank'), '.1f', 'n/a (no factors)')} | "
                         f"{first_to_last(steps, 'relative_norm', '.3f') or trajectory_why(updates, r)} | "
                         f"{first_to_last(steps, 'effective_rank', '.1f') or trajectory_why(updates, r)} |")
    kinds = ['q', 'k', 'v', 'o', 'gate', 'up', 'down']
    if any(r.get('activations') for r in results):
        lines += ['', f"Activation ranks (CoLA's observation): per projection type, mean over layers, over "
                  f"{activation_tokens} tokens: the rank holding 90% of the energy / the effective rank; z: CoLA's "
                  f"r-wide latent x A, mean over the types", '',
                  '| run | ' + ' | '.join(f"{k} ({w})" for k, w in widths(results, kinds)) + ' | z |',
                  '|---|' + '---|' * (len(kinds) + 1)]
        for r in results:
            a = r.get('activations', {})
            z = [a[k + ' z'] for k in kinds if k + ' z' in a]
            lines.append(f"| {name(r)} | " + ' | '.join(f"{a[k]['rank_90']:.1f} / {a[k]['effective_rank']:.1f}" if k in a
                                                         else 'off' if not a else 'n/a (no such layer)' for k in kinds)
                         + (f" | {np.mean([s['rank_90'] for s in z]):.1f} / {np.mean([s['effective_rank'] for s in z]):.1f} |"
                            if z else ' | off |' if not a else ' | n/a (no latent z) |'))
    if any(r.get('similarity') for r in results):
        layers = max(len(r.get('similarity') or []) for r in results)
        lines += ['', 'Linear CKA of the hidden states with the reference\'s, per layer (0: the embedding; last: after '
                  'the final norm):', '', '| run | ' + ' | '.join(map(str, range(layers))) + ' |', '|---|' + '---|' * layers]
        lines += [f"| {name(r)} | " + ' | '.join(f"{s['cka']:.3f}" for s in r['similarity']) + ' |'
                  for r in results if r.get('similarity')]
    prediction = downstream_prediction(results)
    if prediction:
        lines += ['', 'Predicting downstream accuracy across these runs (leave-one-out RMSE of a linear fit; at this '
                  'CPU scale, with this few runs, a hint, not a finding):', '',
                  '| task | runs | spread (std) | from val loss | from val loss + sharpness + effective rank |',
                  '|---|---|---|---|---|']
        lines += [f"| {t} | {p['runs']} | {p['spread']:.4f} | {p['error_loss_only']:.4f} | {p['error_loss_and_geometry']:.4f} |"
                  for t, p in prediction.items()]
    return '\n'.join(lines)


def first_to_last(steps, key, form):
    return f"{steps[0][key]:{form}} -> {steps[-1][key]:{form}}" if steps else ''


def widths(results, kinds):
    """(projection type, its output width) as the first run with activations measured them."""
    a = next(r['activations'] for r in results if r.get('activations'))
    return [(k, a[k]['width'] if k in a else '?') for k in kinds]


def plots(results, folder):
    try:
        import matplotlib
        matplotlib.use('Agg')  # to files, no display
        import matplotlib.pyplot as plt
    except ImportError:
        return print("matplotlib is not installed: no plots (pip install matplotlib)")
    colours = plt.get_cmap('tab20').colors[::2] + plt.get_cmap('tab20').colors[1::2]  # eleven runs, eleven colours
    if any('landscape' in r for r in results):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.set_prop_cycle(color=colours)
        for r in (r for r in results if 'landscape' in r):
            curves = np.array(r['landscape']['curves'])
            mean = curves.mean(0)
            line, = ax.plot(r['landscape']['t'], mean, label=os.path.basename(r['run']))
            ax.fill_between(r['landscape']['t'], curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2)
        ax.set(xlabel='t (random direction)', ylabel='validation loss')
        ax.legend(fontsize=8)
        fig.tight_layout()
        write_durably(os.path.join(folder, 'landscape.png'), lambda f: fig.savefig(f, format='png', dpi=100))
    if any(r.get('similarity') for r in results):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.set_prop_cycle(color=colours)
        for r in (r for r in results if r.get('similarity')):
            ax.plot([s['layer'] for s in r['similarity']], [s['cka'] for s in r['similarity']], marker='o',
                    label=os.path.basename(r['run']))
        ax.set(xlabel='layer (0: embedding; last: after the final norm)', ylabel='linear CKA with the reference')
        ax.legend(fontsize=8)
        fig.tight_layout()
        write_durably(os.path.join(folder, 'cka.png'), lambda f: fig.savefig(f, format='png', dpi=100))


def write_results(results, finished):
    """analysis.json and analysis.md, each written whole (temporary file, rename). Until every run is analysed they
    go to analysis.partial.json / .md, so that a rerun that fails partway leaves a complete earlier analysis as it
    was, beside the runs it did finish."""
    os.makedirs(out_dir, exist_ok=True)
    report = {'runs': results, 'downstream_prediction': downstream_prediction(results)}
    stem = os.path.join(out_dir, 'analysis' if finished else 'analysis.partial')
    write_durably(stem + '.json', lambda f: f.write(json.dumps(report, indent=1).encode()))
    write_durably(stem + '.md', lambda f: f.write((markdown(results) + '\n').encode()))
    for partial in ('analysis.partial.json', 'analysis.partial.md'):
        if finished and os.path.exists(os.path.join(out_dir, partial)):
            os.remove(os.path.join(out_dir, partial))


if __name__ == '__main__':
    globals().update(configure(public_settings(globals()), sys.argv[1:]))
    if not runs:
        raise SystemExit("runs='': give --runs=out_dir1,out_dir2 (train.py out_dirs)")
    if grid < 3 or grid % 2 == 0 or alphas < 2 or directions < 0 or top_k < 0 or not top_k_t_max > 0:
        raise SystemExit(f"grid={grid}, alphas={alphas}, directions={directions}, top_k={top_k}: expected an odd grid "
                         f"of at least 3 points, at least 2 alphas, and directions, top_k >= 0")
    for name, value in [('batch_size', batch_size), ('eval_tokens', eval_tokens), ('activation_tokens', activation_tokens)]:
        if value < 1:
            raise SystemExit(f"{name}={value}: expected a positive number")
    make_writable_folder(out_dir)  # before hours of analysis, not after
    # every run's checkpoint checked before the first is analysed: a bad one costs no finished work
    encodings, data_of, shapes = {}, {}, {}
    for run_dir in runs.split(',') + ([reference] if reference and similarity else []):
        path = os.path.join(run_dir, 'ckpt.pt')
        if not os.path.exists(path):
            raise SystemExit(f"no checkpoint {path}: analyze.py reads train.py's out_dirs")
        checkpoint = load_checkpoint(path)
        encodings[run_dir], data_of[run_dir] = checkpoint['encoding'], checkpoint.get('data_splits')
        shapes[run_dir] = {k: checkpoint['model_config'][k] for k in ('n_layer', 'n_embd', 'block_size')}
    if reference and similarity and len(set(encodings.values())) > 1:
        other = next(r for r, e in encodings.items() if e != encodings[reference])
        raise SystemExit(f"{other} was trained on {encodings[other]!r} tokens and the reference {reference} on "
                         f"{encodings[reference]!r} tokens: their hidden states are not of the same tokens")
    for run_dir in runs.split(',') if reference and similarity else []:  # hidden states compared vector by vector
        if shapes[run_dir] != shapes[reference]:
            raise SystemExit(f"{run_dir} has {shapes[run_dir]} where the reference {reference} has {shapes[reference]}: "
                             f"similarity compares hidden states of the same shape; leave that run out, or --similarity=False")
        if not data_dir and data_of[run_dir] != data_of[reference]:  # each run would be measured on its own text
            raise SystemExit(f"{run_dir} and the reference {reference} were trained on different data: their hidden "
                             f"states would be of different text; give --data_dir= to measure every run on the same tokens")
    torch.manual_seed(seed)
    reference_hidden = reference_dense = None
    if reference and similarity:  # the reference's hidden states on the same tokens
        model, checkpoint = load_run(os.path.join(reference, 'ckpt.pt'))
        tokens = Loss(run_data_dir(checkpoint, reference), eval_tokens, model.config.block_size).x
        reference_hidden = outputs(model, tokens[:max(1, activation_tokens // model.config.block_size)])[1]
        reference_dense = dense_state(model) if interpolation else None
    results = []
    for i, run_dir in enumerate(runs.split(',')):
        print(f"analysing {run_dir} ...", flush=True)
        results.append(analyze(run_dir, reference_hidden, reference_dense))
        if i + 1 < len(runs.split(',')):
            write_results(results, finished=False)  # each finished run's results kept, whatever happens to the next
    plots(results, out_dir)
    write_results(results, finished=True)
    print(markdown(results))
    print(f"wrote {out_dir}/analysis.json, analysis.md and the plots")
