"""
nanoCoLA's training step against the official code's, side by side in one process: Hugging Face's LlamaForCausalLM
for full-rank, and the official CoLA repository's ColaForCausalLM and ColaMForCausalLM (alvin-zyl/CoLA, on
transformers 4.48.3), against nanoCoLA's Transformer for full-rank, CoLA and CoLA-M, at the same shapes (its
cola_configs/*.json), micro-batch and precision: the weights in bf16, as the official main.py trains them
(`model.to(dtype=torch.bfloat16)`), and nanoCoLA also as train.py trains it (fp32 weights under bf16 autocast).
Each step is a forward pass with the loss over the same tokens, backward and an AdamW step; tokens/s is the median
of the timed steps after a warm-up, peak memory is the step's own (reset before each model). Run by .ci/gpu_check
with the official repository and the transformers wheels carried in (neither is part of nanoCoLA).

    python .ci/gpu_official.py --official=PATH [--size=130m|1b] [--batch_size=64] [--steps=10] [--device=cuda]

--size=1b uses the 1b widths with 4 of its 24 layers. --device=cpu --tiny checks this script on a CPU.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import torch  # noqa: E402

from model import ModelConfig, Transformer  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
parser.add_argument('--official', required=True, help="the official CoLA repository's folder (it holds cola/)")
parser.add_argument('--size', default='130m', choices=['130m', '1b'])
parser.add_argument('--batch_size', type=int, default=64)
parser.add_argument('--steps', type=int, default=10)
parser.add_argument('--device', default='cuda')
parser.add_argument('--tiny', action='store_true', help='2 layers of width 64: a check of this script, not a timing')
args = parser.parse_args()
if not os.path.isdir(os.path.join(args.official, 'cola')):
    raise SystemExit(f"--official={args.official!r}: expected the official CoLA repository's folder, which holds cola/")
sys.path.insert(0, args.official)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from cola import ColaConfig, ColaForCausalLM, ColaMForCausalLM  # noqa: E402

T, V = 256, 32000  # the official recipe's rows and vocabulary
shape = json.load(open(os.path.join(args.official, 'cola_configs', f'cola_{args.size}.json')))
if args.size == '1b':
    shape['num_hidden_layers'] = 4
if args.tiny:
    shape.update(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_hidden_layers=2, rank=16)
    V = 512
shape['vocab_size'] = V
max_positions = shape.pop('max_sequence_length', 1024)
ours = dict(vocab_size=V, block_size=T, n_layer=shape['num_hidden_layers'], n_head=shape['num_attention_heads'],
            n_embd=shape['hidden_size'], intermediate_size=shape['intermediate_size'], rank=shape['rank'],
            only_lr_act=shape.get('only_lr_act', False), norm_eps=shape['rms_norm_eps'])
llama = {k: v for k, v in shape.items() if k not in ('rank', 'only_lr_act', 'architectures', 'model_type')}
llama['max_position_embeddings'] = max_positions
cola = {k: v for k, v in shape.items() if k not in ('architectures', 'model_type', 'use_cache')}

MODELS = {  # name -> (build, hf): hf models take labels and shift them themselves
    'full-rank, HF Llama': (lambda: LlamaForCausalLM(LlamaConfig(**llama)), True),
    'full-rank, nanoCoLA': (lambda: Transformer(ModelConfig(**{**ours, 'rank': 0})), False),
    'CoLA, official': (lambda: ColaForCausalLM(ColaConfig(**cola)), True),
    'CoLA, nanoCoLA': (lambda: Transformer(ModelConfig(**ours)), False),
    'CoLA-M, official': (lambda: ColaMForCausalLM(ColaConfig(**cola, use_cache=False)), True),
    'CoLA-M, nanoCoLA': (lambda: Transformer(ModelConfig(**ours, checkpointing='cola-m')), False),
}
device, cuda = args.device, args.device.startswith('cuda')
tokens = torch.randint(0, V, (args.batch_size, T + 1), device=device)


def measure(name, build, hf, autocast):
    """(tokens/s, peak GiB, first step s) of training steps of one model."""
    torch.manual_seed(0)
    model = build().to(device)
    if not autocast:
        model = model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    context = torch.autocast(device_type=device.split(':')[0], dtype=torch.bfloat16, enabled=autocast)

    def step():
        with context:
            if hf:  # input_ids and labels of T tokens: HF shifts, T - 1 predictions
                loss = model(input_ids=tokens[:, :T], labels=tokens[:, :T]).loss
            else:
                loss = model(tokens[:, :T], tokens[:, 1:])[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
    times = []
    for i in range(args.steps + 3):
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float('nan')
    return args.batch_size * T / statistics.median(times[3:]), peak, times[0]


print(f"training steps, {args.size} shapes ({shape['num_hidden_layers']} layers, d={shape['hidden_size']}, "
      f"r={shape['rank']}), {args.batch_size} x {T} tokens, {device}, torch {torch.__version__}, "
      f"transformers {__import__('transformers').__version__}")
rows = ['| model | weights | tokens/s | peak memory GiB | first step s |', '|---|---|---|---|---|']
results = {}
for name, (build, hf) in MODELS.items():
    for autocast in ((False, True) if not hf else (False,)):
        label = f"{name}{' (fp32 + autocast, as train.py)' if autocast else ''}"
        try:
            results[label] = measure(name, build, hf, autocast)
            tokens_s, peak, first = results[label]
            rows.append(f"| {label} | {'fp32, bf16 autocast' if autocast else 'bf16'} | {tokens_s:,.0f} | {peak:.2f} | {first:.2f} |")
        except Exception as e:  # one model's failure (out of memory, say) leaves the others' figures
            rows.append(f"| {label} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | | |")
        print(rows[-1], flush=True)
print('\n'.join(rows))
for kind, official in [('full-rank', 'full-rank, HF Llama'), ('CoLA', 'CoLA, official'), ('CoLA-M', 'CoLA-M, official')]:
    mine = f'{kind}, nanoCoLA'
    if mine in results and official in results:
        ratio = results[mine][0] / results[official][0]
        print(f"{kind}: nanoCoLA {ratio:.2f}x the official code's tokens/s (bf16 weights): "
              f"{'ok' if ratio >= 1.0 else 'BELOW THE GOAL of 1.0x'}")
