"""
Train a LLaMA, CoLA or CoLA-M model on token shards from prepare.py.

    python train.py config/cpu_tiny.py                                        # a laptop CPU
    torchrun --standalone --nproc_per_node=8 train.py config/cola_130m.py     # one GPU node
    python train.py config/cola_60m.py --batch_size=32 --compile_model=False  # overrides

One flat script, in nanoGPT's order: config, distributed setup, data, model, optimizer, loop.
Tokens per step = batch_size x block_size x gradient_accumulation_steps x world size.
"""

import ctypes
import fcntl
import importlib.util
import json
import math
import os
import re
import signal
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import configure, public_settings
from methods import elas, galore, relora, tsvd
from model import ModelConfig, Transformer, load_checkpoint, model_from_checkpoint
from shards import load_meta, open_to_append, read_shard, remove_stale_temporaries, shard_path, write_durably

# ----------------------------------------------------------------------------- config
# I/O
out_dir = 'out'  # where the run's checkpoints and log.jsonl go
data_dir = 'data/c4'  # token shards from prepare.py (meta.json and its splits)
eval_interval = 1000  # evaluate, then checkpoint, every this many steps (and at the end)
eval_tokens = 10_000_000  # the validation budget: the same first tokens of the val split each time
official_val_loss = False  # True: also log the official CoLA code's validation loss, to set beside the paper's tables
log_interval = 10  # print and record the training loss every this many steps
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
start_over = False  # True: init_from='scratch' into an out_dir that holds a run deletes that run first (else refused)
always_save_checkpoint = True  # the latest state, at every evaluation
keep_best = True  # also keep the state with the best validation loss as best.pt
keep_checkpoints = False  # also keep every evaluation's state as ckpt_{iter}.pt: a trajectory for analyze.py
measure_only = False  # True: time the training steps only: no evaluation (nor its compiled graph), no checkpoint
wandb_log = False  # also log to Weights & Biases
wandb_project = 'nanocola'  # the W&B project
wandb_run_name = 'run'  # the W&B run's name
# data
batch_size = 64  # sequences per micro-step on each process
gradient_accumulation_steps = 1  # micro-steps per optimizer step on each process
# model: ModelConfig's fields, with its defaults (CoLA-60M); vocab_size None: the data's, padded to a multiple of 64
vocab_size = None  # None: the data's vocabulary, padded to a multiple of 64
block_size = 256  # tokens per training sequence (the context length)
n_layer = 8  # transformer blocks
n_head = 8  # attention heads
n_embd = 512  # the model width d
intermediate_size = 1376  # SwiGLU's hidden width f
rank = 128  # 0: full-rank nn.Linear projections; > 0: each projection a rank-r bottleneck (CoLA's r)
only_lr_act = False  # True: the MLP drops SwiGLU's own SiLU (CoLA's layers are non-linear already; the paper from 350m on)
dlr_alpha = 0.0  # DLR: > 0 switches on the latent residual (paper: 1.0)
dlr_scope = 'all'  # DLR on 'all' seven projections, or only 'attn' or 'mlp'
mlp = 'swiglu'  # or 'elas': squared-ReLU MLP with 2:4 activation sparsity
projection = 'cola'  # or a method of methods/: 'tsvd', 'low-rank', 'sltrain', 'relora' (rank = its rank)
sltrain_delta = 0.03  # SLTrain: the sparse part's density
sltrain_alpha = 32.0  # SLTrain: the low-rank part's scale is alpha / rank
relora_alpha = 32.0  # ReLoRA: the LoRA branch's scale is alpha / rank
relora_dropout = 0.0  # ReLoRA: dropout on the LoRA branch's input (official 0.1)
norm_eps = 1e-6  # RMSNorm's epsilon
rope_theta = 10000.0  # RoPE's base
checkpointing = 'none'  # or 'full' (whole blocks recomputed), or 'cola-m' (CoLA-M)
fused_cola = True  # CoLA's up-projections through cola_op.py's op (keeps z, not silu(z)); False: eager PyTorch
# optimizer: AdamW, or GaLore / Fira (methods/galore.py); linear warmup then cosine decay to min_lr
optimizer = 'adamw'  # 'adamw', or 'galore' / 'fira' on a full-rank model (rank=0): projected gradients
galore_rank = 128  # GaLore / Fira: the projection's rank (the official 60m scripts' 128)
galore_update_interval = 200  # GaLore / Fira: a new projector every this many steps (T)
galore_scale = 0.25  # GaLore's scale, Fira's alpha
learning_rate = 6e-3  # the peak learning rate
min_lr = 6e-4  # the learning rate at the end of the cosine (and after it)
max_iters = 10000  # optimizer steps in the run
lr_decay_iters = 10000  # the step where the cosine reaches min_lr (usually max_iters)
warmup_iters = 2000  # steps of linear warm-up to learning_rate
weight_decay = 0.01  # AdamW's decoupled weight decay (matrices only)
beta1 = 0.9  # AdamW's beta1
beta2 = 0.999  # AdamW's beta2
grad_clip = 0.5  # clip the gradients' global norm to this (0: off)
elas_warmup_iters = 1000  # ELAS: dense steps before 2:4 sparsity switches on (the paper's 1000 of 10,000)
tsvd_interval = 1000  # TSVD: adapt the ranks every this many steps
tsvd_energy = 0.98  # TSVD: each layer keeps the smallest rank holding this fraction of its spectrum's energy
tsvd_min_rank = 16  # TSVD: no layer's rank goes below this
relora_interval = 1000  # ReLoRA: merge and restart every this many steps (the comparisons' 1000 of 10,000)
relora_restart_warmup = 100  # ReLoRA: steps of linear re-warm-up after each merge
relora_prune = 0.99  # ReLoRA: the fraction of the factors' Adam moments zeroed at each merge ...
relora_prune_kind = 'random'  # ... at random, or 'magnitude' (the smallest)
relora_warm_start = ''  # ReLoRA: a full-rank run's out_dir whose weights W start from ('' = from scratch)
# system
device = 'cuda' if torch.cuda.is_available() else 'cpu'  # 'cpu', 'cuda' or 'cuda:N'
dtype = 'bfloat16' if torch.cuda.is_available() else 'float32'  # 'float32' or 'bfloat16'
compile_model = torch.cuda.is_available()  # torch.compile the model (default on a GPU)
parallel = 'ddp'  # 'ddp' (full replica per GPU) or 'fsdp' (FSDP2: parameters, grads, AdamW states sharded)
dist_timeout_s = 600  # a process that waits longer than this for the others stops the run
seed = 1337  # the model's init and the order of the training sequences
PEAK_FLOPS = {'A100': 312e12, 'H100': 989e12, 'H200': 989e12}  # dense bf16 per GPU, for MFU

