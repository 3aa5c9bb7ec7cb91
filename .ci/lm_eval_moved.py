"""
Which built-in downstream items changed their answer when evaluate.py moved to lm-evaluation-harness: the hand-written
scoring of an earlier commit (read with git show, run in this process) against lm-eval's, item by item, on the same
runs, the same items (the same draws of the same seed) and the same checkpoints. Prints a markdown table.

    python .ci/lm_eval_moved.py --old=6fbef48 out-compare-quick/*-seed1

The hand-written version scored next_passage on the drawn tokens (choices as token spans after the context's tokens);
lm-eval scores the items as text, encoded again (context and continuation paired as lm-eval pairs them). last_word is
greedy exact match in both. An item "moved" where its correctness differs.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evaluate  # noqa: E402  (lm-eval's scoring, this commit's)
from model import load_checkpoint, model_from_checkpoint  # noqa: E402
from shards import get_encoding  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument('--old', required=True, help='the commit whose evaluate.py holds the hand-written definitions')
parser.add_argument('--items', type=int, default=100)
parser.add_argument('runs', nargs='+')
args = parser.parse_args()

old = types.ModuleType('evaluate_old')
exec(subprocess.run(['git', 'show', f'{args.old}:evaluate.py'], cwd=ROOT, capture_output=True, text=True, check=True).stdout,
     old.__dict__)
old.items = evaluate.items = args.items  # compare.py's settings for its study runs
old.context_tokens = evaluate.context_tokens = 64
old.choice_tokens = evaluate.choice_tokens = 16

print('| run | next_passage acc (hand-written) | next_passage acc (lm-eval) | items moved | '
      'last_word acc (hand-written) | last_word acc (lm-eval) | items moved |\n|---|---|---|---|---|---|---|')
for run in args.runs:
    checkpoint = load_checkpoint(os.path.join(run, 'ckpt.pt'))
    model = model_from_checkpoint(checkpoint).fold_dlr().eval()
    enc = get_encoding(checkpoint['encoding'])
    tokens = old.validation_tokens(checkpoint['config']['data_dir'], enc)
    rng = np.random.default_rng(0)
    passages, words = old.next_passage_items(tokens, rng), old.last_word_items(tokens, enc, rng)
    hand = {'next_passage': [int(np.argmax([old.continuation_logprob(model, c, x) for x in choices]) == gold)
                             for c, choices, gold in passages],
            'last_word': [int(old.greedy_matches(model, enc.encode_to_numpy(c).tolist(), enc.encode_to_numpy(t).tolist()))
                          for c, t in words]}
    with tempfile.TemporaryDirectory() as scratch:  # this commit's way: the same draws, through lm-eval
        _, samples = evaluate.score(evaluate.NanoCoLA(run), ['next_passage', 'last_word'], checkpoint['config']['data_dir'], scratch)
    new = {name: [int(s['acc']) for s in sorted(samples[name], key=lambda s: s['doc_id'])] for name in hand}
    row = [run]
    for name in ('next_passage', 'last_word'):
        moved = sum(a != b for a, b in zip(hand[name], new[name], strict=True))
        row += [f'{np.mean(hand[name]):.3f}', f'{np.mean(new[name]):.3f}', f'{moved} of {len(new[name])}']
    print('| ' + ' | '.join(row) + ' |', flush=True)
