"""
Generate text from a checkpoint of train.py.

    python sample.py --out_dir=out-cola-130m --start="The meaning of life" --num_samples=3 --max_new_tokens=200
    python sample.py --out_dir=out-cpu-tiny --start=FILE:prompt.txt --temperature=0.8 --top_k=200

Every checkpoint works: CoLA-M only changes what training keeps for backward, so the same weights
generate the same text; a DLR model is folded into a plain CoLA model first (exact); a TSVD model
generates from its factors at the ranks training reached; an ELAS model with the sparsity it was at. Decoding uses the encoding the training data
was made with (recorded in the checkpoint: gpt2 or byte). The generation benchmark is in bench.py.
"""

import os
import sys

import torch

from configurator import configure, public_settings
from model import describe_checkpoint, load_checkpoint, model_from_checkpoint
from shards import get_encoding, load_meta

# ----------------------------------------------------------------------------- config
out_dir = 'out'  # the run whose checkpoint (ckpt.pt) generates
start = '\n'  # the prompt, or FILE:path to read it from a file
num_samples = 3  # samples to generate
max_new_tokens = 200  # tokens generated per sample
temperature = 0.8  # 0: greedy
top_k = 200  # sample from the top_k most likely tokens
seed = 1337  # the sampling's random seed
device = 'cuda' if torch.cuda.is_available() else 'cpu'  # 'cpu', 'cuda' or 'cuda:N'
dtype = 'bfloat16' if torch.cuda.is_available() else 'float32'  # 'float32' or 'bfloat16' (autocast on CUDA)


def load_model(out_dir):
    """The model of out_dir/ckpt.pt and the encoding its data was made with."""
    path = os.path.join(out_dir, 'ckpt.pt')
    if not os.path.exists(path):
        raise SystemExit(f"no checkpoint {path}: train one first (python train.py ... --out_dir={out_dir})")
    checkpoint = load_checkpoint(path)
    print('sampling from ' + describe_checkpoint(checkpoint, path), file=sys.stderr)
    enc = get_encoding(checkpoint['encoding'])
    data_dir = checkpoint['config'].get('data_dir', '')
    if os.path.exists(os.path.join(data_dir, 'meta.json')) and load_meta(data_dir)['encoding'] != enc.name:
        raise SystemExit(f"{path} was trained on encoding={enc.name!r} tokens but {data_dir}/ now holds "
                         f"{load_meta(data_dir)['encoding']!r} tokens: which vocabulary to decode with is unclear")
    return model_from_checkpoint(checkpoint, path=path).fold_dlr(), enc  # DLR's residual folded into B: a plain CoLA model, the same outputs


def read_prompt(start):
    if start.startswith('FILE:'):
        path = start[len('FILE:'):]
        if not os.path.exists(path):
            raise SystemExit(f"prompt file {path!r} not found")
        start = open(path, encoding='utf-8', errors='replace').read()
    if not start:
        raise SystemExit("the prompt is empty: give --start='some text' or a non-empty FILE:path")
    try:
        start.encode('utf-8')
    except UnicodeEncodeError as e:
        raise SystemExit(f"the prompt is not valid text: {start[e.start:e.end]!r} at character {e.start}") from None
    return start


if __name__ == '__main__':
    globals().update(configure(public_settings(globals()), sys.argv[1:]))
    for name, value, ok, expected in [('num_samples', num_samples, num_samples >= 1, 'at least 1'),
                                      ('max_new_tokens', max_new_tokens, max_new_tokens >= 0, 'at least 0'),
                                      ('temperature', temperature, temperature >= 0, '0 (greedy) or more'),
                                      ('top_k', top_k, top_k is None or top_k >= 1, 'at least 1'),
                                      ('dtype', dtype, dtype in ('float32', 'bfloat16'), "'float32' or 'bfloat16'"),
                                      ('device', device, device == 'cpu' or (device.startswith('cuda') and torch.cuda.is_available()),
                                       "'cpu', or 'cuda' on a machine with a CUDA GPU")]:
        if not ok:
            raise SystemExit(f"{name}={value}: expected {expected}")
    torch.manual_seed(seed)
    prompt = read_prompt(start)
    model, enc = load_model(out_dir)
    model = model.to(device, {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]).eval()
    idx = torch.tensor([enc.encode_to_numpy(prompt, disallowed_special=()).tolist()], dtype=torch.long, device=device)
    for _ in range(num_samples):
        tokens = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k)[0].tolist()
        print(enc.decode(tokens))
        print('---------------')
