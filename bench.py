"""
CoLA's efficiency claims, measured side by side: parameters, training FLOPs, activation memory,
recomputation and throughput of 13 variants at the same shapes: full-rank, full-rank + 'full' checkpointing, CoLA,
CoLA + 'full', CoLA-M, DLR, ELAS, TSVD (at its start rank, CoLA's), GaLore, Fira, Low-Rank, SLTrain and ReLoRA.

    python bench.py                                          # 350m widths, 2 layers, on the CPU
    python bench.py --config=config/cola_1b.py --n_layer=0 --device=meta  # counts only (no timing), any size
    python bench.py --config=config/cola_350m.py --n_layer=0 --device=cuda --dtype=bfloat16 --compile_model --batch_size=64
    python bench.py --generation --config=config/cola_1b.py  # KV-cached generation, CoLA against full-rank
    python bench.py --table=params                           # parameter counts of every config in config/
    python bench.py --table=memory                           # computed memory per GPU of every config
    python bench.py --table=roofline                         # a model of a training step's speed on an H100 / H200
    python bench.py --elas_sparse                            # ELAS's FFN, 2:4 sparse kernels against dense (CUDA)
    python bench.py --sltrain_ways                           # SLTrain: dense rebuild against low-rank + sparse products

Counts are measured, not derived: FLOPs with torch.utils.flop_counter.FlopCounterMode, activation
memory as the bytes still allocated after a forward pass (the profiler's memory events on CPU,
torch.cuda.memory_allocated on CUDA), at two depths and subtracted, so the cost of one layer is
isolated from embeddings and logits.
"""

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from json import dumps

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from configurator import configure, public_settings, read_config_file
from methods import elas, galore, sltrain
from model import CoLALinear, ModelConfig, Transformer

ROOT = os.path.dirname(os.path.abspath(__file__))  # config/ is found from here, wherever bench.py is run

# FlopCounterMode has no formula for PyTorch's CPU attention kernel; give it the generic SDPA one.
CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *args, **kwargs: sdpa_flop_count(q, k, v),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda grad_out, q, k, v, *args, **kwargs: sdpa_backward_flop_count(grad_out, q, k, v),
}


def count_flops(model, idx):
    """(forward, backward) FLOPs of one training step of model on the tokens idx (B, T)."""
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        _, loss = model(idx, idx)
    forward = counter.get_total_flops()
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        loss.backward()
    return forward, counter.get_total_flops()


def measure_flops(config, seq_len, device='meta'):
    """Per token: training FLOPs (forward + backward) and the part of backward that is recomputation
    (backward FLOPs minus those of the same model without checkpointing)."""
    idx = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    totals = {}
    for mode in {'none', config.checkpointing}:
        with torch.device(device):
            model = Transformer(replace(config, checkpointing=mode))
        totals[mode] = count_flops(model, idx)
    forward, backward = totals[config.checkpointing]
    return (forward + backward) / seq_len, (backward - totals['none'][1]) / seq_len