config = configure(public_settings(globals()), sys.argv[1:])
globals().update(config)
for name in ('batch_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_tokens', 'log_interval', 'dist_timeout_s',
             'tsvd_interval', 'tsvd_min_rank', 'galore_rank', 'galore_update_interval', 'relora_interval'):
    if config[name] < 1:
        raise SystemExit(f"{name}={config[name]}: expected a positive number")
for name in ('max_iters', 'warmup_iters', 'lr_decay_iters', 'min_lr', 'weight_decay', 'grad_clip', 'elas_warmup_iters', 'seed',
             'relora_restart_warmup'):
    if config[name] < 0:
        raise SystemExit(f"{name}={config[name]}: expected 0 or more")
for name, allowed in [('dtype', ('float32', 'bfloat16')), ('parallel', ('ddp', 'fsdp')), ('init_from', ('scratch', 'resume')),
                      ('optimizer', ('adamw', 'galore', 'fira')), ('relora_prune_kind', ('random', 'magnitude'))]:
    if config[name] not in allowed:
        raise SystemExit(f"{name}={config[name]!r}: expected one of {allowed}")
if not learning_rate > 0:
    raise SystemExit(f"learning_rate={learning_rate}: expected a positive number")
if not (vocab_size is None or (isinstance(vocab_size, int) and vocab_size > 0)):
    raise SystemExit(f"vocab_size={vocab_size!r}: expected None (the data's) or a positive integer")
if max_iters == 0 and init_from == 'scratch':
    raise SystemExit("max_iters=0: a new run would train nothing and save no checkpoint; expected 1 or more steps")
if projection == 'sltrain' and not (0 < sltrain_delta <= 1 and int(sltrain_delta * n_embd * n_embd) >= 1):
    raise SystemExit(f"sltrain_delta={sltrain_delta}: expected a density in (0, 1] that gives each {n_embd} x {n_embd} "
                     f"projection at least one sparse entry")
if relora_warm_start and projection != 'relora':
    raise SystemExit(f"relora_warm_start={relora_warm_start!r} with projection={projection!r}: the warm start is "
                     f"ReLoRA's; add --projection=relora, or drop relora_warm_start")
if not 0 < tsvd_energy <= 1:
    raise SystemExit(f"tsvd_energy={tsvd_energy}: expected a fraction in (0, 1]")
if wandb_log and importlib.util.find_spec('wandb') is None:
    raise SystemExit("wandb_log=True: the wandb package is not installed; pip install wandb, or drop wandb_log")
if projection == 'tsvd' and parallel == 'fsdp':
    raise SystemExit("projection='tsvd' with parallel='fsdp': TSVD's rank changes reshape the parameters, which FSDP2's "
                     "shards do not follow; use parallel='ddp'")
if projection == 'relora' and (parallel == 'fsdp' or not 0 <= relora_prune <= 1):
    raise SystemExit(f"projection='relora' with parallel={parallel!r}, relora_prune={relora_prune}: expected "
                     f"parallel='ddp' (ReLoRA's frozen W and trained factors share its layers) and a fraction in [0, 1]")
if optimizer != 'adamw' and (rank != 0 or parallel == 'fsdp' or not galore_scale > 0):
    raise SystemExit(f"optimizer={optimizer!r} with rank={rank}, parallel={parallel!r}, galore_scale={galore_scale}: "
                     f"expected a full-rank model (rank=0; projecting the gradients of CoLA's factors is no published "
                     f"method), parallel='ddp' (the projector needs whole gradients) and galore_scale > 0")
if optimizer != 'adamw' and galore_rank >= min(n_embd, intermediate_size):
    raise SystemExit(f"galore_rank={galore_rank}: expected fewer than the projected matrices' smaller side "
                     f"(n_embd={n_embd}): at that rank the projection keeps every direction and saves nothing")
if device.split(':')[0] not in ('cpu', 'cuda') or (device.startswith('cuda') and not torch.cuda.is_available()):
    raise SystemExit(f"device={device!r}: expected 'cpu', or 'cuda' / 'cuda:N' on a machine with a CUDA GPU")

# ----------------------------------------------------------------------------- distributed setup
distributed = 'RANK' in os.environ  # launched by torchrun
if distributed:
    # torchrun starts each rank in a session of its own, so a launcher killed without passing a signal on (SIGKILL,
    # the out-of-memory killer) would leave the ranks training unseen: on Linux the kernel sends them SIGHUP when it
    # dies (they save their step and stop together, below), and a rank whose launcher is already gone stops now.
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGHUP)  # PR_SET_PDEATHSIG
    except AttributeError:  # not Linux: docs/cluster.md says what to do
        pass
    if os.getppid() == 1:
        raise SystemExit("torchrun's launcher is gone (this rank was orphaned before it started): not training")
    dist.init_process_group('nccl' if device.startswith('cuda') else 'gloo', timeout=timedelta(seconds=dist_timeout_s))
    rank_id, world_size, local_rank = dist.get_rank(), dist.get_world_size(), int(os.environ['LOCAL_RANK'])
    if device.startswith('cuda'):
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    else:  # share the cores instead of oversubscribing them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ['LOCAL_WORLD_SIZE'])))
else:
    rank_id, world_size = 0, 1
    if parallel == 'fsdp':  # (config/cola_1b.py on one GPU) one process has nothing to shard with
        print("parallel='fsdp' needs torchrun's processes to shard over: training on one process, unsharded")
        parallel = config['parallel'] = 'ddp'
