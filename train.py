"""
Train a LLaMA, CoLA or CoLA-M model on token shards from prepare.py.

    python train.py config/cpu_tiny.py                                        # a laptop CPU
    torchrun --standalone --nproc_per_node=8 train.py config/cola_130m.py     # one GPU node
    python train.py config/cola_60m.py --batch_size=32 --compile=False        # overrides

One flat script, in nanoGPT's order: config, distributed setup, data, model, optimizer, loop.
Tokens per step = batch_size x block_size x gradient_accumulation_steps x world size.
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import configure, public_settings
from model import ModelConfig, Transformer
from prepare import load_meta, read_shard

# ----------------------------------------------------------------------------- config
# I/O
out_dir = 'out'
data_dir = 'data/c4'
eval_interval = 1000  # evaluate, then checkpoint, every this many steps (and at the end)
eval_tokens = 10_000_000  # the validation budget: the same first tokens of the val split each time
log_interval = 10
init_from = 'scratch'  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
always_save_checkpoint = True  # the latest state, at every evaluation
keep_best = True  # also keep the state with the best validation loss as best.pt
wandb_log = False
wandb_project = 'nanocola'
wandb_run_name = 'run'
# data
batch_size = 64  # sequences per micro-step on each process
block_size = 256
gradient_accumulation_steps = 1  # micro-steps per optimizer step on each process
# model (ModelConfig's fields; vocab_size None: the data's vocabulary, padded to a multiple of 64)
vocab_size = None
n_layer = 8
n_head = 8
n_embd = 512
intermediate_size = 1376
rank = 128
only_lr_act = False
checkpointing = 'none'
norm_eps = 1e-6
fused_cola = True
# optimizer: AdamW, linear warmup then cosine decay to min_lr
learning_rate = 6e-3
min_lr = 6e-4
max_iters = 10000
lr_decay_iters = 10000
warmup_iters = 2000
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.999
grad_clip = 0.5
# system
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() else 'float32'  # 'float32' or 'bfloat16'
compile = torch.cuda.is_available()
parallel = 'ddp'  # 'ddp' (full replica per GPU) or 'fsdp' (FSDP2: parameters, grads, AdamW states sharded)
seed = 1337

config = configure(public_settings(globals()), sys.argv[1:])
globals().update(config)
if dtype not in ('float32', 'bfloat16') or parallel not in ('ddp', 'fsdp') or init_from not in ('scratch', 'resume'):
    raise SystemExit(f"dtype={dtype!r}, parallel={parallel!r}, init_from={init_from!r}: expected dtype 'float32' or "
                     f"'bfloat16', parallel 'ddp' or 'fsdp', init_from 'scratch' or 'resume'")

# ----------------------------------------------------------------------------- distributed setup
distributed = 'RANK' in os.environ  # launched by torchrun
if distributed:
    dist.init_process_group('nccl' if device.startswith('cuda') else 'gloo')
    rank_id, world_size, local_rank = dist.get_rank(), dist.get_world_size(), int(os.environ['LOCAL_RANK'])
    if device.startswith('cuda'):
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    else:  # share the cores instead of oversubscribing them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ['LOCAL_WORLD_SIZE'])))
else:
    rank_id, world_size = 0, 1
master = rank_id == 0
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
torch.manual_seed(seed)
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
tokens_per_step = batch_size * block_size * gradient_accumulation_steps * world_size


def log(*args):
    if master:
        print(*args, flush=True)


# ----------------------------------------------------------------------------- data
class TokenStream:
    """A split's shards as one stream of tokens. Sequence i is tokens [i*T, (i+1)*T] (T+1 tokens:
    inputs and the targets shifted by one); past the end, the stream starts over."""

    def __init__(self, split):
        names = meta['splits'][split]['shards']
        self.shards = [read_shard(os.path.join(data_dir, name)) for name in names]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])

    def tokens(self, start, n):
        out = []
        while n > 0:
            start %= self.starts[-1]
            i = np.searchsorted(self.starts, start, side='right') - 1
            piece = self.shards[i][start - self.starts[i]:][:n]
            out.append(piece)
            start, n = start + len(piece), n - len(piece)
        return np.concatenate(out)

    def batch(self, first_sequence, n_sequences):
        """Inputs and targets (n_sequences, T) of consecutive sequences, on device."""
        window = torch.from_numpy(self.tokens(first_sequence * block_size, n_sequences * block_size + 1).astype(np.int64))
        x, y = window[:-1].view(n_sequences, block_size), window[1:].view(n_sequences, block_size)
        if device_type == 'cuda':
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y


if not os.path.exists(os.path.join(data_dir, 'meta.json')):
    raise SystemExit(f"no token shards in {data_dir}/: run `python prepare.py --out_dir={data_dir}` (C4) or "
                     f"`python prepare.py --input='your/*.txt' --out_dir={data_dir}` first")
meta = load_meta(data_dir)
if not meta['splits'].get('train', {}).get('done') or not meta['splits'].get('val', {}).get('done'):
    raise SystemExit(f"{data_dir}/ is not finished: rerun the prepare.py command that made it (it resumes)")
train_data, val_data = TokenStream('train'), TokenStream('val')

# ----------------------------------------------------------------------------- model
checkpoint_path = os.path.join(out_dir, 'ckpt.pt')
model_fields = {k: config[k] for k in ModelConfig.__dataclass_fields__ if k in config}
model_fields['vocab_size'] = vocab_size or -(-meta['vocab_size'] // 64) * 64
checkpoint = None
if init_from == 'resume':
    if not os.path.exists(checkpoint_path):
        raise SystemExit(f"init_from='resume' but there is no checkpoint {checkpoint_path}")
    checkpoint = torch.load(checkpoint_path, map_location='cpu', weights_only=False)
    if checkpoint['encoding'] != meta['encoding']:
        raise SystemExit(f"{checkpoint_path} was trained on encoding={checkpoint['encoding']!r} data, "
                         f"but {data_dir}/ holds {meta['encoding']!r} tokens")
    # The shapes come from the checkpoint; how to checkpoint activations is this run's choice.
    model_fields.update({k: v for k, v in checkpoint['model_config'].items() if k not in ('checkpointing', 'fused_cola')})
if meta['vocab_size'] > model_fields['vocab_size']:
    raise SystemExit(f"vocab_size={model_fields['vocab_size']} is smaller than the vocabulary of {data_dir}/ "
                     f"({meta['encoding']}, {meta['vocab_size']} tokens)")
model_config = ModelConfig(**model_fields)
with torch.device(device):  # built where it runs (a 7b model would not fit in 8 copies in host memory)
    model = raw_model = Transformer(model_config)
log(f"{raw_model.num_params() / 1e6:.2f}M non-embedding parameters ({raw_model.num_params(False) / 1e6:.2f}M in all), "
    f"{tokens_per_step:,} tokens per step = {batch_size} x {block_size} x {gradient_accumulation_steps} x {world_size}")

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
optimizer = raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
iter_num, best_val_loss, data_position = 0, float('inf'), 0  # data_position: the next train sequence
if checkpoint is not None:
    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(raw_model, checkpoint['model'], options=full)
    set_optimizer_state_dict(raw_model, optimizer, checkpoint['optimizer'], options=full)
    iter_num, best_val_loss, data_position = checkpoint['iter_num'], checkpoint['best_val_loss'], checkpoint['data_position']
    torch.set_rng_state(checkpoint['rng']['cpu'])
    if device_type == 'cuda' and checkpoint['rng']['cuda'] is not None:
        torch.cuda.set_rng_state(checkpoint['rng']['cuda'])
    log(f"resumed from {checkpoint_path} at iter {iter_num}")
    checkpoint = None  # free the memory
if compile:
    model = torch.compile(model)
if distributed and parallel == 'ddp':
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)


def get_lr(it):
    """Linear warmup, then cosine from learning_rate down to min_lr at lr_decay_iters."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    progress = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)


