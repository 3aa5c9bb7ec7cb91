"""
train.py on one CUDA GPU, as a user runs it: full-rank, CoLA and CoLA-M at the 130m config (compiled, train.py's
default, and eager) and at the 1b widths (fewer layers), bf16. Each run trains `steps` steps on byte-level
Shakespeare (the vocabulary padded to GPT-2's 50,304, so the shapes are the configs'), one record per step, and
the table takes from train.py's own log.jsonl: tokens/s and MFU (medians over the steps after the first five),
peak memory, and the first step's seconds (compilation included) apart. Run by .ci/gpu_check; each run has its
own time limit and every run's output in $OUT/train_runs.txt (the device tool brings back
8 files at most), the table printed last.

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
steps = 4 if smoke else 25
work = os.path.join(OUT if smoke else '/tmp', 'gpu_train')
data = os.path.join(work, 'data')

# (label, config, extra settings, time limit in seconds); the surest first: eager before compiled
L1B = ['--n_layer=4', '--batch_size=16']  # the 1b widths, 4 of its 24 layers, its micro-batch
RUNS = [
    ('130m full-rank eager', 'config/full_130m.py', ['--compile_model=False'], 40),
    ('130m cola eager', 'config/cola_130m.py', ['--compile_model=False'], 40),
    ('130m cola-m eager', 'config/cola_130m.py', ['--compile_model=False', '--checkpointing=cola-m'], 40),
    ('1b-width full-rank', 'config/full_1b.py', L1B, 75),
    ('1b-width cola', 'config/cola_1b.py', L1B, 75),
    ('1b-width cola-m', 'config/cola_1b.py', L1B + ['--checkpointing=cola-m'], 75),
    ('130m full-rank', 'config/full_130m.py', [], 60),
    ('130m cola', 'config/cola_130m.py', [], 60),
    ('130m cola-m', 'config/cola_130m.py', ['--checkpointing=cola-m'], 60),
]
deadline = time.time() + float(os.environ.get('GPU_TRAIN_BUDGET_S', 300))  # all runs together
COMMON = [f'--data_dir={data}', f'--max_iters={steps}', f'--lr_decay_iters={steps}', '--warmup_iters=2',
          '--log_interval=1', '--eval_interval=100000', '--eval_tokens=1', '--keep_best=False', '--vocab_size=50304',
          '--gradient_accumulation_steps=1']
if smoke:
    COMMON += ['--device=cpu', '--dtype=float32', '--compile_model=False', '--n_layer=1', '--n_embd=64', '--n_head=2',
               '--intermediate_size=128', '--block_size=32', '--batch_size=2', '--vocab_size=320']
    RUNS = [(label, config, [a for a in extra if a.startswith(('--checkpointing', '--parallel'))], 120) for label, config, extra, _ in RUNS]
    RUNS = [(label, config, extra + (['--rank=16'] if 'cola' in label else []), limit) for label, config, extra, limit in RUNS]

os.makedirs(OUT, exist_ok=True)
if os.path.exists(os.path.join(OUT, 'train_runs.txt')):
    os.remove(os.path.join(OUT, 'train_runs.txt'))
if not os.path.exists(os.path.join(data, 'meta.json')):
    subprocess.run([sys.executable, 'prepare.py', '--input_files=assets/tinyshakespeare.txt', '--encoding=byte',
                    f'--out_dir={data}', '--val_tokens=65536'], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)

rows = ['| run | tokens/s | x full-rank | MFU | peak memory GiB | first step s | ms/step |', '|---|---|---|---|---|---|---|']
full_rank = {}
for label, config, extra, limit in RUNS:
    out_dir = os.path.join(work, label.replace(' ', '_'))
    command = [sys.executable, 'train.py', config, *COMMON, *extra, f'--out_dir={out_dir}', '--start_over=True']
    t0 = time.time()
    limit = min(limit, deadline - t0)
    if limit < 20:
        rows.append(f'| {label} | not run: the time budget is spent | | | | | |')
        continue
    with open(os.path.join(OUT, 'train_runs.txt'), 'a') as f:
        f.write(f"\n===== {label}: {' '.join(command[1:])}\n")
        f.flush()
        try:
            code = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = f'over {limit} s'
    records = []
    if os.path.exists(os.path.join(out_dir, 'log.jsonl')):
        records = [r for r in map(json.loads, open(os.path.join(out_dir, 'log.jsonl'))) if 'tokens_per_s' in r]
    if code != 0 or len(records) < steps:
        rows.append(f'| {label} | failed ({code}, {len(records)} of {steps} steps, {time.time() - t0:.0f} s) | | | | | |')
        print(rows[-1], flush=True)
        continue
    later = records[5:] if len(records) > 5 else records[1:]
    tokens_s = statistics.median(r['tokens_per_s'] for r in later)
    mfu = statistics.median(r['mfu'] for r in later) if later[0]['mfu'] else None
    group = (label.split()[0], label.endswith('eager'))  # (size, eager or compiled): full-rank's row is the unit
    if 'full-rank' in label:
        full_rank[group] = tokens_s
    ratio = tokens_s / full_rank[group] if group in full_rank else None
    memory = max((r['peak_memory_gib'] or 0) for r in records)
    rows.append(f"| {label} | {tokens_s:,.0f} | {f'{ratio:.2f}x' if ratio else '-'} | "
                f"{f'{mfu:.1%}' if mfu else '-'} | {memory:.1f} | {records[0]['ms_per_iter'] / 1000:.1f} | "
                f"{statistics.median(r['ms_per_iter'] for r in later):.1f} |")
    print(rows[-1], flush=True)
print('\n'.join(rows))