master = rank_id == 0
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
torch.manual_seed(seed)
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
sequences_per_step = batch_size * gradient_accumulation_steps * world_size
tokens_per_step = sequences_per_step * block_size


def log(*args):
    if master:
        print(*args, flush=True)


# ----------------------------------------------------------------------------- data
class TokenStream:
    """A split's shards as one stream of tokens, cut into sequences of T+1 tokens (inputs and the targets
    shifted by one): sequence j of the split is tokens [j*T, (j+1)*T], j < N = (tokens - 1) // T. With the paper's
    recipe the stream is rows of T+1 tokens, one document each, padded: sequence j is row j, and its padding is
    no target (-1, which the loss ignores), as the official code's labels -100.
    Evaluation reads the val split's sequences in order from its start. Training reads the train split
    in passes: the i-th sequence read is sequence order_p[i mod N] with p = i // N and order_p a random
    permutation seeded by (seed, p), so each pass reads every sequence once, in an order of its own."""

    def __init__(self, split, shuffled):
        self.shards, self.largest = [], 0
        for name in meta['splits'][split]['shards']:
            path = shard_path(data_dir, name)
            try:
                tokens = read_shard(path)
            except (OSError, ValueError) as e:
                raise SystemExit(f"{path}: {e.strerror}" if isinstance(e, OSError) else str(e)) from None
            largest = int(tokens.max()) if len(tokens) else 0  # once per shard, vectorised
            if largest >= meta['vocab_size']:
                raise SystemExit(f"{path}: token id {largest} is outside the {meta['encoding']} vocabulary "
                                 f"of {meta['vocab_size']} tokens that {data_dir}/meta.json records")
            self.shards.append(tokens)
            self.largest = max(self.largest, largest)  # the largest token id of the split
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.stride = block_size + 1 if rows_recipe else block_size  # rows do not overlap; packed sequences share a token
        self.n_sequences = (self.starts[-1] - (0 if rows_recipe else 1)) // self.stride
        if self.n_sequences < 1:
            raise SystemExit(f"block_size={block_size} is longer than the {split} split of {data_dir}/ "
                             f"({self.starts[-1]:,} tokens)")
        self.shuffled, self.order_pass, self.order = shuffled, None, None

    def nonpad_rows(self, tokens):
        """How many of the split's first rows (the paper's recipe) hold `tokens` targets that are not padding."""
        counts = np.concatenate([(s.reshape(-1, self.stride)[:, 1:] != meta['pad']).sum(1) for s in self.shards])
        return int(np.searchsorted(np.cumsum(counts), tokens)) + 1

    def sequence(self, i):
        """The T+1 tokens of the i-th sequence read, across shard boundaries."""
        p, j = divmod(i, self.n_sequences)
        if self.shuffled:
            if self.order_pass != p:  # a new pass (or a resume): its permutation, made once
                self.order_pass, self.order = p, np.random.default_rng([seed, p]).permutation(self.n_sequences)
            j = self.order[j]
        start, n, out = j * self.stride, block_size + 1, []
        while n > 0:
            shard = np.searchsorted(self.starts, start, side='right') - 1
            piece = self.shards[shard][start - self.starts[shard]:][:n]
            out.append(piece)
            start, n = start + len(piece), n - len(piece)
        return np.concatenate(out)

    def batch(self, first, n):
        """Inputs and targets (n, T) of the sequences read first, first + 1, ..., on device (asynchronously on CUDA)."""
        rows = torch.from_numpy(np.stack([self.sequence(i) for i in range(first, first + n)]).astype(np.int64))
        x, y = rows[:, :-1], rows[:, 1:].clone()
        if rows_recipe:
            y[y == meta['pad']] = -1  # padding predicts nothing
        if device_type == 'cuda':
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y


if not os.path.exists(os.path.join(data_dir, 'meta.json')):
    raise SystemExit(f"no token shards in {data_dir}/: run `python prepare.py --out_dir={data_dir}` (C4) or "
                     f"`python prepare.py --input_files='your/*.txt' --out_dir={data_dir}` first")
meta = load_meta(data_dir)
if not {'train', 'val'} <= meta['splits'].keys():
    raise SystemExit(f"{data_dir}/ is not finished: rerun the prepare.py command that made it (it resumes)")
rows_recipe = meta.get('recipe') == 'paper'
if rows_recipe and block_size != meta['row_tokens'] - 1:
    raise SystemExit(f"block_size={block_size}: {data_dir}/ holds the paper's rows of {meta['row_tokens']} tokens, "
                     f"{meta['row_tokens'] - 1} inputs and targets each; give --block_size={meta['row_tokens'] - 1}")
