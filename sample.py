"""
Generate text from a checkpoint of train.py, or measure CoLA's inference advantage.

    python sample.py --out_dir=out-cola-130m --start="The meaning of life" --num_samples=3 --max_new_tokens=200
    python sample.py --out_dir=out-cpu-tiny --start=FILE:prompt.txt --temperature=0.8 --top_k=200
    python sample.py --bench=True                                  # CoLA against full-rank, CPU shapes
    python sample.py --bench=True --config=config/cola_1b.py --device=cuda --dtype=bfloat16

Full-rank, CoLA and CoLA-M checkpoints all work: CoLA-M only changes what training keeps for
backward, so the same weights generate the same text. Decoding uses the encoding the training data
was made with (recorded in the checkpoint: gpt2 or byte).
"""

import os
import sys
import time

import torch

from configurator import configure, public_settings, read_config_file
from model import ModelConfig, Transformer
from prepare import get_encoding, load_meta

# ----------------------------------------------------------------------------- config
out_dir = 'out'
start = '\n'  # the prompt, or FILE:path to read it from a file
num_samples = 3
max_new_tokens = 200
temperature = 0.8  # 0: greedy
top_k = 200
seed = 1337
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() else 'float32'
# --bench: generation speed and memory, CoLA against full-rank at the same shapes (random weights)
bench = False
config = ''  # a config file for the shapes; '' = the CPU shapes below
n_layer, n_head, n_embd, intermediate_size, rank, block_size = 4, 8, 512, 1376, 128, 256  # 60m widths
batch = 1
prompt_tokens = 16


def load_model(out_dir):
    """The model of out_dir/ckpt.pt and the encoding its data was made with."""
    path = os.path.join(out_dir, 'ckpt.pt')
    if not os.path.exists(path):
        raise SystemExit(f"no checkpoint {path}: train one first (python train.py ... --out_dir={out_dir})")
    checkpoint = torch.load(path, map_location='cpu', weights_only=False)
    enc = get_encoding(checkpoint['encoding'])
    data_dir = checkpoint['config'].get('data_dir', '')
    if os.path.exists(os.path.join(data_dir, 'meta.json')) and load_meta(data_dir)['encoding'] != enc.name:
        raise SystemExit(f"{path} was trained on encoding={enc.name!r} tokens but {data_dir}/ now holds "
                         f"{load_meta(data_dir)['encoding']!r} tokens: which vocabulary to decode with is unclear")
    model_config = ModelConfig(**{**checkpoint['model_config'], 'checkpointing': 'none'})
    if model_config.vocab_size < enc.n_vocab:
        raise SystemExit(f"{path} has vocab_size={model_config.vocab_size}, smaller than the {enc.name!r} "
                         f"vocabulary ({enc.n_vocab} tokens) it is said to use")
    model = Transformer(model_config)
    model.load_state_dict(checkpoint['model'])
    return model, enc


def read_prompt(start):
    if start.startswith('FILE:'):
        path = start[len('FILE:'):]
        if not os.path.exists(path):
            raise SystemExit(f"prompt file {path!r} not found")
        start = open(path, encoding='utf-8').read()
    if not start:
        raise SystemExit("the prompt is empty: give --start='some text' or a non-empty FILE:path")
    return start


def benchmark(shape, device, ptdtype, batch, prompt_tokens, new_tokens):
    """Tokens/s of KV-cached greedy generation, and memory of weights plus KV cache, full-rank vs CoLA."""
    rows = {}
    models = {name: Transformer(ModelConfig(**{**vars(shape), 'rank': r})).to(device, ptdtype).eval()
              for name, r in [('full-rank', 0), ('CoLA', shape.rank)]}
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
    full, cola = rows['full-rank'], rows['CoLA']
    lines.append(f"\nCoLA: {cola['tokens_per_s'] / full['tokens_per_s']:.2f}x the generation throughput, "
                 f"{full['memory'] / cola['memory']:.2f}x less memory for weights + KV cache "
                 f"(paper: about 1.64x and 1.67x at r = d/4)")
    return '\n'.join(lines)


if __name__ == '__main__':
    settings = configure(public_settings(globals()), sys.argv[1:])
    globals().update(settings)
    torch.manual_seed(seed)
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]
    if bench:
        fields = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, intermediate_size=intermediate_size, rank=rank,
                      block_size=block_size)
        if config:
            fields.update({k: v for k, v in read_config_file(config).items() if k in fields})
            fields['rank'] = fields['rank'] or fields['n_embd'] // 4
        shape = ModelConfig(**fields)
        print(f"{config or 'shapes'}: d={shape.n_embd}, f={shape.intermediate_size}, r={shape.rank}, {shape.n_layer} layers, "
              f"batch {batch}, {prompt_tokens}-token prompt, {max_new_tokens} new tokens, {device}, {dtype}")
        print(benchmark(shape, device, ptdtype, batch, prompt_tokens, max_new_tokens))
        sys.exit()
    model, enc = load_model(out_dir)
    model = model.to(device, ptdtype).eval()
    prompt = torch.tensor([enc.encode_ordinary(read_prompt(start))], dtype=torch.long, device=device)
    for _ in range(num_samples):
        tokens = model.generate(prompt, max_new_tokens, temperature=temperature, top_k=top_k)[0].tolist()
        print(enc.decode(tokens))
        print('---------------')
