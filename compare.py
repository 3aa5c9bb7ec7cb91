"""
Every method nanoCoLA has (full-rank, CoLA, CoLA-M, DLR, ELAS, TSVD, GaLore, Fira, Low-Rank, SLTrain, ReLoRA) trained
side by side on the same data, as close to the CoLA paper's regime (training tokens per parameter, shape ratios,
schedule) as two CPU cores allow in a few hours, with seeds: does CoLA reach full-rank loss with half the compute,
and how do the other low-rank methods compare?

    python prepare.py --input_files=assets/tinyshakespeare.txt --encoding=byte --out_dir=data/tiny
    python compare.py                           # the CPU default: 83 runs trained, about 3 h 40 min on 2 cores (docs/study.md)
    python compare.py config/compare_quick.py   # a first look: one seed, no sweep, about 16 minutes
    python compare.py config/compare_60m.py     # 60m shapes on C4, one GPU

Every run is train.py on the same prepared data, with the same shapes and the paper's schedule shape
(linear warm-up over `warmup` of the steps, cosine to a tenth of the peak), in two stages:
1. the learning-rate sweep, with seed seeds[0], every run as long as the study's (a shorter run favours larger
   rates): each method at each of sweep_lrs, then at the best of them times and divided by sqrt(2); the lowest
   final validation loss wins (a rate whose run diverges, train.py stopping at a nan or inf, loses), and that run
   is the method's seed-1 study run (out_dir/<method>-seed<s> links to it), not trained twice. CoLA-M computes
   CoLA's function exactly, so it takes CoLA's learning rate instead; a method named in learning_rates takes that
   one instead.
2. the comparison: each method at its best learning rate, once per seed in seeds. train.py's seed sets
   both the initial weights and the order of the training sequences, so seed s gives every method the
   same data order, and each gap to full-rank is taken within a seed before its mean and spread.
The methods' own schedules scale with the run: ELAS is dense for the first elas_warmup of the steps (the
paper: 1,000 of 10,000), TSVD adapts its ranks tsvd_adaptations times, at even intervals, and GaLore and
Fira refresh their projectors every galore_interval of the steps (the official 200 of 10,000), ReLoRA
merges every relora_interval of them (1,000 of 10,000) and re-warms over relora_restart_warmup (100).

Each run writes out_dir/<run>/log.jsonl; from those logs this script writes out_dir/compare.md (the
regime's arithmetic, the sweep, and each method's final validation loss and gaps to full-rank, at equal
steps and at equal FLOPs, as the mean +- the standard deviation over seeds) and, when matplotlib is
installed, out_dir/compare.png (the mean validation curve per method with a +-1 standard deviation band,
against tokens and against training FLOPs). Each study run's final checkpoint is also scored by evaluate.py
on its built-in downstream tasks (next-passage choice, last-word cloze; downstream_items of each), which
the table reports next to the loss, with the parameters each method trains and the bytes of its optimizer's
state (both read from the final checkpoint). The study's runs keep every evaluation's checkpoint for analyze.py
(keep_checkpoints; config/analyze_study.py). A finished run is not run again, so an interrupted study continues
where it stopped. Each run's output goes to out_dir/<run>/output.txt; `jobs` runs at a time share the cores.
"""

import ctypes
import fcntl
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

import torch

from configurator import configure, public_settings
from model import ModelConfig, Transformer, load_checkpoint
from shards import make_writable_folder, open_to_append, write_durably

# ----------------------------------------------------------------------------- config
out_dir = 'out-compare'  # the study's folder: one sub-folder per run, compare.md, compare.png
data_dir = 'data/tiny'  # token shards from prepare.py
n_layer = 2  # the study's model: transformer blocks
n_head = 4  # attention heads
n_embd = 128  # the model width d
intermediate_size = 344  # the paper's SwiGLU width, 8/3 d rounded as LLaMA's
rank = 32  # d / 4, the paper's ratio
block_size = 256  # tokens per training sequence
batch_size = 16  # sequences per step
gradient_accumulation_steps = 1  # micro-steps per step
max_iters = 1000  # 4.1M tokens: about 10 per full-rank non-embedding parameter
warmup = 0.1  # linear warm-up over this fraction of the steps, then cosine to a tenth of the peak lr
eval_interval = 100  # evaluate (and checkpoint) every this many steps
eval_tokens = 65536  # validation tokens per evaluation
methods = ('full-rank', 'cola', 'cola-m', 'dlr', 'elas', 'tsvd', 'galore', 'fira', 'low-rank', 'sltrain', 'relora')  # the methods studied, of METHODS
sweep_lrs = (2e-3, 4e-3, 8e-3, 1.6e-2)  # peak learning rates tried per method (GaLore's packages: 1e-2), then the best / and * sqrt(2)
learning_rates = ()  # (method, peak lr) pairs that skip the sweep, e.g. (('full-rank', 2e-3),)
seeds = (1, 2, 3)  # the study's seeds, each a run per method
dlr_alpha = 1.0  # DLR's alpha (the paper's 1.0)
elas_warmup = 0.1  # ELAS's dense warm-up, as a fraction of the steps
tsvd_adaptations = 10  # TSVD adapts its ranks this many times per run
galore_interval = 0.02  # GaLore / Fira refresh their projector every this fraction of the steps (official: 200 of 10,000)
galore_scale = 0.25  # GaLore's scale, Fira's alpha (the official scripts')
relora_interval = 0.1  # ReLoRA merges every this fraction of the steps (the comparisons' 1,000 of 10,000) ...
relora_restart_warmup = 0.01  # ... and re-warms its learning rate over this fraction (100 of 10,000)
device = 'cpu'  # 'cpu' or 'cuda'
dtype = 'float32'  # 'float32' or 'bfloat16'
compile_model = False  # torch.compile each run's model
nproc = 1  # processes per run (torchrun), e.g. GPUs
downstream_items = 200  # evaluate.py's built-in tasks on each study run's final checkpoint, items of each (0: off)
keep_checkpoints = True  # the study's runs keep every evaluation's checkpoint: the trajectories analyze.py reads
trend = ()  # instead of training: studies of other widths (out_dirs) whose full-rank and CoLA gaps out_dir/trend.md sets side by side
jobs = 1  # runs at a time, each on cpu_count / jobs cores: for many cores (2 cores: no faster, measured, see docs/study.md)