train_data, val_data = TokenStream('train', shuffled=True), TokenStream('val', shuffled=False)
# The validation budget: whole batches on every process, never more than the val split holds (the paper's rows:
# as many rows as hold eval_tokens targets that are not padding).
eval_batches = min(max(1, -(-val_data.nonpad_rows(eval_tokens) // (batch_size * world_size)) if rows_recipe else
                       eval_tokens // (batch_size * block_size * world_size)),
                   val_data.n_sequences // (batch_size * world_size))
if eval_batches == 0:
    raise SystemExit(f"the val split of {data_dir}/ ({val_data.starts[-1]:,} tokens) is smaller than one evaluation "
                     f"batch of {batch_size} x {block_size} tokens x {world_size} processes: lower batch_size")
if eval_tokens > val_data.starts[-1] - 1:
    log(f"eval_tokens={eval_tokens:,} is more than the val split holds: evaluating on its first "
        f"{eval_batches * batch_size * block_size * world_size:,} tokens")

# ----------------------------------------------------------------------------- model
checkpoint_path = os.path.join(out_dir, 'ckpt.pt')
model_fields = {k: config[k] for k in ModelConfig.__dataclass_fields__}
model_fields['vocab_size'] = vocab_size or math.ceil(meta['vocab_size'] / 64) * 64
checkpoint = None
if init_from == 'resume':
    if not os.path.exists(checkpoint_path):
        raise SystemExit(f"init_from='resume' but there is no checkpoint {checkpoint_path}")
    checkpoint = load_checkpoint(checkpoint_path)
    if checkpoint['encoding'] != meta['encoding']:
        raise SystemExit(f"{checkpoint_path} was trained on encoding={checkpoint['encoding']!r} data, "
                         f"but {data_dir}/ holds {meta['encoding']!r} tokens")
    for key, value in checkpoint['model_config'].items():  # how to run it may change, what it is may not
        if key not in ('checkpointing', 'fused_cola') and model_fields.get(key) != value:
            raise SystemExit(f"{key}={model_fields.get(key)!r} differs from the checkpoint's {key}={value!r}: "
                             f"resume with the checkpoint's settings, or train into another out_dir")
    if checkpoint['config'].get('seed', seed) != seed:  # the same data order, or the run is not one run
        raise SystemExit(f"seed={seed} differs from the checkpoint's seed={checkpoint['config']['seed']}: it sets the "
                         f"order of the training data; resume with --seed={checkpoint['config']['seed']}")
    if checkpoint.get('data_splits', meta['splits']) != meta['splits']:
        raise SystemExit(f"{data_dir}/ holds other data than the run was trained on (its meta.json differs from the "
                         f"checkpoint's record): resume with the run's data_dir={checkpoint['config']['data_dir']!r}")
if meta['vocab_size'] > model_fields['vocab_size'] and not rows_recipe:
    raise SystemExit(f"vocab_size={model_fields['vocab_size']} is smaller than the vocabulary of {data_dir}/ "
                     f"({meta['encoding']}, {meta['vocab_size']} tokens)")
if rows_recipe and max(train_data.largest, val_data.largest) >= model_fields['vocab_size']:  # (T5's 100 sentinel ids,
    # above the paper's 32,000, never occur in plain text: the paper's model has 32,000 rows, and so may ours)
    raise SystemExit(f"vocab_size={model_fields['vocab_size']} is too small for {data_dir}/, which holds token id "
                     f"{max(train_data.largest, val_data.largest)} ({meta['encoding']})")
try:
    model_config = ModelConfig(**model_fields)
except ValueError as e:
    raise SystemExit(str(e)) from None
if checkpoint is None:
    with torch.device(device):  # built where it runs (a 7b model would not fit in 8 copies in host memory)
        raw_model = Transformer(model_config)
    if projection == 'relora' and relora_warm_start:  # the paper's warm start: W from a full-rank run
        warm = os.path.join(relora_warm_start, 'ckpt.pt')
        relora.warm_start(raw_model, load_checkpoint(warm), warm)
else:  # the weights as they were (TSVD: at the ranks the run had reached), run as this run says
    raw_model = model_from_checkpoint(checkpoint, device, checkpoint_path, checkpointing=checkpointing, fused_cola=fused_cola)
method = ({'galore': 'GaLore', 'fira': 'Fira'}.get(optimizer) or 'full-rank' if rank == 0 else {
    'tsvd': 'TSVD', 'low-rank': 'Low-Rank', 'sltrain': 'SLTrain', 'relora': 'ReLoRA'}.get(projection, 'CoLA')) + (
    '-M' if checkpointing == 'cola-m' else '') + (' + DLR' if dlr_alpha > 0 else '') + (' + ELAS' if mlp == 'elas' else '')
frozen = sum(p.numel() for p in raw_model.parameters() if not p.requires_grad)  # ReLoRA's W
setup = {  # what the method is configured to do, in its own terms
    'GaLore': f"gradients projected to rank {galore_rank}, the projector refreshed every {galore_update_interval} steps, scale {galore_scale}",
    'Fira': f"gradients projected to rank {galore_rank}, the projector refreshed every {galore_update_interval} steps, alpha {galore_scale}",
    'ReLoRA': f"rank {rank}; of the parameters below {(raw_model.num_params() - frozen) / 1e6:.2f}M are trained, {frozen / 1e6:.2f}M frozen (W); "
              f"merged every {relora_interval} steps with a {relora_restart_warmup}-step re-warm-up",
    'SLTrain': f"rank {rank} plus a sparse part of density {sltrain_delta}",
    'TSVD': f"start rank {rank}, ranks adapted every {tsvd_interval} steps to {tsvd_energy:.0%} of the energy",
    'Low-Rank': f"rank {rank}",
}.get(method.split()[0].removesuffix('-M'), f"rank {rank}" if rank else '')
setup += f", 2:4 sparsity after {elas_warmup_iters} dense steps" if mlp == 'elas' else ''
log(f"training {method}" + (f" ({setup})" if setup else '') + f": {raw_model.num_params() / 1e6:.2f}M non-embedding "
    f"parameters ({raw_model.num_params(False) / 1e6:.2f}M in all), {tokens_per_step:,} tokens per step = "
    f"{batch_size} x {block_size} x {gradient_accumulation_steps} x {world_size}")

autocast = nullcontext()
if parallel == 'fsdp':  # each block, then the rest, sharded; on CUDA bf16 compute with fp32 master weights
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if dtype == 'bfloat16' else MixedPrecisionPolicy()
    for block in raw_model.blocks:
        fully_shard(block, mp_policy=precision)
    fully_shard(raw_model, mp_policy=precision)
elif dtype == 'bfloat16':  # fp32 master weights, bf16 matmuls
    autocast = torch.autocast(device_type=device_type, dtype=torch.bfloat16)

# ----------------------------------------------------------------------------- optimizer
if config['optimizer'] == 'adamw':
    optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
else:  # GaLore / Fira: the published packages' parameter groups
    optimizer = galore.build_optimizer(raw_model, config['optimizer'], learning_rate, (beta1, beta2), weight_decay,
                                       galore_rank, galore_update_interval, galore_scale)
iter_num, best_val_loss, data_position, flops_spent = 0, float('inf'), 0, 0  # data_position: the next train sequence
if checkpoint is not None:
    saved = checkpoint['config']
    for key in ('optimizer', 'galore_rank') if config['optimizer'] != 'adamw' else ('optimizer',):  # the state's shapes
        if saved.get(key, config[key]) != config[key]:
            raise SystemExit(f"{key}={config[key]!r} differs from the checkpoint's {key}={saved[key]!r}, which its "
                             f"optimizer state is made for: resume with --{key}={saved[key]!r}, or train into another out_dir")
    chosen = [{k: v for k, v in group.items() if k != 'params'} for group in optimizer.param_groups]
    set_optimizer_state_dict(raw_model, optimizer, checkpoint['optimizer'], options=StateDictOptions(full_state_dict=True))
    for group, settings in zip(optimizer.param_groups, chosen):  # this run's settings, not the saved groups' own
        group.update(settings)
    changed = [f"{k} {saved[k]!r} -> {config[k]!r}" for k in ('weight_decay', 'beta1', 'beta2', 'grad_clip', 'galore_scale',
                                                               'galore_update_interval') if k in saved and saved[k] != config[k]]
    if changed:
        log(f"resuming with changed settings, applied from here on: {', '.join(changed)}")
    iter_num, best_val_loss, data_position = checkpoint['iter_num'], checkpoint['best_val_loss'], checkpoint['data_position']
    flops_spent = checkpoint['flops_spent']
    torch.set_rng_state(checkpoint['rng']['cpu'])
    if device_type == 'cuda' and checkpoint['rng']['cuda'] is not None:
        torch.cuda.set_rng_state(checkpoint['rng']['cuda'])
    log(f"resumed from {checkpoint_path} at iter {iter_num}")
    checkpoint = None  # free the memory
core = torch.compile(raw_model) if compile_model else raw_model


def wrap(core):
    """The model the loop calls: under DDP a wrapper that all-reduces gradients, built around the
    parameters' shapes (so rebuilt when TSVD changes them)."""
    if distributed and parallel == 'ddp':
        return DDP(core, device_ids=[local_rank] if device_type == 'cuda' else None)
    return core


model = wrap(core)


def get_lr(it):
    """Linear warmup, then cosine from learning_rate down to min_lr at lr_decay_iters."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    progress = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)


def gradient_sync(last_micro_step):
    """Reduce gradients across processes on the last micro-step only, to send them once per step:
    DDP through a context around the forward pass, FSDP2 through a switch."""
    if parallel == 'fsdp':
        raw_model.set_requires_gradient_sync(last_micro_step)
        return nullcontext()
    return model.no_sync() if distributed and not last_micro_step else nullcontext()


def train_batch(step_position, micro_step):
    """This process's micro-batch: each process reads a contiguous slice of the global batch."""
    return train_data.batch(step_position + (rank_id * gradient_accumulation_steps + micro_step) * batch_size, batch_size)


@torch.no_grad()
def evaluate():
    """The exact mean loss per token over the fixed validation budget (eval_batches batches on
    every process, from the start of the val split)."""
    model.eval()
    total = torch.zeros(2, device=device, dtype=torch.float64)  # loss sum, token count
    for b in range(eval_batches):
        x, y = val_data.batch((b * world_size + rank_id) * batch_size, batch_size)
        with autocast:
            _, loss = model(x, y)
        targets = (y >= 0).sum().double()  # (the paper's rows: not padding)
        total += torch.stack([loss.double() * targets, targets])
    if distributed:
        dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


@torch.no_grad()
def evaluate_official():
    """The validation loss as the official CoLA code computes it (its main.py, evaluate_model), to set beside the
    paper's tables: each batch's mean loss, summed and divided by the batches plus one (its counter starts at 1),
    over the batches taken until more than eval_tokens inputs that are not padding (counted times the processes)
    have been seen; then the mean over the processes. Which rows each process reads is ours (the same on one)."""
    batch = lambda b: val_data.batch((b * world_size + rank_id) * batch_size, batch_size)  # noqa: E731
    mine, seen = 0, 0  # this process's batches, counted first: the processes may need different numbers
    while mine < val_data.n_sequences // (batch_size * world_size) and seen <= eval_tokens:
        seen += (int((batch(mine)[1] >= 0).sum()) + batch_size) * world_size  # a row's inputs: its first token, targets
        mine += 1
    forwards = torch.tensor(mine, device=device)
    if distributed:  # as many forwards on every process: DDP and FSDP communicate in each
        dist.all_reduce(forwards, op=dist.ReduceOp.MAX)
    model.eval()
    total = 0.0
    for b in range(int(forwards)):
        x, y = batch(b)
        with autocast:
            _, loss = model(x, y)
        total += loss.item() if b < mine else 0.0
    value = torch.tensor(total / (mine + 1), device=device, dtype=torch.float64)
    if distributed:
        dist.all_reduce(value)
    model.train()
    return value.item() / world_size


def save_checkpoint(path):
    """Model, optimizer, step, data position, RNG states and config, written atomically and durably."""
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {
        'model': get_model_state_dict(raw_model, options=full),
        'optimizer': get_optimizer_state_dict(raw_model, optimizer, options=full),
        'model_config': vars(model_config), 'config': config, 'encoding': meta['encoding'], 'data_splits': meta['splits'],
        'iter_num': iter_num, 'data_position': data_position, 'flops_spent': flops_spent,
        'best_val_loss': best_val_loss,
        'rng': {'cpu': torch.get_rng_state(), 'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None},
    }
    if master:
        write_durably(path, lambda f: torch.save(state, f))


def stop_if_not_finite(value, what):
    if not math.isfinite(value):
        record({'iter': iter_num, 'diverged': f"{what} is {value}"})  # in the log too: compare.py's sweep reads it
        kept = f"the last good checkpoint {checkpoint_path} is kept" if os.path.exists(checkpoint_path) else "no checkpoint was written"
        raise SystemExit(f"{what} is {value} at iter {iter_num}: stopping; {kept}")


# ----------------------------------------------------------------------------- training loop
if master:
    try:
        os.makedirs(out_dir, exist_ok=True)
        # One run at a time in out_dir: the lock is the kernel's, released when this process ends, however it ends.
        lock_file = open_to_append(os.path.join(out_dir, 'train.lock'), 'a+')
    except OSError as e:
        raise SystemExit(f"out_dir={out_dir!r} cannot be written ({e.strerror}): use a writable folder") from None
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        raise SystemExit(f"{out_dir}/ is in use by another training run (pid {lock_file.read().strip() or '?'}): "
                         f"wait for it or stop it, or use another out_dir") from None
    lock_file.truncate(0)
    lock_file.write(str(os.getpid()))
    lock_file.flush()
    earlier_run = sorted(f for f in os.listdir(out_dir) if f in ('ckpt.pt', 'best.pt', 'log.jsonl', 'evaluate.json')
                         or re.fullmatch(r'ckpt_\d+\.pt', f))
    if init_from == 'scratch' and earlier_run:
        if not start_over:  # (a run that saved no checkpoint has nothing to resume)
            kept = ("continue it with --init_from=resume, " if os.path.exists(checkpoint_path) else
                    "it saved no checkpoint to resume; ")
            raise SystemExit(f"{out_dir}/ already holds a run ({os.path.basename(earlier_run[0])}): {kept}train into "
                             f"another out_dir, or delete it with --start_over=True")
        for f in earlier_run:
            os.remove(os.path.join(out_dir, f))
    remove_stale_temporaries(out_dir)  # what a killed run was writing when it died
    log_file = open_to_append(os.path.join(out_dir, 'log.jsonl'))
    log_file.write(json.dumps({'config': config, 'model_config': vars(model_config), 'tokens_per_step': tokens_per_step,
                               'flops_per_token': raw_model.flops_per_token(block_size, batch_size),
                               'model_params': raw_model.num_params(False)}) + '\n')
    if iter_num > 0:  # readers keep the records of the redone steps, not those of the run that stopped
        log_file.write(json.dumps({'resumed_at': iter_num}) + '\n')
    if wandb_log:
        import wandb
        wandb.init(project=wandb_project, name=wandb_run_name, config=config)
gpu_name = torch.cuda.get_device_name(device) if device_type == 'cuda' else ''
peak_flops = next((v for k, v in PEAK_FLOPS.items() if k in gpu_name), None)
flops_per_step = raw_model.flops_per_token(block_size, batch_size) * tokens_per_step  # recomputation included
model_flops_per_step = raw_model.flops_per_token(block_size, batch_size, recomputation=False) * tokens_per_step


def record(entry):
    """A line of out_dir/log.jsonl (and wandb), with the training tokens and FLOPs so far and the
    seconds since this process started."""
    entry.update(tokens=iter_num * tokens_per_step, flops=flops_spent, elapsed_s=time.time() - process_start)
    if master:
        log_file.write(json.dumps(entry) + '\n')
        log_file.flush()
        if wandb_log:
            wandb.log(entry, step=entry['iter'])


stop_requested = None  # the signal that asked this run to stop
resident_memory = None  # GiB allocated between steps on CUDA (peak minus this: activations, logits, gradients)


def request_stop(signum, frame):
    """SIGTERM (a scheduler about to preempt) or Ctrl-C: finish the step, save, stop. A second one stops at once
    (a checkpoint being written is then not renamed into place: the previous one stays whole)."""
    global stop_requested
    if stop_requested:
        kept = (f"{checkpoint_path} holds the last saved state" if os.path.exists(checkpoint_path) else
                "no checkpoint was saved yet: start again with --start_over=True")
        raise SystemExit(f"{signal.Signals(signum).name} again: stopped at once; {kept}")
    stop_requested = signal.Signals(signum).name


def launcher_gone(signum, frame):
    """SIGHUP, which Linux sends a rank when torchrun's launcher dies (once per launcher thread that exits, so
    perhaps several times): stop as a first SIGTERM asks, however many arrive."""
    global stop_requested
    stop_requested = stop_requested or "SIGHUP (torchrun's launcher died)"


signal.signal(signal.SIGTERM, request_stop)
signal.signal(signal.SIGINT, request_stop)
if distributed:
    signal.signal(signal.SIGHUP, launcher_gone)
start_iter = timed_from = iter_num  # timed_from: the step where the current timing started
trained_s = 0.0  # seconds spent in training steps (evaluations left out), for the ETA
fastest_dt, slow_told = float('inf'), False  # for the one hint that the cores are busy elsewhere
# Schedules set in steps that do not fit this run's max_iters (a shortened run, say): one line each, with the fix.
# compare.py scales them to each run itself; train.py keeps what it was told and says so.


def misfit(text):
    log(f"max_iters={max_iters} and {text}")


if warmup_iters > max_iters:
    misfit(f"warmup_iters={warmup_iters}: the learning rate never reaches learning_rate={learning_rate:g} "
           f"(it ends at {get_lr(max_iters - 1):.2e}); set --warmup_iters={max_iters // 10}")
elif lr_decay_iters > max_iters:
    misfit(f"lr_decay_iters={lr_decay_iters}: the cosine ends at {get_lr(max_iters - 1):.2e}, not "
           f"min_lr={min_lr:g}; set --lr_decay_iters={max_iters}")
if config['optimizer'] != 'adamw' and galore_update_interval >= max_iters:
    misfit(f"galore_update_interval={galore_update_interval}: the projector is never refreshed; "
           f"set --galore_update_interval={max(1, max_iters // 50)} (the official 200 of 10,000 steps)")
if projection == 'relora' and relora_interval >= max_iters:
    misfit(f"relora_interval={relora_interval}: ReLoRA never merges; set --relora_interval={max(1, max_iters // 10)} "
           f"(the comparisons' 1,000 of 10,000 steps)")
if projection == 'relora' and relora_restart_warmup >= relora_interval:
    misfit(f"relora_restart_warmup={relora_restart_warmup} is not shorter than relora_interval={relora_interval}: "
           f"after the first merge the learning rate never climbs back; set "
           f"--relora_restart_warmup={relora_interval // 10} (the official 100 of 1,000)")
if projection == 'tsvd' and tsvd_interval >= max_iters:
    misfit(f"tsvd_interval={tsvd_interval}: TSVD never adapts its ranks; set --tsvd_interval={max(1, max_iters // 10)}")
if mlp == 'elas' and elas_warmup_iters >= max_iters:
    misfit(f"elas_warmup_iters={elas_warmup_iters}: ELAS's 2:4 sparsity never switches on; set "
           f"--elas_warmup_iters={max_iters // 10} (the paper's 1,000 of 10,000 steps)")
if lr_decay_iters > max_iters:  # a shortened run: the methods' schedules were set, as the learning rate's, for longer
    for name, value, on in [('galore_update_interval', galore_update_interval, config['optimizer'] != 'adamw'),
                            ('relora_interval', relora_interval, projection == 'relora'),
                            ('tsvd_interval', tsvd_interval, projection == 'tsvd'),
                            ('elas_warmup_iters', elas_warmup_iters, mlp == 'elas')]:
        if on and value < max_iters and round(value * max_iters / lr_decay_iters) != value:
            misfit(f"{name}={value}, set for lr_decay_iters={lr_decay_iters} steps, falls at {value / max_iters:.0%} of "
                   f"this run; set --{name}={max(1, round(value * max_iters / lr_decay_iters))} to keep its share")
targets_seen = torch.zeros((), device=device, dtype=torch.long)  # since the last log
process_start = t0 = time.time()
x, y = train_batch(data_position, 0)  # the first micro-batch; each next one loads while the current one computes
while True:
    # 1. this step's schedules: the learning rate, and ELAS's sparsity (off during its dense warm-up)
    lr = relora.jagged_lr(get_lr, iter_num, relora_interval, relora_restart_warmup) if projection == 'relora' else get_lr(iter_num)
    for group in optimizer.param_groups:
        group['lr'] = lr
    if mlp == 'elas':
        elas.set_sparsity(raw_model, iter_num >= elas_warmup_iters)

    # 2. evaluate and checkpoint, every eval_interval steps and at the end
    if not measure_only and (iter_num % eval_interval == 0 or iter_num >= max_iters):
        val_loss = evaluate()
        stop_if_not_finite(val_loss, 'the validation loss')
        official = {'val_loss_official': evaluate_official()} if official_val_loss else {}
        log(f"iter {iter_num}: val loss {val_loss:.4f}, perplexity {math.exp(min(val_loss, 50)):.2f}"
            + (f" (the official code's convention: {official['val_loss_official']:.4f})" if official else ''))
        if iter_num > start_iter:
            if keep_checkpoints:  # (not at iter 0: saving AdamW's state before its first step would start it)
                save_checkpoint(os.path.join(out_dir, f'ckpt_{iter_num}.pt'))
            if val_loss < best_val_loss:
                best_val_loss = val_loss
                if keep_best:
                    save_checkpoint(os.path.join(out_dir, 'best.pt'))
            if always_save_checkpoint or iter_num >= max_iters:
                save_checkpoint(checkpoint_path)
        # recorded once its checkpoints are on disk: a log never holds a result whose state was not saved
        record({'iter': iter_num, 'val_loss': val_loss, 'val_ppl': math.exp(min(val_loss, 50)), **official})
        t0, timed_from = time.time(), iter_num  # leave the evaluation out of the step times
        targets_seen.zero_()
    if iter_num >= max_iters:
        break

    # 3. forward and backward over the micro-steps, gradients summed
    step_loss = torch.zeros((), device=device)
    for micro_step in range(gradient_accumulation_steps):
        last = micro_step == gradient_accumulation_steps - 1
        with gradient_sync(last), autocast:
            _, loss = model(x, y)
        targets_seen += (y >= 0).sum()  # the tokens trained on (the paper's rows: not padding), for tokens/s
        # prefetch the next micro-batch (after the last, the next step's first) while the GPU computes
        x, y = train_batch(data_position + last * sequences_per_step, (micro_step + 1) % gradient_accumulation_steps)
        (loss / gradient_accumulation_steps).backward()
        step_loss += loss.detach() / gradient_accumulation_steps

    # 4. clip, step, advance
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device_type == 'cuda' and iter_num == start_iter:  # weights and optimizer states: what stays between steps
        resident_memory = torch.cuda.memory_allocated(device) / 2**30
    iter_num += 1
    data_position += sequences_per_step
    flops_spent += flops_per_step

    # 5. each method's own work after an optimizer step, the logic in its file (TSVD: retraction, rank cuts;
    # ReLoRA: merges, restarts, pruned moments)
    if projection == 'relora' and relora.after_step(raw_model, optimizer, iter_num, relora_interval, relora_prune,
                                                    relora_prune_kind):
        log(f"iter {iter_num}: ReLoRA merged B A into W, restarted A and B, pruned {relora_prune:.0%} of their moments")
        record({'iter': iter_num, 'relora_merge': True})
    if projection == 'tsvd':
        ranks = tsvd.after_step(raw_model, optimizer, iter_num, tsvd_interval, tsvd_energy, tsvd_min_rank)
        if ranks:  # new ranks, new parameter tensors
            model = wrap(core)  # DDP around the new shapes
            flops_per_step = raw_model.flops_per_token(block_size, batch_size) * tokens_per_step
            model_flops_per_step = raw_model.flops_per_token(block_size, batch_size, recomputation=False) * tokens_per_step
            log(f"iter {iter_num}: TSVD ranks {min(ranks)}..{max(ranks)} (mean {sum(ranks) / len(ranks):.1f}), "
                f"{raw_model.num_params() / 1e6:.3f}M non-embedding parameters, {flops_per_step / tokens_per_step / 1e6:.2f} "
                f"MFLOPs per token (+{tsvd.retraction_flops(raw_model) / 1e6:.2f} MFLOPs per step to retract)")
            record({'iter': iter_num, 'tsvd_ranks': ranks, 'model_params': raw_model.num_params(False),
                    'flops_per_token': flops_per_step / tokens_per_step})

    # 6. log
    if iter_num % log_interval == 0 or iter_num == max_iters:
        if distributed:
            dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
            dist.all_reduce(targets_seen)
        loss_value = step_loss.item()
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, 'full_tensor') else grad_norm
        stop_if_not_finite(loss_value, 'the training loss')
        stop_if_not_finite(grad_norm.item(), 'the gradient norm')
        trained_s += time.time() - t0
        dt = (time.time() - t0) / (iter_num - timed_from)  # seconds per step since the last log
        tokens_per_s = targets_seen.item() / (dt * (iter_num - timed_from))
        t0, timed_from = time.time(), iter_num
        targets_seen.zero_()
        mfu = model_flops_per_step / dt / (peak_flops * world_size) if peak_flops else None  # the model's FLOPs
        hfu = flops_per_step / dt / (peak_flops * world_size) if peak_flops and checkpointing != 'none' else None
        memory = torch.cuda.max_memory_allocated(device) / 2**30 if device_type == 'cuda' else None
        eta = trained_s / (iter_num - start_iter) * (max_iters - iter_num)  # the whole run's rate, steadier than the last interval's
        if device_type == 'cpu' and dt > 3 * fastest_dt and not slow_told:  # the same steps, 3x slower: not the model
            slow_told = True
            log(f"steps take {dt / fastest_dt:.1f}x as long as earlier ones: if other programs use the CPU cores, "
                f"start train.py with OMP_NUM_THREADS set to the free cores (README, quick start)")
        fastest_dt = min(fastest_dt, dt)
        log(f"iter {iter_num}/{max_iters}: loss {loss_value:.4f}, lr {lr:.2e}, grad norm {grad_norm.item():.3f}, "
            f"{dt * 1000:.0f} ms/iter, {tokens_per_s:,.0f} tokens/s"
            + (f", MFU {mfu:.1%}" if mfu else '') + (f" (HFU, recomputation counted, {hfu:.1%})" if hfu else '')
            + (f", peak memory {memory:.1f} GiB" if memory else '')
            + f", eta {int(eta // 3600)}h{int(eta % 3600 // 60):02d}m")
        record({'iter': iter_num, 'loss': loss_value, 'lr': lr, 'grad_norm': grad_norm.item(), 'ms_per_iter': dt * 1000,
                'tokens_per_s': tokens_per_s, 'mfu': mfu, 'hfu': hfu, 'peak_memory_gib': memory,
                'resident_memory_gib': resident_memory,
                **({'sparse_24': iter_num - 1 >= elas_warmup_iters} if mlp == 'elas' else {})})

    # 7. a stop signal: this step's state saved, then out; under torchrun the processes agree at each log
    # step (one small all-reduce there, not a GPU sync every step), so that all stop at the same step
    stopping = stop_requested is not None
    if distributed:
        stopping = torch.tensor(float(stopping), device=device) if iter_num % log_interval == 0 else None
        if stopping is not None:
            dist.all_reduce(stopping, op=dist.ReduceOp.MAX)
        stopping = bool(stopping is not None and stopping.item())
    if stopping and iter_num < max_iters:
        if measure_only:
            raise SystemExit(f"{stop_requested or 'a stop signal'}: stopped after iter {iter_num} (measure_only: nothing saved)")
        save_checkpoint(checkpoint_path)
        raise SystemExit(f"{stop_requested or 'a stop signal'}: stopped after iter {iter_num}, saved in {checkpoint_path}; "
                         f"continue with the same command and --init_from=resume")

if measure_only:
    log(f"done: {iter_num} steps measured (measure_only: nothing evaluated or saved)")
else:
    log(f"done: {iter_num} steps, checkpoint in {checkpoint_path}"
        + (f" (best validation loss {best_val_loss:.4f} in {out_dir}/best.pt)" if keep_best and best_val_loss < float('inf') else '')
        + f"; generate text with: python sample.py --out_dir={out_dir}")
if distributed:  # drop the wrapped model and line the processes up before tearing down (clean exit with gloo)
    del model
    dist.barrier()
    dist.destroy_process_group()
