"""
CoLA against full-rank on the same data, side by side: does CoLA reach full-rank loss with half the
compute, does CoLA-M reproduce CoLA's curve with less memory, and what do DLR and ELAS add?

    python prepare.py --input_files=assets/tinyshakespeare.txt --encoding=byte --out_dir=data/tiny
    python compare.py                        # the CPU default: about 35 minutes on 2 cores
    python compare.py config/compare_60m.py  # 60m shapes on C4 shards, one GPU

Every run is train.py on the same prepared data, with the same shapes, steps, schedule and token
stream: full-rank and CoLA at each of their peak learning rates (a small sweep), CoLA-M, DLR and ELAS
(dense for the first elas_warmup of the steps) at CoLA's best one, and TSVD (starting at CoLA's rank,
adapting it tsvd_adaptations times) at full-rank's best one. Each run writes out_dir/<run>/log.jsonl (train and val loss, tokens, FLOPs, wall time);
from those logs this script writes out_dir/compare.md (a Markdown table) and, when matplotlib is
installed, out_dir/compare.png (validation loss against tokens and against training FLOPs).
A finished run is not run again, so an interrupted comparison continues where it stopped.
"""

import json
import math
import os
import subprocess
import sys

from configurator import configure, public_settings

# ----------------------------------------------------------------------------- config
out_dir = 'out-compare'
data_dir = 'data/tiny'
n_layer = 4
n_head = 4
n_embd = 256
intermediate_size = 688
rank = 64
only_lr_act = False
block_size = 256
batch_size = 8
gradient_accumulation_steps = 1
max_iters = 400
warmup_iters = 40
eval_interval = 50
eval_tokens = 65536
full_rank_lrs = (3e-4, 1e-3, 3e-3)  # peak learning rates swept for full-rank ...
cola_lrs = (1e-3, 3e-3, 6e-3)  # ... and for CoLA; CoLA-M, DLR and ELAS run at CoLA's best
elas_warmup = 0.1  # ELAS's dense warm-up, as a fraction of max_iters (the paper: 1,000 of 10,000 steps)
tsvd_adaptations = 10  # TSVD adapts its ranks this many times, every max_iters / tsvd_adaptations steps
device = 'cpu'
dtype = 'float32'
compile_model = False
nproc = 1  # processes per run (torchrun), e.g. GPUs