METHODS = ('full-rank', 'cola', 'cola-m', 'dlr', 'elas', 'tsvd', 'galore', 'fira', 'low-rank', 'sltrain', 'relora')
PAPER_TOKENS = 1.31e9  # the CoLA paper's 60M runs: 10,000 steps of 131,072 tokens ...
PAPER_PARAMS = 60e6  # ... for LLaMA-60M, about 22 tokens per parameter
PAPER_SHAPE = dict(n_layer=8, n_head=8, n_embd=512, intermediate_size=1376)  # its non-embedding part


def method_settings(method, steps):
    """train.py's settings for a method, its own schedules scaled to a run of that many steps. GaLore and Fira
    train the full-rank model and project its gradients at CoLA's rank."""
    galore = dict(rank=0, optimizer='galore', galore_rank=rank, galore_scale=galore_scale,
                  galore_update_interval=max(1, round(galore_interval * steps)))
    return dict(rank=rank) | {'full-rank': dict(rank=0), 'cola': {}, 'cola-m': dict(checkpointing='cola-m'),
                              'dlr': dict(dlr_alpha=dlr_alpha),
                              'elas': dict(mlp='elas', elas_warmup_iters=round(elas_warmup * steps)),
                              'tsvd': dict(projection='tsvd', tsvd_interval=max(1, steps // tsvd_adaptations)),
                              'galore': galore, 'fira': dict(galore, optimizer='fira'),
                              'low-rank': dict(projection='low-rank'), 'sltrain': dict(projection='sltrain'),
                              'relora': dict(projection='relora', relora_interval=max(1, round(relora_interval * steps)),
                                             relora_restart_warmup=max(1, round(relora_restart_warmup * steps)))}[method]


def regime():
    """The study's arithmetic, from the settings: tokens per run, parameters, tokens per parameter
    (full-rank's and CoLA's non-embedding parameters) and the schedules' lengths, with the paper's."""
    shape = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, intermediate_size=intermediate_size)
    with torch.device('meta'):  # counted, not allocated
        full, cola, paper_full = (Transformer(ModelConfig(vocab_size=64, block_size=block_size, rank=r, **s)).num_params()
                                  for s, r in [(shape, 0), (shape, rank), (PAPER_SHAPE, 0)])
    tokens = max_iters * batch_size * block_size * gradient_accumulation_steps * nproc
    return {'tokens': tokens, 'full_params': full, 'cola_params': cola, 'tokens_per_full_param': tokens / full,
            'tokens_per_cola_param': tokens / cola, 'rank_ratio': rank / n_embd, 'warmup_iters': round(warmup * max_iters),
            'elas_warmup_iters': method_settings('elas', max_iters)['elas_warmup_iters'],
            'tsvd_interval': method_settings('tsvd', max_iters)['tsvd_interval'],
            'galore_update_interval': method_settings('galore', max_iters)['galore_update_interval'],
            'relora_interval': method_settings('relora', max_iters)['relora_interval'],
            'paper_tokens_per_param': PAPER_TOKENS / PAPER_PARAMS, 'paper_tokens_per_full_param': PAPER_TOKENS / paper_full}


def plan_run(name, method, lr, seed):
    """What a run still needs, as (name, commands): train.py unless it finished (a finished run is reused only if it
    was trained with these settings; an unfinished one resumes from its checkpoint, or starts over without one),
    then, for a study run, evaluate.py on its final checkpoint unless that was scored already. Every run keeps its
    checkpoints: a sweep's run may turn out to be a study run."""
    run_dir, steps = os.path.join(out_dir, name), max_iters
    log_path, checkpoint = os.path.join(run_dir, 'log.jsonl'), os.path.join(run_dir, 'ckpt.pt')
    study_run = name.split('/')[0] != 'sweep'
    settings = dict(
        data_dir=data_dir, n_layer=n_layer, n_head=n_head, n_embd=n_embd, intermediate_size=intermediate_size,
        block_size=block_size, batch_size=batch_size, gradient_accumulation_steps=gradient_accumulation_steps,
        max_iters=steps, lr_decay_iters=steps, warmup_iters=round(warmup * steps), eval_interval=eval_interval,
        eval_tokens=eval_tokens, learning_rate=lr, min_lr=lr / 10, seed=seed, device=device, dtype=dtype,
        compile_model=compile_model, keep_best=False, keep_checkpoints=keep_checkpoints, log_interval=10,
        **method_settings(method, steps))
    records = read_log(log_path) if os.path.exists(log_path) else []
    for key, value in settings.items() if records else ():
        old = records[0]['config'].get(key)
        # floats to 1e-12: a rate reached two ways (8e-3 / sqrt(2), 4e-3 * sqrt(2)) differs in its last bit
        same = math.isclose(old, value, rel_tol=1e-12) if isinstance(value, float) and isinstance(old, float) else old == value
        if key not in ('device', 'compile_model', 'log_interval') and not same:
            raise SystemExit(f"{run_dir}/ holds a run trained with {key}={old!r}, not {value!r}: give this study "
                             f"another out_dir (a run is reused only with its own settings)")
    here = os.path.dirname(os.path.abspath(__file__))
    commands = []
    # finished when its final state is on disk (the checkpoint says so, not the log alone) and its final evaluation is
    # recorded; else train.py resumes: it trains what the checkpoint lacks, or only evaluates a final one
    final_saved = os.path.exists(checkpoint) and load_checkpoint(checkpoint)['iter_num'] == steps
    diverged = not study_run and diverged_at(records) is not None  # a sweep's rate too large: its result, not rerun
    if not (diverged or final_saved and any(r.get('iter') == steps and 'val_loss' in r for r in records)):
        start = ['--init_from=resume'] if os.path.exists(checkpoint) else ['--start_over=True'] if records else []
        launcher = [sys.executable] if nproc == 1 else [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                                         f'--nproc_per_node={nproc}']
        commands.append(launcher + [os.path.join(here, 'train.py')] + [f'--{k}={v}' for k, v in settings.items()]
                        + [f'--out_dir={run_dir}'] + start)
    scores = os.path.join(run_dir, 'evaluate.json')
    unscored = (commands or read_scores(scores, downstream_items) is None  # (no commands: the final checkpoint is there)
                or os.path.getmtime(scores) < os.path.getmtime(checkpoint))
    if study_run and downstream_items and unscored:
        commands.append([sys.executable, os.path.join(here, 'evaluate.py'), f'--out_dir={run_dir}', f'--items={downstream_items}',
                         f'--device={device}', f'--context_tokens={min(64, block_size * 3 // 4)}',
                         f'--choice_tokens={min(16, block_size // 4)}'])
    return name, commands


def run_all(plans):
    """Carry out the runs' commands, `jobs` runs at a time (each run's commands in order), each run's output going to
    its out_dir/output.txt; then return the runs' summaries in the order given."""
    global runs_done, steps_left, steps_trained
    waiting, running = [p for p in plans if p[1]], {}  # running: process -> (name, commands left)
    records_before = {}  # name -> its log's record count at launch: what this invocation adds comes after
    training = {name for name, commands in plans if trains(commands)}
    runs_done += len(plans) - len(waiting)  # finished before: counted, not run again
    steps_left -= max_iters * sum(not trains(commands) and not os.path.islink(os.path.join(out_dir, name))
                                  for name, commands in plans)  # (a link: a sweep's winner, never counted in steps_left)
    threads = str(max(1, (os.cpu_count() or 1) // jobs))  # the cores shared out, not oversubscribed
    while waiting or running:
        while waiting and len(running) < jobs:
            name, commands = waiting.pop(0)
            runs_done += 1
            what = 'training' if trains(commands) else 'scoring'
            eta = (time.time() - started) / steps_trained * steps_left if steps_trained else None  # from this invocation's pace
            log_path = os.path.join(out_dir, name, 'log.jsonl')
            records_before[name] = len(read_log(log_path)) if os.path.exists(log_path) else 0
            print(f"run {runs_done} of {total_runs}, {name}: {what} ... (output: {out_dir}/{name}/output.txt)"
                  + (f"; the whole study about {int(eta // 3600)}h{int(eta % 3600 // 60):02d}m more" if eta else ''), flush=True)
            running[launch(name, commands[0], threads)] = (name, commands[1:])
        time.sleep(0.2)
        for process, (name, commands) in list(running.items()):
            if process.poll() is None:
                continue
            del running[process]
            log_path = os.path.join(out_dir, name, 'log.jsonl')
            records = read_log(log_path) if process.returncode != 0 and os.path.exists(log_path) else []
            if name.startswith('sweep/') and diverged_at(records) is not None:  # the rate loses; the sweep goes on
                steps_left -= max_iters
                print(f"{name}: diverged at iter {diverged_at(records)} ({records[-1]['diverged']})", flush=True)
                continue
            if process.returncode != 0:
                output = open(os.path.join(out_dir, name, 'output.txt')).read().splitlines()[-20:]
                raise SystemExit('\n'.join(output) + f"\nrun {name} failed (exit {process.returncode}); the end of its "
                                 f"output is above, all of it in {out_dir}/{name}/output.txt")
            if commands:
                running[launch(name, commands[0], threads)] = (name, commands[1:])
            else:
                records = read_log(log_path)
                if name in training:  # the pace: only the steps this invocation trained (a resumed run's, from its resume)
                    resumed = [r['resumed_at'] for r in records[records_before[name]:] if 'resumed_at' in r]
                    steps_left -= max_iters
                    steps_trained += max_iters - (resumed[0] if resumed else 0)
                final = [r for r in records if 'val_loss' in r][-1]
                print(f"{name}: done, val loss {final['val_loss']:.4f}", flush=True)
    results = []
    for name, _ in plans:
        run_dir = os.path.join(out_dir, name)
        result = summary(name, read_log(os.path.join(run_dir, 'log.jsonl')))
        scores = read_scores(os.path.join(run_dir, 'evaluate.json'), downstream_items) if downstream_items else None
        if scores:
            result['downstream'] = scores
        results.append(result | (trained_and_held(run_dir) if result['diverged'] is None else {}))
    return results


def read_scores(path, items):
    """{task: acc} of an evaluate.json scored through lm-eval on `items` items per built-in task, or None where it is
    missing, unreadable (a kill while writing it in an older version, a hand edit), of another item count or from the
    hand-written task definitions before lm-eval: then it is scored again."""
    try:
        report = json.load(open(path))
        scores = report['scores'] if report['scored_by'].startswith('lm-eval') else {}
        return {task: s['acc'] for task, s in scores.items()} if scores['next_passage']['items'] == items else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def trained_and_held(run_dir):
    """From a run's final checkpoint: the parameters its optimizer trains (ReLoRA's frozen W and SLTrain's fixed
    support are not among them) and the bytes of the optimizer's state (AdamW's moments, GaLore's projectors, ...)."""
    checkpoint = load_checkpoint(os.path.join(run_dir, 'ckpt.pt'))  # as data, or one line
    optimizer = checkpoint['optimizer']
    trained = {name for group in optimizer['param_groups'] for name in group['params']}
    return {'trained_params': sum(t.numel() for name, t in checkpoint['model'].items() if name in trained),
            'optimizer_bytes': sum(t.numel() * t.element_size() for state in optimizer['state'].values()
                                   for t in state.values() if torch.is_tensor(t))}


def interrupted(signum, frame):
    """Ctrl-C: the training runs get it too, save their step and stop (die_with_parent sends the rest SIGTERM)."""
    raise SystemExit("interrupted: each run in progress saves its step; the same command continues the study")


def trains(commands):
    return any(part.endswith('train.py') for command in commands for part in command)


def launch(name, command, threads):
    os.makedirs(os.path.join(out_dir, name), exist_ok=True)
    env = os.environ | ({'OMP_NUM_THREADS': threads} if jobs > 1 else {})
    with open_to_append(os.path.join(out_dir, name, 'output.txt')) as output:  # the child keeps its own copy open
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent)


def die_with_parent():
    """In the child, before train.py starts: SIGTERM when compare.py ends, even by SIGKILL (Linux), so that
    no run goes on alone; train.py then saves its step and stops, and the next compare.py resumes it."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except AttributeError:  # not Linux: the child outlives a killed parent
        pass


def read_log(path):
    """The records of a run's log.jsonl; where a run resumed, the records of the steps it redid replace
    those of the run that stopped, and elapsed_s counts on from where the stopped run's ended."""
    records, offset, elapsed = [], 0.0, 0.0  # elapsed_s counts from each process's start: summed over the processes
    lines = open(path).read().split('\n')
    for i, line in enumerate(lines):
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            if i == len(lines) - 1:  # a last line cut short (a kill while it was written): as if never written
                break
            raise SystemExit(f"{path}:{i + 1}: not a JSON line: the log was edited or damaged; delete that run's "
                             f"folder to train it again") from None
        if record is None:
            continue
        if 'resumed_at' in record:
            n, offset = record['resumed_at'], elapsed  # the resumed run evaluates at n again
            records = [r for r in records if r.get('iter', -1) < n or (r.get('iter') == n and 'val_loss' not in r)]
        else:
            if 'elapsed_s' in record:
                record['elapsed_s'] = elapsed = record['elapsed_s'] + offset
            records.append(record)
    return records


def summary(name, records):
    """What the tables and plot need of one run, from its log."""
    evals = [r for r in records if 'val_loss' in r]
    steps = [r for r in records if 'loss' in r and r['iter'] > 10]  # leave out the first steps (warm-up)
    losses = [r['loss'] for r in records if 'loss' in r]
    adapted = [r for r in records if 'tsvd_ranks' in r]  # TSVD: the shapes after the last rank change
    last = adapted[-1] if adapted else records[0]
    diverged = diverged_at(records)
    return {'run': name, 'lr': records[0]['config']['learning_rate'], 'diverged': diverged,
            'val_loss': math.inf if diverged is not None else evals[-1]['val_loss'],
            'params': last['model_params'], 'flops_per_token': last['flops_per_token'], 'flops': evals[-1]['flops'],
            'ranks': [(r['iter'], r['tsvd_ranks']) for r in adapted],
            'tokens_per_s': sorted(r['tokens_per_s'] for r in steps)[len(steps) // 2] if steps else float('nan'),
            # the training batches' loss over the last tenth of the logged steps: against val_loss, how far it memorised
            'train_loss': statistics.mean(losses[-max(1, len(losses) // 10):]) if losses else math.nan,
            'wall_s': records[-1]['elapsed_s'], 'evals': [(r['tokens'], r['flops'], r['val_loss']) for r in evals]}


def diverged_at(records):
    """The step at which train.py stopped a run on a nan or inf loss (its log says so), or None."""
    return next((r['iter'] for r in records if 'diverged' in r), None)


def loss_at_flops(run, flops):
    """A run's validation loss at a FLOP budget, linear between its evaluations; None past its end."""
    points = [(f, loss) for _, f, loss in run['evals']]
    for (f0, l0), (f1, l1) in zip(points, points[1:]):
        if f0 <= flops <= f1:
            return l0 + (l1 - l0) * (flops - f0) / (f1 - f0)
    return None


def mean_spread(values, digits=4):
    """'mean ± standard deviation' (over seeds; the sample's, n - 1) of a list, as text; a lone value as it is."""
    values = [v for v in values if v is not None]
    if not values:
        return '-'
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def gaps(runs, full_runs):
    """A method's gaps to full-rank in %, per seed: at equal steps (final losses) and at equal FLOPs
    (its final loss against full-rank's curve at the FLOPs it spent; None if full-rank spent fewer)."""
    at_steps = [(r['val_loss'] / f['val_loss'] - 1) * 100 for r, f in zip(runs, full_runs)]
    at_flops = [None if (f_loss := loss_at_flops(f, r['flops'])) is None else (r['val_loss'] / f_loss - 1) * 100
                for r, f in zip(runs, full_runs)]
    return at_steps, at_flops


def lowest(run):
    """A run's lowest validation loss over its evaluations: where an early stop would have kept it."""
    return min(loss for _, _, loss in run['evals'])


def plural(n, noun):
    return f"{n} {noun}{'' if n == 1 else 's'}"


def regime_text(plan):
    return (f"Regime: {plan['tokens']:,} training tokens per run = {plan['tokens_per_full_param']:.1f} per full-rank "
            f"non-embedding parameter ({plan['full_params']:,}) and {plan['tokens_per_cola_param']:.1f} per CoLA's "
            f"({plan['cola_params']:,}); the paper's 60M runs: {plan['paper_tokens_per_param']:.0f} per parameter in all, "
            f"{plan['paper_tokens_per_full_param']:.0f} per non-embedding parameter. Rank = {plan['rank_ratio']:g} d; "
            f"warm-up {plan['warmup_iters']} of {max_iters} steps; ELAS dense for {plan['elas_warmup_iters']} steps; "
            f"TSVD adapts every {plan['tsvd_interval']} steps; GaLore and Fira refresh their projectors every "
            f"{plan['galore_update_interval']} steps; ReLoRA merges every {plan['relora_interval']} steps"
            + ("; the sweep's runs as long as the study's." if sweeping() else '; no sweep (every lr given).'))


def sweeping():
    """Whether any method's learning rate is left to the sweep (CoLA-M takes CoLA's)."""
    return any(m not in dict(learning_rates) and not (m == 'cola-m' and 'cola' in methods) for m in methods)


def markdown(plan, sweep, best_lrs, study):
    """compare.md: the regime, the sweep, the study table (mean ± std over seeds), notes."""
    every_run = {os.path.realpath(os.path.join(out_dir, r['run'])): r  # a seed-1 study run is its sweep's run: once
                 for runs in list(sweep.values()) + list(study.values()) for r in runs}.values()
    lines = [regime_text(plan), '', f"{len(every_run)} runs, {sum(r['wall_s'] for r in every_run) / 60:.0f} minutes of "
             f"training summed over the runs; tokens/s and wall time below are each run's own (the median over the seeds: a "
             f"run that shared the cores moves it least), with {plural(jobs, 'run')} at a time on {os.cpu_count()} cores.", '']
    if sweep:
        rates = sorted({float(f"{r['lr']:.3g}") for runs in sweep.values() for r in runs})  # 0.004 * sqrt(2) = 0.008 / sqrt(2)
        lines += [f'Learning-rate sweep (seed {seeds[0]}, {max_iters} steps, the grid then a factor sqrt(2) around its '
                  f'best): final validation loss', '', '| method | ' + ' | '.join(f'{lr:.3g}' for lr in rates)
                  + ' | best | margin |', '|---|' + '---|' * (len(rates) + 2)]
        for method, runs in sweep.items():
            loss = {float(f"{r['lr']:.3g}"): 'diverged' if r['diverged'] is not None else f"{r['val_loss']:.4f}" for r in runs}
            lines.append(f'| {method} | ' + ' | '.join(loss.get(lr, '-') for lr in rates)
                         + f' | {best_lrs[method]:.3g} | {won_by(runs)} |')
        lines.append('')
    lines += [f'Each method at its best peak lr, {plural(len(seeds), "seed")} ({", ".join(map(str, seeds))})'
              + (': mean ± standard deviation over seeds; ' if len(seeds) > 1 else '; ')
              + 'the gaps are to full-rank with the same seed.', '',
              '| method | peak lr | val loss | gap at equal steps (%) | gap at equal FLOPs (%) | next passage acc | '
              'last word acc | params in all (M) | trained (M) | optimizer state (MB) | GFLOPs/token | TFLOPs spent | '
              'tokens/s | wall time (s) |', '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    for method, runs in study.items():
        at_steps, at_flops = gaps(runs, study['full-rank']) if 'full-rank' in study else ([None], [None])
        given = ' (given)' if method in dict(learning_rates) else ''
        lines.append(f"| {method} | {best_lrs[method]:.3g}{given} | {mean_spread([r['val_loss'] for r in runs])} | "
                     f"{mean_spread(at_steps, 2)} | {mean_spread(at_flops, 2)} | "
                     f"{mean_spread([r['downstream']['next_passage'] for r in runs if 'downstream' in r], 3)} | "
                     f"{mean_spread([r['downstream']['last_word'] for r in runs if 'downstream' in r], 3)} | "
                     f"{statistics.mean(r['params'] for r in runs) / 1e6:.3f} | "
                     f"{statistics.mean(r['trained_params'] for r in runs) / 1e6:.3f} | "
                     f"{statistics.mean(r['optimizer_bytes'] for r in runs) / 1e6:.2f} | "
                     f"{statistics.mean(r['flops_per_token'] for r in runs) / 1e9:.4f} | "
                     f"{statistics.mean(r['flops'] for r in runs) / 1e12:.2f} | "
                     f"{statistics.median(r['tokens_per_s'] for r in runs):,.0f} | "
                     f"{statistics.median(r['wall_s'] for r in runs):.0f} |")
    if 'cola' in study and 'cola-m' in study:
        deviation = max(abs(a[2] - b[2]) for c, m in zip(study['cola'], study['cola-m']) for a, b in zip(c['evals'], m['evals']))
        lines += ['', f"CoLA-M's validation losses differ from CoLA's (same seeds) by at most {deviation:.2e}."]
    if 'tsvd' in study:
        lines += ['', rank_table(study['tsvd'][0])]
    return '\n'.join(lines)


def won_by(runs):
    """How far the best rate of a method's sweep is ahead of its runner-up: 'x.xx% below lr', and whether it lies at
    the edge of the rates tried (then a rate outside them might do better)."""
    ranked = sorted(runs, key=lambda r: r['val_loss'])
    if len(ranked) < 2:
        return '-'
    edge = ranked[0]['lr'] in (min(r['lr'] for r in runs), max(r['lr'] for r in runs))
    if math.isinf(ranked[1]['val_loss']):
        return 'every other rate diverged'
    return (f"{(ranked[1]['val_loss'] / ranked[0]['val_loss'] - 1) * 100:.2f}% below {ranked[1]['lr']:.3g}"
            + (' (at the edge of the rates tried)' if edge else ''))


def refined(method, runs):
    """The rates a factor sqrt(2) either side of the best of a method's grid runs."""
    if all(r['diverged'] is not None for r in runs):
        rates = ', '.join(f"{r['lr']:g}" for r in runs)
        raise SystemExit(f"{method}: every rate of the sweep diverged ({rates}): give sweep_lrs smaller rates")
    best = min(runs, key=lambda r: r['val_loss'])['lr']
    return [best / 2 ** 0.5, best * 2 ** 0.5]


def link_study_run(method, sweep_run):
    """out_dir/<method>-seed<first seed> -> the sweep's run at the chosen rate (a relative link, replaced at once where
    an earlier choice made another; a folder there is a run of its own: refused)."""
    link = os.path.join(out_dir, f'{method}-seed{seeds[0]}')
    target = os.path.join('sweep', os.path.basename(sweep_run))
    if os.path.islink(link) and os.readlink(link) == target:
        return
    if os.path.exists(link) and not os.path.islink(link):
        raise SystemExit(f"{link}/ is a run of its own, trained apart from the sweep (an earlier compare.py, whose sweep "
                         f"was shorter): give this study another out_dir")
    temporary = link + '.link'
    if os.path.lexists(temporary):
        os.remove(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, link)


def rank_table(row):
    """TSVD's mean rank per projection type after each rank change."""
    types = ['q', 'k', 'v', 'o', 'gate', 'up', 'down']
    lines = [f"{row['run']}: mean rank per projection type after each adaptation (start: {rank})", '',
             '| iter | ' + ' | '.join(types) + ' |', '|---|' + '---|' * len(types)]
    for it, ranks in row['ranks']:
        means = [sum(ranks[i::len(types)]) / len(ranks[i::len(types)]) for i in range(len(types))]
        lines.append(f'| {it} | ' + ' | '.join(f'{m:.1f}' for m in means) + ' |')
    return '\n'.join(lines)


COLA_FAMILY = ('full-rank', 'cola', 'cola-m', 'dlr', 'elas', 'tsvd')  # the plot's upper row; full-rank and CoLA ...
BASELINES = ('full-rank', 'cola', 'galore', 'fira', 'low-rank', 'sltrain', 'relora')  # ... in both, as the yardsticks


def trend_report(studies):
    """trend.md and trend.png: per study (one width each), CoLA's gap to full-rank at equal steps and at equal FLOPs
    over the seeds both have; how far CoLA-M's validation losses lie from CoLA's; and, since the data is read more
    often at larger widths, how far each model memorised it (its final validation loss minus its training loss) and
    the gap between the two runs' lowest validation losses (the gap an early stop would have seen). The plot's axis is
    the width where the studies' widths differ, else the training tokens per full-rank non-embedding parameter."""
    lines = ['| d | r | full-rank params | seeds | full-rank lr | CoLA lr | full-rank val loss | CoLA val loss | '
             'gap at equal steps (%) | gap at equal FLOPs (%) | CoLA-M vs CoLA (max abs diff) | '
             'val - train loss, full-rank / CoLA | gap at the lowest val loss (%) | '
             'tokens per full-rank non-embedding parameter |', '|---' * 14 + '|']
    points = []
    for folder in studies:
        runs = {}
        for m in ('full-rank', 'cola', 'cola-m'):
            for s in range(1, 100):
                path = os.path.join(folder, f'{m}-seed{s}', 'log.jsonl')
                if os.path.exists(path):
                    runs.setdefault(m, {})[s] = summary(f'{m}-seed{s}', read_log(path))
        common = sorted(set(runs.get('full-rank', {})) & set(runs.get('cola', {})))
        if not common:
            raise SystemExit(f"trend: {folder}/ holds no full-rank and CoLA runs of the same seed (run its compare.py first)")
        full, cola = [runs['full-rank'][s] for s in common], [runs['cola'][s] for s in common]
        at_steps, at_flops = gaps(cola, full)
        at_lowest = [(lowest(c) / lowest(f) - 1) * 100 for c, f in zip(cola, full)]
        config = read_log(os.path.join(folder, f'cola-seed{common[0]}', 'log.jsonl'))[0]
        d, r = config['config']['n_embd'], config['config']['rank']
        full_config = read_log(os.path.join(folder, f'full-rank-seed{common[0]}', 'log.jsonl'))[0]['model_config']
        with torch.device('meta'):  # counted, not allocated, as regime() counts
            per_param = full[0]['evals'][-1][0] / Transformer(ModelConfig(**full_config)).num_params()
        m_runs = [(runs['cola'][s], runs['cola-m'][s]) for s in common if s in runs.get('cola-m', {})]
        deviation = max((abs(a[2] - b[2]) for c, m in m_runs for a, b in zip(c['evals'], m['evals'])), default=None)
        lines.append(f"| {d} | {r} | {full[0]['params']:,} | {len(common)} | {full[0]['lr']:.3g} | {cola[0]['lr']:.3g} | "
                     f"{mean_spread([x['val_loss'] for x in full])} | {mean_spread([x['val_loss'] for x in cola])} | "
                     f"{mean_spread(at_steps, 2)} | {mean_spread(at_flops, 2)} | "
                     f"{'-' if deviation is None else f'{deviation:.1e}'} | "
                     f"{statistics.mean(x['val_loss'] - x['train_loss'] for x in full):.3f} / "
                     f"{statistics.mean(x['val_loss'] - x['train_loss'] for x in cola):.3f} | "
                     f"{mean_spread(at_lowest, 2)} | {per_param:.1f} |")
        points.append(((d, per_param), at_steps, [g for g in at_flops if g is not None], at_lowest))
    by_width = len({d for (d, _), *_ in points}) > 1
    points = [(x[0] if by_width else x[1], *gaps_) for x, *gaps_ in points]
    write_durably(os.path.join(out_dir, 'trend.md'), lambda f: f.write(('\n'.join(lines) + '\n').encode()))
    print('\n'.join(lines))
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, label, style in [(1, 'at equal steps', '-'), (2, 'at equal FLOPs', '-'),
                            (3, 'at the lowest validation losses', '--')]:  # dashed: it may lie on the equal-steps line
        xs = [d for d, *g in points if g[i - 1]]
        ax.errorbar(xs, [statistics.mean(g[i - 1]) for d, *g in points if g[i - 1]], capsize=4, marker='o', label=label,
                    linestyle=style, yerr=[statistics.stdev(g[i - 1]) if len(g[i - 1]) > 1 else 0 for d, *g in points if g[i - 1]])
    ax.axhline(0, color='grey', linewidth=0.8)
    ax.set_xscale('log', base=2)
    ax.set_xlabel('model width d (r = d/4, 2 layers)' if by_width else 'training tokens per full-rank non-embedding parameter')
    ax.set_ylabel("CoLA's loss gap to full-rank (%)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    write_durably(os.path.join(out_dir, 'trend.png'), lambda f: fig.savefig(f, format='png', dpi=100))
    print(f"wrote {out_dir}/trend.md and {out_dir}/trend.png")


def plot(study, path):
    """Validation loss against tokens (left) and against FLOPs (right), CoLA and its variants in the upper row and
    the paper's baselines in the lower (full-rank and CoLA in both): each method's mean over seeds with a band of
    +-1 standard deviation at each evaluation (the FLOPs axis at the seeds' mean FLOPs); a method keeps its colour."""
    try:
        import matplotlib
        matplotlib.use('Agg')  # to files, no display
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    rows = [(title, [m for m in group if m in study]) for title, group in
            (('CoLA and its variants', COLA_FAMILY), ("the paper's baselines", BASELINES))]
    rows = [(t, g) for t, g in rows if set(g) - {'full-rank', 'cola'}] or [('every method', list(study))]  # more than the yardsticks
    colours = dict(zip(METHODS, plt.get_cmap('tab20').colors[::2] + plt.get_cmap('tab20').colors[1::2]))
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 4 * len(rows)), squeeze=False)
    final = min(statistics.mean(r['val_loss'] for r in runs) for runs in study.values())
    for row, (title, group) in zip(axes, rows):
        for method in group:
            by_eval = list(zip(*(r['evals'] for r in study[method])))  # per evaluation, (tokens, flops, loss) of every seed
            tokens = [e[0][0] for e in by_eval]
            flops = [statistics.mean(s[1] for s in e) for e in by_eval]
            mean = [statistics.mean(s[2] for s in e) for e in by_eval]
            spread = [statistics.stdev(s[2] for s in e) if len(e) > 1 else 0.0 for e in by_eval]
            for ax, x in zip(row, [tokens, flops]):
                ax.plot(x, mean, color=colours[method], label=f"{method} ({plural(len(study[method]), 'seed')})",
                        linestyle='--' if method == 'cola-m' else '-')  # CoLA-M lies on CoLA: dashed, to show both
                ax.fill_between(x, [m - s for m, s in zip(mean, spread)], [m + s for m, s in zip(mean, spread)],
                                color=colours[method], alpha=0.2)
        for ax, xlabel in zip(row, ['training tokens', 'training FLOPs']):
            ax.set_xlabel(xlabel)
            ax.set_ylabel('validation loss')
            ax.set_ylim(final - 0.05, min(ax.get_ylim()[1], 1.25 * final))
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
        row[0].set_title(title, fontsize=10)
    fig.tight_layout()
    write_durably(path, lambda f: fig.savefig(f, format='png', dpi=100))
    return True


if __name__ == '__main__':
    settings = configure(public_settings(globals()), sys.argv[1:])
    globals().update(settings)
    for method in methods:
        if method not in METHODS:
            raise SystemExit(f"methods: {method!r} is not one of {', '.join(METHODS)}")
    if not seeds:
        raise SystemExit(f"seeds={seeds}: expected one seed or more")
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"seeds={seeds}: a seed twice would count one run as two; expected distinct seeds")
    if jobs < 1:
        raise SystemExit(f"jobs={jobs}: expected 1 or more runs at a time")
    for pair in learning_rates:
        if not (isinstance(pair, tuple) and len(pair) == 2 and pair[0] in METHODS and isinstance(pair[1], (int, float))
                and pair[1] > 0):
            raise SystemExit(f"learning_rates: {pair!r}: expected (method, peak lr) pairs, each method one of "
                             f"{', '.join(METHODS)}, each rate positive")
    if trend:
        make_writable_folder(out_dir)
        trend_report(trend)
        sys.exit(0)
    plan = regime()
    if sweeping() and not sweep_lrs:
        raise SystemExit(f"sweep_lrs={sweep_lrs}: no rates to sweep, and {', '.join(m for m in methods if m not in dict(learning_rates))} "
                         f"have none in learning_rates; give rates to sweep, or each method's rate")
    make_writable_folder(out_dir)
    lock = open_to_append(os.path.join(out_dir, 'compare.lock'), 'a+')  # one study at a time in out_dir, the kernel's lock
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"{out_dir}/ is in use by another compare.py: wait for it, or use another out_dir") from None
    signal.signal(signal.SIGINT, interrupted)
    print(regime_text(plan))
    best_lrs = dict(learning_rates)
    swept = [m for m in methods if m not in best_lrs and not (m == 'cola-m' and 'cola' in methods)]
    # the sweep's runs (grid and refinement) and the study's (its seed-1 runs of swept methods are the sweep's: scored only)
    runs_done, total_runs = 0, len(swept) * (len(sweep_lrs) + 2) + len(methods) * len(seeds)
    # for the ETA: the steps still to train (not the swept methods' seed-1 runs, which are the sweep's; runs that train
    # nothing more are taken off as found), this invocation's pace
    steps_left, steps_trained, started = (total_runs - len(swept)) * max_iters, 0, time.time()
    grid = run_all([plan_run(f'sweep/{m}-lr{lr:g}', m, lr, seeds[0]) for m in swept for lr in sweep_lrs])
    sweep = {m: grid[i * len(sweep_lrs):(i + 1) * len(sweep_lrs)] for i, m in enumerate(swept)}
    finer = run_all([plan_run(f'sweep/{m}-lr{lr:g}', m, lr, seeds[0]) for m in swept for lr in refined(m, sweep[m])])
    for i, m in enumerate(swept):
        sweep[m] = sorted(sweep[m] + finer[2 * i:2 * i + 2], key=lambda r: r['lr'])
        best = min(sweep[m], key=lambda r: r['val_loss'])
        best_lrs[m] = best['lr']
        link_study_run(m, best['run'])
        print(f"{m}: lr {best['lr']:.3g} wins, {won_by(sweep[m])}", flush=True)
    if 'cola-m' in methods and 'cola-m' not in best_lrs:
        best_lrs['cola-m'] = best_lrs['cola']  # the same function as CoLA's, so the same best lr
    # seed by seed, so that a study cut short holds every method at its first seeds
    study_runs = run_all([plan_run(f'{m}-seed{s}', m, best_lrs[m], s) for s in seeds for m in methods])
    study = {m: study_runs[i::len(methods)] for i, m in enumerate(methods)}
    table = markdown(plan, sweep, best_lrs, study)
    write_durably(os.path.join(out_dir, 'compare.md'), lambda f: f.write((table + '\n').encode()))
    print(table.split('\n', 1)[1])  # the regime line was printed at the start
    if plot(study, os.path.join(out_dir, 'compare.png')):
        print(f"wrote {out_dir}/compare.md and {out_dir}/compare.png")
