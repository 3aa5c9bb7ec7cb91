"""
CoLA's merged down products (model.fan_out) measured on the CPU: training tokens/s of full-rank, CoLA with the merged
products, and CoLA with each layer's own (model.fan_out replaced by the layer-by-layer loop), at the 350m widths
(2 layers, bench.py's defaults), interleaved A B C A B C with medians, as ratios to full-rank.

    python .ci/cpu_merged.py [rounds]
"""

import statistics
import sys
from dataclasses import replace

import torch

sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.dirname(__import__('os').path.abspath(__file__))))
import model as model_module  # noqa: E402
from bench import train_step_seconds  # noqa: E402
from model import ModelConfig, Transformer  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
shape = ModelConfig(vocab_size=4096, block_size=256, n_layer=2, n_head=16, n_embd=1024, intermediate_size=2736, rank=256)
merged_fan_out = model_module.fan_out


def separate_fan_out(layers, x):
    return [layer(x) for layer in layers]


torch.manual_seed(0)
variants = {'full-rank': (replace(shape, rank=0), merged_fan_out), 'cola, merged': (shape, merged_fan_out),
            'cola, separate': (shape, separate_fan_out)}
models = {name: Transformer(config) for name, (config, _) in variants.items()}
optimizers = {name: m.configure_optimizers(0.0, 1e-4, (0.9, 0.95), 'cpu') for name, m in models.items()}
idx = torch.randint(0, shape.vocab_size, (4, 256))
times = {name: [] for name in models}
for step in range(rounds + 2):  # two untimed rounds first
    for name, (_, fan_out) in variants.items():
        model_module.fan_out = fan_out
        seconds = train_step_seconds(models[name], optimizers[name], idx, torch.float32)
        if step >= 2:
            times[name].append(seconds)
tokens = idx.numel()
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {rounds} interleaved rounds of 4 x 256 tokens")
for name in models:
    median = statistics.median(times[name])
    print(f"{name:15s} {tokens / median:8,.0f} tokens/s   {statistics.median(times['full-rank']) / median:.3f}x full-rank")