def train(name, lr, **model):
    """Run train.py into out_dir/name (unless it already finished) and return its log records."""
    run_dir = os.path.join(out_dir, name)
    log_path = os.path.join(run_dir, 'log.jsonl')
    if not (os.path.exists(log_path) and any(r.get('iter') == max_iters and 'val_loss' in r for r in read_log(log_path))):
        if os.path.exists(log_path):
            os.remove(log_path)  # an unfinished run starts over, so its log holds one run
        args = [f'--{k}={v}' for k, v in dict(
            data_dir=data_dir, out_dir=run_dir, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
            intermediate_size=intermediate_size, only_lr_act=only_lr_act, block_size=block_size, batch_size=batch_size,
            gradient_accumulation_steps=gradient_accumulation_steps, max_iters=max_iters, lr_decay_iters=max_iters,
            warmup_iters=warmup_iters, eval_interval=eval_interval, eval_tokens=eval_tokens, learning_rate=lr,
            min_lr=lr / 10, device=device, dtype=dtype, compile_model=compile_model, keep_best=False, log_interval=10, **model).items()]
        launcher = [sys.executable] if nproc == 1 else [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                                         f'--nproc_per_node={nproc}']
        print(f"run {len(finished) + 1} of {total_runs}, {name}: training ...", flush=True)
        done = subprocess.run(launcher + [os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')] + args)
        if done.returncode != 0:
            raise SystemExit(f"run {name} failed (exit {done.returncode}); its output is above")
    finished.append(name)
    return read_log(log_path)


def read_log(path):
    """The records of a run's log.jsonl; where a run resumed, the records of the steps it redid replace
    those of the run that stopped."""
    records = []
    for record in map(json.loads, open(path)):
        if 'resumed_at' in record:
            n = record['resumed_at']  # the resumed run evaluates at n again
            records = [r for r in records if r.get('iter', -1) < n or (r.get('iter') == n and 'val_loss' not in r)]
        else:
            records.append(record)
    return records


def summary(name, lr, records):
    """The table row of one run, computed from its log."""
    header = records[0]
    evals = [r for r in records if 'val_loss' in r]
    steps = [r for r in records if 'loss' in r and r['iter'] > 10]  # leave out the first steps (warm-up)
    final = evals[-1]
    adapted = [r for r in records if 'tsvd_ranks' in r]  # TSVD: the shapes after the last rank change
    last = adapted[-1] if adapted else header
    return {'run': name, 'lr': lr, 'val_loss': final['val_loss'], 'ppl': math.exp(final['val_loss']),
            'params_M': last['model_params'] / 1e6, 'flops_per_token': last['flops_per_token'],
            'flops_spent': final['flops'], 'tokens': final['tokens'],
            'ranks': [(r['iter'], r['tsvd_ranks']) for r in adapted],
            'tokens_per_s': sorted(r['tokens_per_s'] for r in steps)[len(steps) // 2] if steps else None,
            'wall_s': records[-1]['elapsed_s'], 'evals': [(r['tokens'], r['flops'], r['val_loss']) for r in evals]}


def markdown(rows, best_full, best_cola, colam):
    lines = ['| run | peak lr | val loss | perplexity | params (M) | GFLOPs/token | tokens/s | wall time (s) | gap to full-rank |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        gap = (r['val_loss'] / best_full['val_loss'] - 1) * 100
        lines.append(f"| {r['run']} | {r['lr']:g} | {r['val_loss']:.4f} | {r['ppl']:.3f} | {r['params_M']:.2f} | "
                     f"{r['flops_per_token'] / 1e9:.3g} | {r['tokens_per_s']:,.0f} | {r['wall_s']:.1f} | {gap:+.2f}% |")
    deviation = max(abs(a[2] - b[2]) for a, b in zip(best_cola['evals'], colam['evals']))
    lines += ['', f"Best CoLA ({best_cola['run']}) ends {(best_cola['val_loss'] / best_full['val_loss'] - 1) * 100:+.2f}% "
              f"from the best full-rank run ({best_full['run']}) in validation loss, with "
              f"{best_cola['flops_per_token'] / best_full['flops_per_token']:.2f}x its training FLOPs per token and "
              f"{best_cola['params_M'] / best_full['params_M']:.2f}x its parameters. CoLA-M's validation losses differ "
              f"from CoLA's at the same lr by at most {deviation:.2e}."]
    for r in rows[-3:]:  # DLR, ELAS and TSVD
        lines.append(f"{r['run']} ends {(r['val_loss'] / best_cola['val_loss'] - 1) * 100:+.2f}% from best CoLA and "
                     f"{(r['val_loss'] / best_full['val_loss'] - 1) * 100:+.2f}% from best full-rank.")
    return '\n'.join(lines)


def rank_table(row):
    """TSVD's mean rank per projection type after each rank change, and its final size."""
    types = ['q', 'k', 'v', 'o', 'gate', 'up', 'down']
    lines = [f"{row['run']}: mean rank per projection type after each adaptation (start: {rank})", '',
             '| iter | ' + ' | '.join(types) + ' |', '|---|' + '---|' * len(types)]
    for it, ranks in row['ranks']:
        means = [sum(ranks[i::len(types)]) / len(ranks[i::len(types)]) for i in range(len(types))]
        lines.append(f'| {it} | ' + ' | '.join(f'{m:.1f}' for m in means) + ' |')
    lines += ['', f"Final: {row['params_M']:.3f}M parameters, {row['flops_per_token'] / 1e9:.4f} GFLOPs per token; "
              f"{row['flops_spent'] / 1e12:.2f} TFLOPs spent in all."]
    return '\n'.join(lines)


def pyplot():
    """matplotlib.pyplot drawing to files, or None (saying so) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        tokens, flops, loss = zip(*r['evals'])
        style = dict(label=f"{r['run']}", linestyle='--' if r['run'].startswith('cola-m') else '-',
                     linewidth=2 if r['run'].startswith(('dlr', 'elas')) else 1)
        axes[0].plot(tokens, loss, **style)
        axes[1].plot(flops, loss, **style)
    for ax, xlabel in zip(axes, ['training tokens', 'training FLOPs']):
        ax.set_xlabel(xlabel)
        ax.set_ylabel('validation loss')
        ax.set_ylim(top=min(ax.get_ylim()[1], 1.5 * min(r['val_loss'] for r in rows)))
        ax.grid(alpha=0.3)
    axes[1].set_xscale('log')
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


if __name__ == '__main__':
    settings = configure(public_settings(globals()), sys.argv[1:])
    globals().update(settings)
    os.makedirs(out_dir, exist_ok=True)
    finished, total_runs = [], len(full_rank_lrs) + len(cola_lrs) + 4
    rows = []
    for lr in full_rank_lrs:
        rows.append(summary(f'full-rank-lr{lr:g}', lr, train(f'full-rank-lr{lr:g}', lr, rank=0)))
    for lr in cola_lrs:
        rows.append(summary(f'cola-lr{lr:g}', lr, train(f'cola-lr{lr:g}', lr, rank=rank)))
    best_full = min((r for r in rows if r['run'].startswith('full')), key=lambda r: r['val_loss'])
    best_cola = min((r for r in rows if r['run'].startswith('cola')), key=lambda r: r['val_loss'])
    lr = best_cola['lr']  # the methods built on CoLA's layers, at CoLA's best learning rate
    for method, options in [('cola-m', dict(checkpointing='cola_m')), ('dlr', dict(dlr_alpha=1.0)),
                            ('elas', dict(mlp='elas', elas_warmup_iters=round(elas_warmup * max_iters)))]:
        rows.append(summary(f'{method}-lr{lr:g}', lr, train(f'{method}-lr{lr:g}', lr, rank=rank, **options)))
    lr = best_full['lr']  # TSVD, a factorised linear layer like full-rank's, at full-rank's best learning rate
    tsvd_log = train(f'tsvd-lr{lr:g}', lr, rank=rank, layer='tsvd', tsvd_interval=max_iters // tsvd_adaptations)
    rows.append(summary(f'tsvd-lr{lr:g}', lr, tsvd_log))
    colam = rows[-4]
    table = markdown(rows, best_full, best_cola, colam) + '\n\n' + rank_table(rows[-1])
    with open(os.path.join(out_dir, 'compare.md'), 'w') as f:
        f.write(table + '\n')
    print(table)
    if plot(rows, os.path.join(out_dir, 'compare.png')):
        print(f"wrote {out_dir}/compare.md and {out_dir}/compare.png")
