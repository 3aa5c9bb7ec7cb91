"""
train.py on one CUDA GPU, as a user runs it: full-rank, CoLA and CoLA-M at the 130m config (compiled, train.py's
default on a GPU), then at the 1b widths with 12 of its 24 layers (eager; the FLOP ratio CoLA's 1.8x claim needs),
then the 1b widths with an aligned intermediate size (5504 beside the official 5461, whose odd rows keep bf16 GEMMs
off cuBLAS's fast kernels), then a 1-process FSDP2 run under torchrun (the path the 1b and 7b configs take). Each
run trains `steps` steps with --measure_only (no evaluation, no checkpoint: nothing to compile or write beyond the
training step) on byte-level Shakespeare, the vocabulary padded to GPT-2's 50,304 so that the shapes are the
configs'. A run counts by its logged steps, not by its exit code. The table takes from train.py's own log.jsonl:
tokens/s and MFU (medians over the steps after the first five; for CoLA-M also HFU, which counts its recomputation),
peak memory, peak minus what stays between steps (weights, optimizer states: the step's activations, logits and
gradients), and the first step's seconds (compilation included) apart. Each run has its own time limit inside
GPU_TRAIN_BUDGET_S; every run's output goes to $OUT/train_runs.txt, the table to stdout.

    python .ci/gpu_train.py [--smoke]    # --smoke: tiny shapes on the CPU, to check this script
"""
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
OUT = os.environ.get('OUT', os.path.join(ROOT, 'gpu-results'))
smoke = '--smoke' in sys.argv
steps = 4 if smoke else 15
work = os.path.join(OUT if smoke else '/tmp', 'gpu_train')
data = os.path.join(work, 'data')

# (label, config, extra settings, processes under torchrun (0: plain python), time limit in seconds), most valuable first
L1B = ['--n_layer=12', '--batch_size=16', '--compile_model=False']  # the 1b widths, 12 of its 24 layers, its micro-batch
RUNS = [
    ('130m full-rank', 'config/full_130m.py', [], 0, 65),
    ('130m cola', 'config/cola_130m.py', [], 0, 65),
    ('130m cola-m', 'config/cola_130m.py', ['--checkpointing=cola-m'], 0, 70),
    ('1b-width full-rank', 'config/full_1b.py', L1B, 0, 35),
    ('1b-width cola', 'config/cola_1b.py', L1B, 0, 35),
    ('1b-width cola-m', 'config/cola_1b.py', L1B + ['--checkpointing=cola-m'], 0, 35),
    ('1b-width full-rank f=5504', 'config/full_1b.py', L1B + ['--intermediate_size=5504'], 0, 30),
    ('1b-width cola f=5504', 'config/cola_1b.py', L1B + ['--intermediate_size=5504'], 0, 30),
    ('1b-width cola fsdp2', 'config/cola_1b.py', L1B + ['--parallel=fsdp'], 1, 40),
]
deadline = time.time() + float(os.environ.get('GPU_TRAIN_BUDGET_S', 300))  # all runs together
COMMON = [f'--data_dir={data}', f'--max_iters={steps}', f'--lr_decay_iters={steps}', '--warmup_iters=2',
          '--log_interval=1', '--measure_only=True', '--vocab_size=50304', '--gradient_accumulation_steps=1']
if smoke:
    COMMON += ['--device=cpu', '--dtype=float32', '--compile_model=False', '--n_layer=1', '--n_embd=64', '--n_head=2',
               '--intermediate_size=128', '--block_size=32', '--batch_size=2', '--vocab_size=320']
    RUNS = [(label, config, [a for a in extra if a.startswith(('--checkpointing', '--parallel'))]
             + (['--rank=16'] if 'cola' in label else []), procs, 120) for label, config, extra, procs, _ in RUNS]

os.makedirs(OUT, exist_ok=True)
if os.path.exists(os.path.join(OUT, 'train_runs.txt')):
    os.remove(os.path.join(OUT, 'train_runs.txt'))
if not os.path.exists(os.path.join(data, 'meta.json')):
    subprocess.run([sys.executable, 'prepare.py', '--input_files=assets/tinyshakespeare.txt', '--encoding=byte',
                    f'--out_dir={data}', '--val_tokens=65536'], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)

rows = ['| run | tokens/s | x full-rank | MFU | HFU | peak memory GiB | peak - resident GiB | first step s | ms/step |',
        '|---|---|---|---|---|---|---|---|---|']
full_rank = {}
for label, config, extra, procs, limit in RUNS:
    out_dir = os.path.join(work, label.replace(' ', '_').replace('=', ''))
    launcher = ['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={procs}'] if procs else []
    command = [sys.executable, *launcher, 'train.py', config, *COMMON, *extra, f'--out_dir={out_dir}', '--start_over=True']
    t0 = time.time()
    limit = min(limit, deadline - t0)
    if limit < 15:
        rows.append(f'| {label} | not run: the time budget is spent | | | | | | | |')
        continue
    with open(os.path.join(OUT, 'train_runs.txt'), 'a') as f:
        f.write(f"\n===== {label}: {' '.join(command[1:])}\n")
        f.flush()
        try:
            code = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = f'over {limit:.0f} s'
    records = []
    if os.path.exists(os.path.join(out_dir, 'log.jsonl')):
        records = [r for r in map(json.loads, open(os.path.join(out_dir, 'log.jsonl'))) if 'tokens_per_s' in r]
    if len(records) < min(steps, 3):  # judged by the steps it logged: a late failure keeps its measurement
        rows.append(f'| {label} | failed ({code}, {len(records)} of {steps} steps, {time.time() - t0:.0f} s) | | | | | | | |')
        print(rows[-1], flush=True)
        continue
    later = records[5:] if len(records) > 5 else records[1:]
    tokens_s = statistics.median(r['tokens_per_s'] for r in later)
    mfu = statistics.median(r['mfu'] for r in later) if later[0]['mfu'] else None
    hfu = statistics.median(r['hfu'] for r in later) if later[0].get('hfu') else None
    group = label.split()[0] + (' f=5504' if '5504' in label else '')  # full-rank's row of the group is the unit
    if 'full-rank' in label:
        full_rank[group] = tokens_s
    ratio = tokens_s / full_rank[group] if group in full_rank else None
    memory = max((r['peak_memory_gib'] or 0) for r in records)
    resident = records[-1].get('resident_memory_gib')
    rows.append(f"| {label}{'' if code == 0 else f' (exit {code})'} | {tokens_s:,.0f} | {f'{ratio:.2f}x' if ratio else '-'} | "
                f"{f'{mfu:.1%}' if mfu else '-'} | {f'{hfu:.1%}' if hfu else '-'} | {memory:.1f} | "
                f"{f'{memory - resident:.1f}' if resident is not None else '-'} | {records[0]['ms_per_iter'] / 1000:.1f} | "
                f"{statistics.median(r['ms_per_iter'] for r in later):.1f} |")
    print(rows[-1], flush=True)
print('\n'.join(rows))
