"""
CoLA's efficiency claims, measured side by side: parameters, training FLOPs, activation memory,
recomputation and throughput of full-rank, full-rank + 'full' checkpointing, CoLA, CoLA + 'full'
and CoLA-M at the same shapes.

    python bench.py                                    # CPU-sized shapes (config/cpu_tiny.py)
    python bench.py config/cola_1b.py --device=meta    # counts only (no timing), any size
    python bench.py config/cola_350m.py --device=cuda --dtype=bfloat16 --compile=True --batch_size=32

Counts are measured, not derived: FLOPs with torch.utils.flop_counter.FlopCounterMode, activation
memory as the bytes still allocated after a forward pass (the profiler's memory events on CPU,
torch.cuda.memory_allocated on CUDA), at two depths and subtracted, so the cost of one layer is
isolated from embeddings and logits.
"""

import json
import time
from dataclasses import replace

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from model import ModelConfig, Transformer

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


def _allocated_after_forward(model, idx):
    if idx.is_cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        _, loss = model(idx, idx)
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - before
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
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