@torch.no_grad()
def evaluate():
    """The exact mean loss per token over the fixed validation budget: the first eval_tokens tokens of
    the val split (rounded down to whole batches on every process), split between the processes."""
    model.eval()
    batches = max(1, eval_tokens // (batch_size * block_size * world_size))
    total = torch.zeros(2, device=device, dtype=torch.float64)  # loss sum, token count
    for b in range(batches):
        x, y = val_data.batch((b * world_size + rank_id) * batch_size, batch_size)
        with autocast:
            _, loss = model(x, y)
        total += torch.stack([loss.double() * y.numel(), torch.tensor(y.numel(), device=device, dtype=torch.float64)])
    if distributed:
        dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


def save_checkpoint(path):
    """Model, optimizer, step, RNG states and config, written atomically (temporary file, then rename)."""
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {
        'model': get_model_state_dict(raw_model, options=full),
        'optimizer': get_optimizer_state_dict(raw_model, optimizer, options=full),
        'model_config': vars(model_config), 'config': config, 'encoding': meta['encoding'],
        'iter_num': iter_num, 'data_position': data_position,
        'best_val_loss': best_val_loss,
        'rng': {'cpu': torch.get_rng_state(), 'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None},
    }
    if master:
        torch.save(state, path + '.tmp')
        os.replace(path + '.tmp', path)


def stop_if_not_finite(value, what):
    if not math.isfinite(value):
        kept = f"the last good checkpoint {checkpoint_path} is kept" if os.path.exists(checkpoint_path) else "no checkpoint was written"
        raise SystemExit(f"{what} is {value} at iter {iter_num}: stopping; {kept}")


# ----------------------------------------------------------------------------- training loop
if master:
    os.makedirs(out_dir, exist_ok=True)
    log_file = open(os.path.join(out_dir, 'log.jsonl'), 'a')
    log_file.write(json.dumps({'config': config, 'model_config': vars(model_config), 'tokens_per_step': tokens_per_step,
                               'flops_per_token': raw_model.flops_per_token(block_size),
                               'model_params': raw_model.num_params(False)}) + '\n')
    if wandb_log:
        import wandb
        wandb.init(project=wandb_project, name=wandb_run_name, config=config)
PEAK_FLOPS = {'A100': 312e12, 'H100': 989e12, 'H200': 989e12}  # dense bf16 per GPU
gpu_name = torch.cuda.get_device_name(device) if device_type == 'cuda' else ''
peak_flops = next((v for k, v in PEAK_FLOPS.items() if k in gpu_name), None)
flops_per_step = raw_model.flops_per_token(block_size) * tokens_per_step


def record(entry):
    """A line of out_dir/log.jsonl (and wandb), with the training tokens and FLOPs so far and the
    seconds since this process started."""
    entry.update(tokens=iter_num * tokens_per_step, flops=iter_num * flops_per_step, elapsed_s=time.time() - process_start)
    if master:
        log_file.write(json.dumps(entry) + '\n')
        log_file.flush()
        if wandb_log:
            wandb.log(entry, step=entry['iter'])


start_iter = timed_from = iter_num  # timed_from: the step where the current timing started
process_start = t0 = time.time()
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group['lr'] = lr

    if iter_num % eval_interval == 0 or iter_num >= max_iters:
        val_loss = evaluate()
        stop_if_not_finite(val_loss, 'the validation loss')
        log(f"iter {iter_num}: val loss {val_loss:.4f}, perplexity {math.exp(min(val_loss, 50)):.2f}")
        record({'iter': iter_num, 'val_loss': val_loss, 'val_ppl': math.exp(min(val_loss, 50))})
        if iter_num > start_iter:
            if val_loss < best_val_loss:
                best_val_loss = val_loss
                if keep_best:
                    save_checkpoint(os.path.join(out_dir, 'best.pt'))
            if always_save_checkpoint or iter_num >= max_iters:
                save_checkpoint(checkpoint_path)
        t0, timed_from = time.time(), iter_num  # leave the evaluation out of the step times
    if iter_num >= max_iters:
        break

    # one optimizer step: this process's contiguous slice of the global batch, in micro-steps
    first = data_position + rank_id * batch_size * gradient_accumulation_steps
    step_loss = torch.zeros((), device=device)
    for micro in range(gradient_accumulation_steps):
        x, y = train_data.batch(first + micro * batch_size, batch_size)
        last = micro == gradient_accumulation_steps - 1
        sync = nullcontext() if last or not distributed or parallel == 'fsdp' else model.no_sync()
        if parallel == 'fsdp':
            raw_model.set_requires_gradient_sync(last)  # reduce-scatter gradients only on the last micro-step
        with sync, autocast:
            _, loss = model(x, y)
        (loss / gradient_accumulation_steps).backward()
        step_loss += loss.detach() / gradient_accumulation_steps
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    data_position += tokens_per_step // block_size

    if iter_num % log_interval == 0 or iter_num == max_iters:
        if distributed:
            dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
        loss_value = step_loss.item()
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, 'full_tensor') else grad_norm
        stop_if_not_finite(loss_value, 'the training loss')
        stop_if_not_finite(grad_norm.item(), 'the gradient norm')
        dt = (time.time() - t0) / (iter_num - timed_from)  # seconds per step
        t0, timed_from = time.time(), iter_num
        mfu = flops_per_step / dt / (peak_flops * world_size) if peak_flops else None
        memory = torch.cuda.max_memory_allocated(device) / 2**30 if device_type == 'cuda' else None
        log(f"iter {iter_num}: loss {loss_value:.4f}, lr {lr:.2e}, grad norm {grad_norm.item():.3f}, "
            f"{dt * 1000:.0f} ms/iter, {tokens_per_step / dt:,.0f} tokens/s"
            + (f", MFU {mfu:.1%}" if mfu else '') + (f", peak memory {memory:.1f} GiB" if memory else ''))
        record({'iter': iter_num, 'loss': loss_value, 'lr': lr, 'grad_norm': grad_norm.item(), 'ms_per_iter': dt * 1000,
                'tokens_per_s': tokens_per_step / dt, 'mfu': mfu, 'peak_memory_gib': memory})

if distributed:  # drop the wrapped model and line the processes up before tearing down (clean exit with gloo)
    del model
    dist.barrier()
    dist.destroy_process_group()
