"""
CoLA against full-rank on the same data, side by side: does CoLA reach full-rank loss with half the
compute, and does CoLA-M reproduce CoLA's curve with less memory?

    python prepare.py --input_files=assets/tinyshakespeare.txt --encoding=byte --out_dir=data/tiny
    python compare.py                        # the CPU default: about 20 minutes on 2 cores
    python compare.py config/compare_60m.py  # 60m shapes on C4 shards, one GPU

Every run is train.py on the same prepared data, with the same shapes, steps, schedule and token
stream: full-rank and CoLA at each of their peak learning rates (a small sweep), and CoLA-M at CoLA's
best one. Each run writes out_dir/<run>/log.jsonl (train and val loss, tokens, FLOPs, wall time);
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
cola_lrs = (1e-3, 3e-3, 6e-3)  # ... and for CoLA; CoLA-M runs at CoLA's best
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
    return {'run': name, 'lr': lr, 'val_loss': final['val_loss'], 'ppl': math.exp(final['val_loss']),
            'params_M': header['model_params'] / 1e6 if 'model_params' in header else None,
            'flops_per_token': header['flops_per_token'], 'tokens': final['tokens'],
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
    return '\n'.join(lines)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        tokens, flops, loss = zip(*r['evals'])
        style = dict(label=f"{r['run']}", linestyle='--' if r['run'].startswith('cola-m') else '-')
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
    finished, total_runs = [], len(full_rank_lrs) + len(cola_lrs) + 1
    rows = []
    for lr in full_rank_lrs:
        rows.append(summary(f'full-rank-lr{lr:g}', lr, train(f'full-rank-lr{lr:g}', lr, rank=0)))
    for lr in cola_lrs:
        rows.append(summary(f'cola-lr{lr:g}', lr, train(f'cola-lr{lr:g}', lr, rank=rank)))
    best_full = min((r for r in rows if r['run'].startswith('full')), key=lambda r: r['val_loss'])
    best_cola = min((r for r in rows if r['run'].startswith('cola')), key=lambda r: r['val_loss'])
    name = f"cola-m-lr{best_cola['lr']:g}"
    colam = summary(name, best_cola['lr'], train(name, best_cola['lr'], rank=rank, checkpointing='cola_m'))
    rows.append(colam)
    table = markdown(rows, best_full, best_cola, colam)
    with open(os.path.join(out_dir, 'compare.md'), 'w') as f:
        f.write(table + '\n')
    print(table)
    if plot(rows, os.path.join(out_dir, 'compare.png')):
        print(f"wrote {out_dir}/compare.md and {out_dir}/compare.png")
