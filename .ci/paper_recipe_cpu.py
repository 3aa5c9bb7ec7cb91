"""
The paper's data recipe next to the packed one, on the CPU: config/cpu_tiny.py trained on Shakespeare twice, once on
packed bytes (the README's quick start) and once as the CoLA paper prepares C4: one document per row, truncated and
padded, with a T5-like tokenizer (a SentencePiece-style Unigram model of 1,024 tokens that `tokenizers` trains here on
the training documents: T5's own needs the hub). A document is a speech (the text between blank lines). Prints the
padding's share of the rows (the compute it wastes) at several row lengths, and each run's tokens/s over the tokens
that are not padding and its validation loss (per token of its own vocabulary: not comparable between the two).

    python .ci/paper_recipe_cpu.py [--steps=300]      # about 3 minutes on 2 idle cores
"""
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
sys.path.insert(0, os.path.join(ROOT, 'tests'))
sys.path.insert(0, ROOT)
from helpers import t5_like_tokenizer  # noqa: E402  (the tests' stand-in for T5, larger)

steps = int(next((a.split('=', 1)[1] for a in sys.argv[1:] if a.startswith('--steps=')), 300))
work = os.path.join(ROOT, 'out-paper-recipe')
os.makedirs(work, exist_ok=True)
speeches = [s.strip() for s in re.split(r'\n\s*\n', open(os.path.join(ROOT, 'assets', 'tinyshakespeare.txt')).read()) if s.strip()]
val, train = speeches[:len(speeches) // 10], speeches[len(speeches) // 10:]
for name, docs in [('train.jsonl', train), ('val.jsonl', val)]:
    with open(os.path.join(work, name), 'w') as f:
        f.writelines(json.dumps({'text': d}) + '\n' for d in docs)
tok = t5_like_tokenizer(os.path.join(work, 'tok'), train, vocab_size=1024)

from shards import get_encoding  # noqa: E402
enc = get_encoding('hf:' + tok)
lengths = np.array([len(enc.encode_to_numpy(d)) + 1 for d in train])  # with the end token
print(f"{len(train):,} training speeches: {np.median(lengths):.0f} tokens at the median, mean {lengths.mean():.0f}, "
      f"90th percentile {np.percentile(lengths, 90):.0f}, longest {lengths.max()}")
for row in (64, 128, 256):
    real = np.minimum(lengths, row)
    print(f"rows of {row}: padding {1 - real.sum() / (row * len(lengths)):.1%} of the positions; "
          f"{np.mean(lengths > row):.1%} of the speeches truncated, losing {1 - real.sum() / lengths.sum():.1%} of the tokens")


def run(*args):
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'})
    if r.returncode:
        raise SystemExit(r.stdout[-2000:] + r.stderr[-2000:])
    return r.stdout


run('prepare.py', '--input_files=assets/tinyshakespeare.txt', '--encoding=byte', f'--out_dir={work}/packed')
run('prepare.py', '--recipe=paper', f'--tokenizer={tok}', '--row_tokens=257', f'--input_files={work}/train.jsonl',
    f'--val_files={work}/val.jsonl', f'--out_dir={work}/paper')
common = ['config/cpu_tiny.py', f'--max_iters={steps}', f'--lr_decay_iters={steps}', f'--warmup_iters={steps // 10}',
          f'--eval_interval={steps}', '--start_over=True']
for name, extra in [('packed bytes', [f'--data_dir={work}/packed', f'--out_dir={work}/run-packed']),
                    ('paper rows', [f'--data_dir={work}/paper', f'--out_dir={work}/run-paper', '--block_size=256',
                                    '--official_val_loss=True'])]:
    run('train.py', *common, *extra)
    records = [json.loads(line) for line in open(os.path.join(extra[1].split('=', 1)[1], 'log.jsonl'))]
    speeds = sorted(r['tokens_per_s'] for r in records if 'tokens_per_s' in r)
    final = [r for r in records if 'val_loss' in r][-1]
    official = f" (the official code's convention: {final['val_loss_official']:.4f})" if 'val_loss_official' in final else ''
    print(f"{name}: {np.median(speeds):,.0f} tokens/s trained on (padding left out), val loss {final['val_loss']:.4f}"
          f"{official} after {steps} steps of 8 rows of 256")