@contextmanager
def quiet_stderr():
    """The profiler's C++ side prints a line to stderr at each start and stop: mute file descriptor 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, 'w') as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _allocated_after_forward(model, idx):
    if idx.is_cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        _, loss = model(idx, idx)
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - before
    with quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        _, loss = model(idx, idx)
    return sum(event.self_cpu_memory_usage for event in prof.events())


def activation_bytes(config, batch_size, seq_len, device='cpu', dtype=torch.float32):
    """Bytes kept for backward per token per layer: what a forward pass leaves allocated, with
    n_layer=2 minus n_layer=1, divided by the number of tokens."""
    idx = torch.randint(0, config.vocab_size, (batch_size, seq_len), device=device)
    alive = []
    for n_layer in (1, 2):
        model = Transformer(replace(config, n_layer=n_layer)).to(device)
        with torch.autocast(device_type=idx.device.type, dtype=dtype, enabled=dtype != torch.float32):
            alive.append(_allocated_after_forward(model, idx))
    return (alive[1] - alive[0]) / (batch_size * seq_len)


def train_step_seconds(model, optimizer, idx, dtype):
    """Wall time of one training step (forward, backward, optimizer), synchronised on CUDA."""
    autocast = torch.autocast(device_type=idx.device.type, dtype=dtype, enabled=dtype != torch.float32)
    if idx.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with autocast:
        _, loss = model(idx, idx)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if idx.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def resident_bytes(model, optimizer):
    """Bytes of a model's parameters and its optimizer's state (gradients are freed after each step)."""
    tensors = list(model.parameters()) + [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


VARIANTS = [  # name (compare.py's method names), changes to the CoLA shape
    ('full-rank', dict(rank=0)), ('full-rank + full ckpt', dict(rank=0, checkpointing='full')),
    ('cola', {}), ('cola + full ckpt', dict(checkpointing='full')), ('cola-m', dict(checkpointing='cola-m')),
    ('dlr', dict(dlr_alpha=1.0)), ('elas', dict(mlp='elas')), ('tsvd', dict(projection='tsvd')),  # TSVD at its start rank
    ('galore', dict(rank=0)), ('fira', dict(rank=0)),  # full-rank models; the optimizer projects at CoLA's rank
    ('low-rank', dict(projection='low-rank')), ('sltrain', dict(projection='sltrain')), ('relora', dict(projection='relora')),
]
GALORE_UPDATE_INTERVAL, GALORE_SCALE = 200, 0.25  # the official 60m scripts'


def make_optimizer(name, model, rank):
    """AdamW, or for the 'galore' and 'fira' rows their optimizer at rank (CoLA's r) on the full-rank model."""
    if name in ('galore', 'fira'):
        return galore.build_optimizer(model, name, 1e-4, (0.9, 0.95), 0.0, rank, GALORE_UPDATE_INTERVAL, GALORE_SCALE)
    return model.configure_optimizers(0.0, 1e-4, (0.9, 0.95), next(model.parameters()).device.type)


def optimizer_state_bytes(name, config, rank):
    """Bytes of the optimizer's own state tensors after one step, on the meta device (shapes only, any size)."""
    with torch.device('meta'):
        model = Transformer(config)
    optimizer = make_optimizer(name, model, rank)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return galore.state_bytes(optimizer), galore.flops_per_step(optimizer)


def run_benchmark(shape, device, dtype, batch_size, seq_len, steps, warmup, compile_model):
    """Every variant at the same shapes: counts for all, timings unless device is 'meta'."""
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]
    configs = {name: replace(shape, **changes) for name, changes in VARIANTS}
    rows, tokens_per_step = {}, batch_size * seq_len
    for i, (name, config) in enumerate(configs.items()):
        print(f"counting {name} ({i + 1} of {len(configs)}) ...", file=sys.stderr, flush=True)  # progress, not results
        with torch.device('meta'):
            model = Transformer(config)
        flops, recompute = measure_flops(config, seq_len)
        memory_device = 'cpu' if device == 'meta' else device  # activations need real tensors: 1 sequence
        state_bytes, optimizer_flops = optimizer_state_bytes(name, config, shape.rank)
        rows[name] = {
            'optimizer_state_bytes_per_param': state_bytes / model.num_params(False),
            'optimizer_flops_per_token': optimizer_flops / tokens_per_step,
            'params_M': model.num_params(False) / 1e6, 'non_embedding_params_M': model.num_params() / 1e6,
            'flops_per_token': flops, 'flops_per_token_analytic': model.flops_per_token(seq_len),
            'recompute_flops_per_token': recompute, 'sparse_flops_saved_per_token': elas.sparse_flops_saved(model),
            'activation_bytes_per_token_per_layer': activation_bytes(config, 1 if device == 'meta' else batch_size,
                                                                     seq_len, memory_device, ptdtype),
        }
    if device != 'meta':
        idx = torch.randint(0, shape.vocab_size, (batch_size, seq_len), device=device)
        models = {name: Transformer(config).to(device) for name, config in configs.items()}
        optimizers = {name: make_optimizer(name, m, shape.rank) for name, m in models.items()}
        runs = {name: torch.compile(m) if compile_model else m for name, m in models.items()}
        times = {name: [] for name in models}
        for step in range(warmup + steps):  # interleaved: A B C A B C ..., so drifts hit all alike
            print(f"timing round {step + 1} of {warmup + steps} ...", file=sys.stderr, flush=True)
            for name in models:
                if device.startswith('cuda'):  # the step's own peak: without the other variants' resident memory
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    others = torch.cuda.memory_allocated() - resident_bytes(models[name], optimizers[name])
                seconds = train_step_seconds(runs[name], optimizers[name], idx, ptdtype)
                if step >= warmup:
                    times[name].append(seconds)
                if device.startswith('cuda'):
                    rows[name]['peak_memory_GiB'] = (torch.cuda.max_memory_allocated() - others) / 2**30
        for name in models:
            rows[name]['tokens_per_s'] = batch_size * seq_len / sorted(times[name])[len(times[name]) // 2]
    return rows


def markdown(rows, rank_of_rows):
    base, base_ckpt = rows['full-rank'], rows['full-rank + full ckpt']
    timed, peak = 'tokens_per_s' in base, 'peak_memory_GiB' in base
    head = ['variant', 'params (M)', 'x full', 'GFLOPs/token (counted)', '(analytic)', 'x full',
            'activation bytes/token/layer', 'x full', 'recompute MFLOPs/token', 'x full-rank ckpt',
            'optimizer state bytes/param', 'optimizer MFLOPs/token']
    head += ['tokens/s', 'x full'] if timed else []
    head += ['peak memory (GiB)', 'x full'] if peak else []
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, r in rows.items():
        cells = [name, f"{r['params_M']:.1f}", f"{r['params_M'] / base['params_M']:.2f}",
                 f"{r['flops_per_token'] / 1e9:.3f}", f"{r['flops_per_token_analytic'] / 1e9:.3f}",
                 f"{r['flops_per_token'] / base['flops_per_token']:.2f}",
                 f"{r['activation_bytes_per_token_per_layer']:,.0f}",
                 f"{r['activation_bytes_per_token_per_layer'] / base['activation_bytes_per_token_per_layer']:.2f}",
                 f"{r['recompute_flops_per_token'] / 1e6:.1f}",
                 f"{r['recompute_flops_per_token'] / base_ckpt['recompute_flops_per_token']:.2f}",
                 f"{r['optimizer_state_bytes_per_param']:.2f}", f"{r['optimizer_flops_per_token'] / 1e6:.3f}"]
        cells += [f"{r['tokens_per_s']:,.0f}", f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}"] if timed else []
        cells += [f"{r['peak_memory_GiB']:.2f}", f"{r['peak_memory_GiB'] / base['peak_memory_GiB']:.2f}"] if peak else []
        lines.append('| ' + ' | '.join(cells) + ' |')
    cola, colam = rows['cola'], rows['cola-m']
    lines += ['', 'Against the paper:',
              f"- compute: CoLA needs {cola['flops_per_token'] / base['flops_per_token']:.2f}x full-rank's training "
              f"FLOPs per token (paper: about 0.5x at r = d/4)",
              f"- parameters: full-rank has {base['params_M'] / cola['params_M']:.2f}x CoLA's "
              f"({base['non_embedding_params_M'] / cola['non_embedding_params_M']:.2f}x without embeddings; paper: about 2x)",
              f"- memory: CoLA-M keeps {colam['activation_bytes_per_token_per_layer'] / cola['activation_bytes_per_token_per_layer']:.2f}x "
              f"CoLA's activations (paper: about 2/3 less)",
              f"- recomputation: CoLA-M recomputes {colam['recompute_flops_per_token'] / base_ckpt['recompute_flops_per_token']:.2f}x "
              f"what full-rank + full ckpt does (paper: about 5x cheaper, 0.2x)"]
    elas = rows['elas']
    lines += [f"- ELAS: {elas['params_M'] / cola['params_M']:.2f}x CoLA's parameters and {elas['flops_per_token'] / cola['flops_per_token']:.2f}x "
              f"its dense FLOPs; its 2:4 sparse product skips {elas['sparse_flops_saved_per_token'] / 1e6:.1f} MFLOPs per token "
              f"({elas['sparse_flops_saved_per_token'] / elas['flops_per_token']:.1%} of its training FLOPs; not taken off the counts above, "
              f"and only where the semi-structured kernels run: CUDA, fp16/bf16)"]
    gal, fira = rows['galore'], rows['fira']
    lines += [f"- GaLore / Fira (optimizer state of the full-rank model, projected at r = {rank_of_rows}): "
              f"{gal['optimizer_state_bytes_per_param']:.2f} / {fira['optimizer_state_bytes_per_param']:.2f} bytes per "
              f"parameter against AdamW's {base['optimizer_state_bytes_per_param']:.2f}, for "
              f"{gal['optimizer_flops_per_token'] / 1e6:.2f} / {fira['optimizer_flops_per_token'] / 1e6:.2f} MFLOPs per token "
              f"of projections and SVDs (amortised over T = {GALORE_UPDATE_INTERVAL} steps of this step's tokens)"]
    if timed:
        flop_ratio = base['flops_per_token'] / cola['flops_per_token']
        lines += [f"- throughput: CoLA {cola['tokens_per_s'] / base['tokens_per_s']:.2f}x full-rank (FLOP ratio "
                  f"{flop_ratio:.2f}x, so {cola['tokens_per_s'] / base['tokens_per_s'] / flop_ratio:.0%} of it turns into "
                  f"speed; paper: 1.86x), CoLA-M {colam['tokens_per_s'] / cola['tokens_per_s']:.2f}x CoLA, "
                  f"DLR {rows['dlr']['tokens_per_s'] / cola['tokens_per_s']:.2f}x CoLA, ELAS {elas['tokens_per_s'] / cola['tokens_per_s']:.2f}x CoLA"]
    if peak:
        lines += [f"- peak memory of a training step: CoLA-M {colam['peak_memory_GiB'] / cola['peak_memory_GiB']:.2f}x CoLA"]
    return '\n'.join(lines)


def config_shape(path, **overrides):
    """The ModelConfig of a config file: train.py's defaults, then the file's values, then overrides."""
    from_file = read_config_file(path)
    settings = {k: v.default for k, v in ModelConfig.__dataclass_fields__.items()}
    settings.update({k: v for k, v in from_file.items() if k in settings}, **overrides)
    return ModelConfig(**settings), from_file


def params_table(paths):
    """Markdown rows: shapes and parameter counts of each config file, with GPT-2's padded vocabulary."""
    lines = ['| config | d | f | heads | layers | rank | vocab | params (M) | non-embedding (M) |', '|' + '---|' * 9]
    for path in paths:
        shape, _ = config_shape(path)
        with torch.device('meta'):
            model = Transformer(shape)
        lines.append(f'| {os.path.relpath(path, ROOT)} | {shape.n_embd} | {shape.intermediate_size} | {shape.n_head} | {shape.n_layer} | '
                     f'{shape.rank} | {shape.vocab_size} | {model.num_params(False) / 1e6:.1f} | {model.num_params() / 1e6:.1f} |')
    return '\n'.join(lines)


def memory_per_gpu_table(paths, gpus=8):
    """Computed (not measured) memory per GPU of each config's training run on `gpus` GPUs, and of
    CoLA-M for each CoLA config: 16 bytes per parameter (fp32 weight, grad and two AdamW moments;
    divided by the GPUs under FSDP), plus activations (bytes per token per layer measured on the CPU
    under bf16 autocast, times layers and micro-batch tokens), plus the logits (bf16, their fp32 copy
    for the loss, and its gradient). Prints each row as it is measured."""
    print('| config | parallel | micro-batch | weights + grads + AdamW (GiB) | activations (GiB) | logits (GiB) | total (GiB) |')
    print('|---|---|---|---|---|---|---|', flush=True)
    for path in paths:
        for mode in ('none', 'cola-m') if 'cola_' in path else ('none',):
            print(f"measuring {os.path.relpath(path, ROOT)} ...", file=sys.stderr, flush=True)
            shape, settings = config_shape(path, checkpointing=mode)
            with torch.device('meta'):
                params = Transformer(shape).num_params(False)
            states = 16 * params / (gpus if settings.get('parallel') == 'fsdp' else 1)
            tokens = settings.get('batch_size', 64) * shape.block_size
            activations = activation_bytes(shape, 1, shape.block_size, dtype=torch.bfloat16) * shape.n_layer * tokens
            logits = tokens * shape.vocab_size * (2 + 4 + 4)
            name = os.path.relpath(path, ROOT) + (' --checkpointing=cola-m' if mode == 'cola-m' else '')
            print(f"| {name} | {settings.get('parallel', 'ddp')} | {tokens // shape.block_size} x {shape.block_size} | "
                  f"{states / 2**30:.1f} | {activations / 2**30:.1f} | {logits / 2**30:.1f} | "
                  f"{(states + activations + logits) / 2**30:.1f} |", flush=True)


GPUS = {'h100': (800e12, 3.0e12), 'h200': (800e12, 4.3e12)}  # measured dense bf16 FLOP/s, copy bandwidth in bytes/s


def roofline_step(shape, tokens, gpu, checkpointing='none'):
    """A model, not a measurement: seconds per token of one bf16 training step, from each matmul's time at the GPU's
    dense rate or its bytes at the copy bandwidth, whichever is longer (x @ W, dx and dW: three GEMMs of the same
    FLOPs and bytes), attention at the dense rate, and each elementwise pass's bytes (2 per element read or written) at
    the copy bandwidth. Passes per layer and token, forward: norms 2d + 2d, RoPE 4d, residual adds 3d + 3d, SwiGLU's
    product 3f; CoLA's SiLU 2 r-wide values per layer; backward twice the forward's, CoLA's fused pass 4 r-wide values
    per layer. CoLA-M adds the forward's passes and products again, but for the o and down layers' up-products; the
    optimizer step and the logits' passes (the same for every method) are left out. Returns (matmul s, elementwise s)."""
    flops_rate, bandwidth = GPUS[gpu]
    d, f, r, T = shape.n_embd, shape.intermediate_size, shape.rank, shape.block_size

    def gemm(k, n, times=3):  # per token, for tokens rows
        return times * max(2 * k * n / flops_rate, 2 * (tokens * k + k * n + tokens * n) / tokens / bandwidth)
    if r:
        downs = [(d, 3 * r), (d, r), (d, 2 * r), (f, r)]  # [A_q | A_k | A_v], A_o, [A_gate | A_up], A_down
        ups = [(r, d)] * 4 + [(r, f)] * 2 + [(r, d)]  # q, k, v, o, gate, up, down
        matmul = sum(gemm(k, n) for k, n in downs + ups)
        recomputed = [(r, d)] * 3 + [(r, f)] * 2  # CoLA-M's forward again: the up-products inside its checkpoints
    else:
        matmul = sum(gemm(k, n) for k, n in [(d, d)] * 4 + [(d, f)] * 2 + [(f, d)])
        recomputed = []
    attention = 4 * T * d / flops_rate * 3  # scores and mixing, forward and twice that backward
    shared = 14 * d + 3 * f  # values read or written per token by the forward's norms, RoPE, adds and SwiGLU product
    silu = 14 * r  # CoLA's SiLU forward, 7 layers (0 for full-rank); its fused backward pass moves twice that
    elementwise = 2 * (3 * shared + 3 * silu) / bandwidth
    if checkpointing == 'cola-m':  # the forward again, but for o's and down's up-products (outside its checkpoints)
        matmul += sum(gemm(k, n, times=1) for k, n in recomputed)
        attention += 4 * T * d / flops_rate
        elementwise += 2 * (shared + silu * 5 / 7) / bandwidth
    head = 6 * d * shape.vocab_size / shape.n_layer / flops_rate  # the output layer's share per layer
    return shape.n_layer * (matmul + attention + head), shape.n_layer * elementwise


def roofline_table(paths):
    """The roofline model of one training step per config: tokens/s it allows on an H100 and an H200, CoLA's and
    CoLA-M's ratios, and where the time goes."""
    lines = ['| size | micro-batch | GPU | full-rank tokens/s | CoLA tokens/s | CoLA / full-rank | CoLA-M / CoLA | '
             "elementwise share of CoLA's step |", '|' + '---|' * 8]
    for path in [p for p in paths if os.path.basename(p).startswith('cola_')]:
        shape, settings = config_shape(path, vocab_size=50304)
        tokens = settings.get('batch_size', 64) * shape.block_size
        for gpu in GPUS:
            full, cola, cola_m = (sum(roofline_step(replace(shape, rank=rank), tokens, gpu, mode)) for rank, mode in
                                  [(0, 'none'), (shape.rank, 'none'), (shape.rank, 'cola-m')])
            share = roofline_step(shape, tokens, gpu)[1] / cola
            lines.append(f"| {os.path.basename(path)[5:-3]} | {tokens // shape.block_size} x {shape.block_size} | {gpu} | "
                         f"{1 / full:,.0f} | {1 / cola:,.0f} | {full / cola:.2f}x | {cola / cola_m:.2f}x | {share:.0%} |")
    return '\n'.join(lines)


def generation_benchmark(shape, device, ptdtype, batch, prompt_tokens, new_tokens):
    """Tokens/s of KV-cached greedy generation, and memory of weights plus KV cache, full-rank vs CoLA."""
    rows = {}
    models = {name: Transformer(replace(shape, rank=r)).to(device, ptdtype).eval()
              for name, r in [('full-rank', 0), ('cola', shape.rank)]}
    idx = torch.randint(0, shape.vocab_size, (batch, prompt_tokens), device=device)
    times = {name: [] for name in models}
    for step in range(4):  # interleaved; the first round warms up
        for name, model in models.items():
            if device.startswith('cuda'):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            model.generate(idx, new_tokens, temperature=0)
            if device.startswith('cuda'):
                torch.cuda.synchronize()
                rows.setdefault(name, {})['peak_GiB'] = torch.cuda.max_memory_allocated() / 2**30
            if step > 0:
                times[name].append(time.perf_counter() - t0)
    element = torch.finfo(ptdtype).bits // 8
    kv_cache = 2 * shape.n_layer * batch * shape.block_size * shape.n_embd * element
    lines = ['| model | params (M) | weights + KV cache (MiB) | tokens/s |' + (' peak memory (GiB) |' if device.startswith('cuda') else ''),
             '|---|---|---|---|' + ('---|' if device.startswith('cuda') else '')]
    for name, model in models.items():
        row = rows.setdefault(name, {})
        row['params'] = model.num_params(False)
        row['memory'] = row['params'] * element + kv_cache
        row['tokens_per_s'] = batch * new_tokens / sorted(times[name])[1]
        lines.append(f"| {name} | {row['params'] / 1e6:.1f} | {row['memory'] / 2**20:.0f} | {row['tokens_per_s']:,.1f} |"
                     + (f" {row['peak_GiB']:.2f} |" if 'peak_GiB' in row else ''))
    full, cola = rows['full-rank'], rows['cola']
    lines.append(f"\nCoLA: {cola['tokens_per_s'] / full['tokens_per_s']:.2f}x the generation throughput, "
                 f"{full['memory'] / cola['memory']:.2f}x less memory for weights + KV cache "
                 f"(paper: about 1.64x and 1.67x at r = d/4)")
    return '\n'.join(lines)


def sltrain_ways_benchmark(device, steps=7):
    """SLTrain's y = x W^T with W = s B A + S two ways, forward and backward, interleaved, median ms: the dense
    W rebuilt and one dense matmul (what methods/sltrain.py runs), against the low-rank product plus a
    sparse product with S (torch.sparse.mm), at 3% density."""
    print('| W (d_out x d_in), rank, tokens | dense rebuild ms | low-rank + sparse ms | sparse / dense |')
    print('|---|---|---|---|')
    for d_in, d_out, r, tokens in [(256, 256, 64, 4096), (512, 512, 128, 4096), (512, 1376, 128, 4096)]:
        layer = sltrain.SLTrainLinear(d_in, d_out, r).to(device)
        torch.nn.init.normal_(layer.B)
        x = torch.randn(tokens, d_in, device=device, requires_grad=True)
        dy = torch.randn(tokens, d_out, device=device)
        rows, cols = layer.support // d_in, layer.support % d_in

        def low_rank_plus_sparse():
            S = torch.sparse_coo_tensor(torch.stack([rows, cols]), layer.values, (d_out, d_in), check_invariants=False)
            return layer.scale * ((x @ layer.A.T) @ layer.B.T) + torch.sparse.mm(S, x.T).T

        times = {layer: [], low_rank_plus_sparse: []}
        for _ in range(steps):
            for fn in times:
                t0 = time.perf_counter()
                fn(x).backward(dy) if fn is layer else fn().backward(dy)
                if device.startswith('cuda'):
                    torch.cuda.synchronize()
                times[fn].append(time.perf_counter() - t0)
        dense, sparse = (sorted(t)[len(t) // 2] * 1e3 for t in times.values())
        print(f"| {d_out} x {d_in}, {r}, {tokens} | {dense:.1f} | {sparse:.1f} | {sparse / dense:.2f}x |")


def elas_sparse_benchmark(tokens=16384, dtype=torch.bfloat16):
    """Forward+backward time of ELAS's FFN on CoLA layers with the 2:4 semi-structured sparse product
    against the same FFN computed dense, at the 350m and 1b widths (CUDA)."""
    from triton.testing import do_bench
    print(f'ELAS FFN forward+backward, {tokens} tokens, {dtype}, {torch.cuda.get_device_name()}')
    print('| widths | d | hidden | r | dense ms | 2:4 sparse ms | speed-up |')
    print('|---|---|---|---|---|---|---|')
    for name, (d, f, r) in {'350m': (1024, 2736, 256), '1b': (2048, 5461, 512)}.items():
        mlp = elas.ElasMLP(d, f, lambda d_in, d_out: CoLALinear(d_in, d_out, r)).to('cuda', dtype)
        elas.set_sparsity(mlp, True)
        x = torch.randn(tokens, d, device='cuda', dtype=dtype, requires_grad=True)
        dy = torch.randn(tokens, d, device='cuda', dtype=dtype)
        ms = {}
        for label, on in [('dense', False), ('sparse', True)]:
            elas.SEMI_STRUCTURED = on
            ms[label] = do_bench(lambda: torch.autograd.backward(mlp(x), dy), return_mode='median')
        elas.SEMI_STRUCTURED = True
        print(f"| ELAS {name} | {d} | {mlp.up_proj.B.size(1)} | {r} | {ms['dense']:.3f} | {ms['sparse']:.3f} | "
              f"{ms['dense'] / ms['sparse']:.2f}x |")


if __name__ == '__main__':
    import glob

    # ------------------------------------------------------------------------- config
    config = ''  # a config file whose shapes to use; '' = the shapes below
    n_layer = 2  # 0: the config file's depth
    n_head = 16  # attention heads (350m's)
    n_embd = 1024  # the model width d (350m's)
    intermediate_size = 2736  # SwiGLU's hidden width f (350m's)
    rank = 256  # CoLA's r (350m's)
    vocab_size = 0  # 0: 4096 for the shapes above (with 2 layers, the output layer's share of the FLOPs
    #                 is then about that of the real 350m), GPT-2's 50304 with a config file
    only_lr_act = False  # True: the MLP drops SwiGLU's own SiLU (the paper from 350m on)
    device = 'cpu'  # 'cpu', 'cuda', or 'meta' (counts only, any size)
    dtype = 'float32'  # 'float32' or 'bfloat16'
    batch_size = 4  # sequences per timed step
    seq_len = 256  # tokens per sequence
    steps = 5  # timed training steps per variant (interleaved, median)
    warmup = 2  # untimed steps first
    compile_model = False  # torch.compile each variant
    as_json = False  # print JSON instead of Markdown
    table = ''  # 'params', 'memory' or 'roofline': instead, parameter counts, computed memory per GPU or the roofline
    #             model of a training step on an H100 and an H200, of every config/ file
    generation = False  # instead: KV-cached generation, CoLA against full-rank
    elas_sparse = False  # instead: ELAS's FFN with the 2:4 sparse kernels against dense (CUDA)
    sltrain_ways = False  # instead: SLTrain's dense rebuild against low-rank + sparse products
    prompt_tokens = 16  # generation: prompt tokens per sequence (batch_size sequences)
    new_tokens = 32  # generation: tokens generated per sequence
    settings = configure(public_settings(globals()), sys.argv[1:])
    globals().update(settings)

    configs = sorted(glob.glob(os.path.join(ROOT, 'config', 'full_*.py')) + glob.glob(os.path.join(ROOT, 'config', 'cola_*.py')),
                     key=lambda p: (['60m', '130m', '350m', '1b', '7b'].index(p.split('_')[-1][:-3]), p))
    if table not in ('', 'params', 'memory', 'roofline'):
        raise SystemExit(f"table={table!r}: expected 'params', 'memory' or 'roofline'")
    if table:
        print(params_table(configs) if table == 'params' else roofline_table(configs) if table == 'roofline' else
              memory_per_gpu_table(configs))
        sys.exit()
    if sltrain_ways:
        sltrain_ways_benchmark(device)
        sys.exit()
    if elas_sparse:
        if not torch.cuda.is_available():
            raise SystemExit("--elas_sparse times the 2:4 sparse kernels on a CUDA GPU, and this machine has none")
        elas_sparse_benchmark()
        sys.exit()
    fields = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, intermediate_size=intermediate_size, rank=rank,
                  vocab_size=vocab_size or (50304 if config else 4096), only_lr_act=only_lr_act)
    if config:
        file_shape, _ = config_shape(config)
        fields.update({k: getattr(file_shape, k) for k in ('n_head', 'n_embd', 'intermediate_size', 'only_lr_act')})
        fields['rank'] = file_shape.rank or file_shape.n_embd // 4  # a full-rank config: r = d/4
        fields['n_layer'] = n_layer or file_shape.n_layer
    shape = ModelConfig(block_size=seq_len, **fields)
    torch.manual_seed(0)
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]
    print(f"{config or 'shapes'}: d={shape.n_embd}, f={shape.intermediate_size}, r={shape.rank}, {shape.n_layer} layers, "
          f"vocab {shape.vocab_size}, {device}, {dtype}" + (', compiled' if compile_model else ''),
          file=sys.stderr if as_json else sys.stdout)
    if generation:
        print(f"batch {batch_size}, {prompt_tokens}-token prompt, {new_tokens} new tokens, greedy")
        print(generation_benchmark(shape, device, ptdtype, batch_size, prompt_tokens, new_tokens))
        sys.exit()
    rows = run_benchmark(shape, device, dtype, batch_size, seq_len, steps, warmup, compile_model)
    if as_json:
        print(dumps({'settings': settings, 'shape': vars(shape), 'rows': rows}, indent=1))
    else:
        print(f"{batch_size} x {seq_len} tokens per step")
        print(markdown(rows, shape.rank))
