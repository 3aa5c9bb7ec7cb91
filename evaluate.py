"""
Score a checkpoint of train.py on zero-shot downstream tasks, as lm-evaluation-harness defines them.

    python evaluate.py --out_dir=out-cpu-tiny                         # the built-in tasks, from the run's own data
    python evaluate.py --out_dir=out-cola-130m --hellaswag=hellaswag_val.jsonl --arc_easy=ARC-Easy-Test.jsonl \
        --arc_challenge=ARC-Challenge-Test.jsonl --piqa=piqa_valid.jsonl --lambada=lambada_test.jsonl

Multiple choice: per choice, the sum of the log-likelihoods of the continuation's tokens given the
context; accuracy by the largest sum, normalised accuracy by the sum divided by the continuation's length
in bytes. Cloze: accuracy by greedy exact match of the target's tokens.

Built-in tasks, made from the run's validation split with no download, deterministic from `seed` and the
same items for every run on the same data (`items` of each):
- next_passage (4-way choice): a passage's first `context_tokens` tokens, then the true next
  `choice_tokens` tokens against three spans of the same length from elsewhere in the split;
- last_word (cloze): a window of text cut after its last complete word of 3 or more letters; the target
  is that word.
Published formats, read from local JSONL files: HellaSwag (ctx_a, ctx_b, activity_label, endings, label),
ARC (question.stem, question.choices[].text / .label, answerKey), PIQA (goal, sol1, sol2, label; or the
labels in a file named by piqa_labels, one per line), LAMBADA (text; the last word is the target). Writes
out_dir/evaluate.json.
"""

import json
import os
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F

from configurator import configure, public_settings
from model import describe_checkpoint, load_checkpoint, model_from_checkpoint
from shards import get_encoding, load_meta, read_shard, shard_path, write_durably

# ----------------------------------------------------------------------------- config
out_dir = 'out'  # the run whose checkpoint (ckpt.pt) is scored; scores go to its evaluate.json
data_dir = ''  # '' = the run's own data_dir (for the built-in tasks)
items = 200  # items of each built-in task
context_tokens = 64  # built-in tasks: tokens of context before each choice
choice_tokens = 16  # built-in tasks: tokens of each choice
seed = 0  # built-in tasks: which items and distractors are drawn
hellaswag = ''  # paths of local JSONL files in the published formats ('' = skip)
arc_easy = ''  # ARC-Easy JSONL ('' = skip)
arc_challenge = ''  # ARC-Challenge JSONL ('' = skip)
piqa = ''  # PIQA JSONL ('' = skip)
piqa_labels = ''  # PIQA's labels file (valid-labels.lst) when the JSONL has no label field
lambada = ''  # LAMBADA JSONL ('' = skip)
device = 'cpu'  # 'cpu', 'cuda' or 'cuda:N'
as_json = False  # print the scores as JSON


# ----------------------------------------------------------------------------- scoring

@torch.no_grad()
def continuation_logprob(model, context, continuation):
    """The sum of log p(continuation token | everything before it), token lists, truncated on the left to
    the model's block_size."""
    tokens = (context + continuation)[-(model.config.block_size + 1):]
    idx = torch.tensor([tokens], device=device)
    logits, _ = model(idx[:, :-1])
    logprobs = F.log_softmax(logits.float(), dim=-1)[0, -len(continuation):]  # (n, vocab)
    return float(logprobs.gather(1, idx[0, -len(continuation):, None]).sum())


@torch.no_grad()
def greedy_matches(model, context, target):
    """Whether greedy decoding after context gives exactly the target's tokens (one forward pass: the
    argmax at each target position given the true tokens before it, which is greedy decoding while it matches)."""
    tokens = (context + target)[-(model.config.block_size + 1):]
    logits, _ = model(torch.tensor([tokens[:-1]], device=device))
    return logits[0, -len(target):].argmax(-1).tolist() == target


def multiple_choice(model, enc, examples):
    """acc and acc_norm of (context, [choices], gold) examples, text in, lm-evaluation-harness's way: each choice
    scored as the continuation ' ' + choice (its target delimiter), acc_norm dividing that sum by the choice's
    length in characters, the delimiter not counted."""
    correct = correct_norm = 0
    for context, choices, gold in examples:
        ctx = enc.encode_to_numpy(context, disallowed_special=()).tolist()
        scores = [continuation_logprob(model, ctx, enc.encode_to_numpy(' ' + c, disallowed_special=()).tolist())
                  for c in choices]
        correct += int(np.argmax(scores) == gold)
        correct_norm += int(np.argmax([s / max(1, len(c)) for s, c in zip(scores, choices)]) == gold)
    return {'acc': correct / len(examples), 'acc_norm': correct_norm / len(examples), 'items': len(examples),
            'chance': float(np.mean([1 / len(choices) for _, choices, _ in examples]))}


def cloze(model, enc, examples):
    """acc of (context, target) examples by greedy exact match."""
    hits = sum(greedy_matches(model, enc.encode_to_numpy(c, disallowed_special=()).tolist(),
                              enc.encode_to_numpy(t, disallowed_special=()).tolist()) for c, t in examples)
    return {'acc': hits / len(examples), 'items': len(examples), 'chance': 0.0}  # an exact word: no chance level


# ----------------------------------------------------------------------------- the tasks

def read_jsonl(path):
    if not os.path.isfile(path):
        raise SystemExit(f"{path} does not exist")
    try:
        records = [json.loads(line) for line in open(path, encoding='utf-8') if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f"{path}: not JSON lines ({type(e).__name__})") from None
    if not records:
        raise SystemExit(f"{path} holds no items: expected one JSON object per line")
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise SystemExit(f"{path}:{i + 1}: a JSON {type(record).__name__}, expected an object (the published format)")
    return records


def text_field(path, i, record, *keys):
    """A field that must hold text."""
    value = field(path, i, record, *keys)
    if not isinstance(value, str):
        raise SystemExit(f"{path}:{i + 1}: {'.'.join(keys)!r} is {type(value).__name__} {value!r}: expected text")
    return value


def field(path, i, record, *keys):
    """record[keys[0]][keys[1]]..., or a one-line exit naming the file, the line and the missing field."""
    value = record
    for key in keys:
        if not isinstance(value, (dict, list)) or (isinstance(value, dict) and key not in value):
            raise SystemExit(f"{path}:{i + 1}: no field {'.'.join(map(str, keys))!r} (expected the published format)")
        value = value[key]
    return value


def hellaswag_examples(path):
    """lm-evaluation-harness's preprocessing, in its order: strip, ' [title]' -> '. ', other [tags] removed, double
    spaces made single (nothing stripped after)."""
    def clean(text):
        return re.sub(r'\[.*?\]', '', text.strip().replace(' [title]', '. ')).replace('  ', ' ')
    out = []
    for i, r in enumerate(read_jsonl(path)):
        context = text_field(path, i, r, 'activity_label') + ': ' + text_field(path, i, r, 'ctx_a') + ' ' + text_field(path, i, r, 'ctx_b').capitalize()
        endings, label = field(path, i, r, 'endings'), field(path, i, r, 'label')
        if not (isinstance(endings, list) and len(endings) >= 2 and all(isinstance(e, str) for e in endings)):
            raise SystemExit(f"{path}:{i + 1}: 'endings' is {type(endings).__name__} {str(endings)[:40]!r}: expected a list "
                             f"of 2 or more strings (the published format)")
        if str(label) not in [str(k) for k in range(len(endings))]:  # 0 or '0' (both published), ...
            raise SystemExit(f"{path}:{i + 1}: 'label' is {label!r}: expected the index of one of its {len(endings)} endings")
        out.append((clean(context), [clean(e) for e in endings], int(label)))
    return out


def arc_examples(path):
    out = []
    for i, r in enumerate(read_jsonl(path)):
        choices = field(path, i, r, 'question', 'choices')
        if not isinstance(choices, list) or len(choices) < 2:
            raise SystemExit(f"{path}:{i + 1}: question.choices is {str(choices)[:40]!r}: expected a list of 2 or more")
        choices = [{'label': text_field(path, i, c, 'label'), 'text': text_field(path, i, c, 'text')} for c in choices]
        labels = [c['label'] for c in choices]
        answer = field(path, i, r, 'answerKey')
        if answer not in labels:
            raise SystemExit(f"{path}:{i + 1}: answerKey {answer!r} is not one of the choices' labels {labels}")
        out.append((f"Question: {field(path, i, r, 'question', 'stem')}\nAnswer:", [c['text'] for c in choices],
                    labels.index(answer)))
    return out


def piqa_examples(path, labels_path):
    records = read_jsonl(path)
    labels = [r.get('label') for r in records]
    if labels_path:
        try:
            lines = [line.strip() for line in open(labels_path, encoding='utf-8') if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"piqa_labels={labels_path!r}: cannot be read as text "
                             f"({e.strerror if isinstance(e, OSError) else 'not UTF-8'})") from None
        if any(line not in ('0', '1') for line in lines):
            raise SystemExit(f"piqa_labels={labels_path!r}: line {next(line for line in lines if line not in ('0', '1'))!r}: "
                             f"expected a 0 or 1 on each line (valid-labels.lst)")
        labels = [int(line) for line in lines]
        given = [r.get('label') for r in records]
        if any(g is not None and g != label for g, label in zip(given, labels)):
            i = next(i for i, (g, label) in enumerate(zip(given, labels)) if g is not None and g != label)
            raise SystemExit(f"{path}:{i + 1}: its label {given[i]!r} differs from line {i + 1} of piqa_labels="
                             f"{labels_path!r} ({labels[i]}): give one source of labels")
    if len(labels) != len(records) or any(label not in (0, 1) for label in labels):
        raise SystemExit(f"{path}: expected a label 0 or 1 for each of its {len(records)} lines (a 'label' field, or "
                         f"--piqa_labels=valid-labels.lst)")
    return [(f"Question: {text_field(path, i, r, 'goal')}\nAnswer:", [text_field(path, i, r, 'sol1'), text_field(path, i, r, 'sol2')],
             label) for i, (r, label) in enumerate(zip(records, labels))]


def lambada_examples(path):
    out = []
    for i, r in enumerate(read_jsonl(path)):
        context, _, word = text_field(path, i, r, 'text').strip().rpartition(' ')
        if not context or not word:
            raise SystemExit(f"{path}:{i + 1}: 'text' {r['text'][:40]!r} has no context and last word to predict")
        out.append((context, ' ' + word))
    return out


def validation_tokens(folder, enc):
    meta = load_meta(folder)
    if meta['encoding'] != enc.name:
        raise SystemExit(f"{folder}/ holds {meta['encoding']!r} tokens, the checkpoint was trained on {enc.name!r}")
    tokens = np.concatenate([read_shard(shard_path(folder, s)) for s in meta['splits']['val']['shards']]).astype(np.int64)
    return tokens[tokens != meta['pad']] if meta.get('recipe') == 'paper' else tokens  # the paper's rows: no padding


def next_passage_items(tokens, rng):
    """(context tokens, [4 choices of tokens], gold): the true continuation and three spans from elsewhere."""
    span = context_tokens + choice_tokens
    if len(tokens) < 8 * span:
        raise SystemExit(f"the validation split holds {len(tokens):,} tokens: too few for passages of {span} tokens")
    out = []
    for _ in range(items):
        start = int(rng.integers(0, len(tokens) - span))
        true = tokens[start + context_tokens:start + span].tolist()
        others = []
        while len(others) < 3:
            other = int(rng.integers(0, len(tokens) - choice_tokens))
            if abs(other - (start + context_tokens)) >= span:  # not overlapping the true continuation
                others.append(tokens[other:other + choice_tokens].tolist())
        gold = int(rng.integers(0, 4))
        choices = others[:gold] + [true] + others[gold:]
        out.append((tokens[start:start + context_tokens].tolist(), choices, gold))
    return out


def last_word_items(tokens, enc, rng):
    """(context text, ' word'): a window of the split decoded, cut after its last complete word of 3+ letters."""
    out, tries = [], 0
    while len(out) < items and tries < 20 * items:
        tries += 1
        start = int(rng.integers(0, len(tokens) - context_tokens - choice_tokens))
        text = enc.decode(tokens[start:start + context_tokens + choice_tokens].tolist())
        words = list(re.finditer(r'(?<=\s)([A-Za-z]{3,})(?=[\s.,;:!?])', text))
        if words and words[-1].start() > len(text) // 3:
            out.append((text[:words[-1].start() - 1], ' ' + words[-1].group(1)))
    if not out:
        raise SystemExit("the validation split yields no last-word items (no words of 3 or more letters)")
    return out


def evaluate(model, enc, folder):
    """Every task asked for: the built-in two from folder's validation split, then the local files given."""
    rng = np.random.default_rng(seed)
    tokens = validation_tokens(folder, enc)
    scores = {}
    passages = next_passage_items(tokens, rng)
    correct = sum(int(np.argmax([continuation_logprob(model, c, choice) for choice in choices]) == gold)
                  for c, choices, gold in passages)
    scores['next_passage'] = {'acc': correct / len(passages), 'items': len(passages), 'chance': 0.25}  # equal lengths: acc_norm = acc
    scores['last_word'] = cloze(model, enc, last_word_items(tokens, enc, rng))
    for name, path, read in [('hellaswag', hellaswag, hellaswag_examples), ('arc_easy', arc_easy, arc_examples),
                             ('arc_challenge', arc_challenge, arc_examples),
                             ('piqa', piqa, lambda p: piqa_examples(p, piqa_labels))]:
        if path:
            scores[name] = multiple_choice(model, enc, read(path))
    if lambada:
        scores['lambada'] = cloze(model, enc, lambada_examples(lambada))
    return scores


if __name__ == '__main__':
    globals().update(configure(public_settings(globals()), sys.argv[1:]))
    for name, value in [('items', items), ('context_tokens', context_tokens), ('choice_tokens', choice_tokens)]:
        if value < 1:
            raise SystemExit(f"{name}={value}: expected a positive number")
    if seed < 0:
        raise SystemExit(f"seed={seed}: expected 0 or more")
    if not (device == 'cpu' or (device.startswith('cuda') and torch.cuda.is_available())):
        raise SystemExit(f"device={device!r}: expected 'cpu', or 'cuda' on a machine with a CUDA GPU")
    path = os.path.join(out_dir, 'ckpt.pt')
    checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint, device, path).eval()
    print('scoring ' + describe_checkpoint(checkpoint, path), file=sys.stderr)
    if context_tokens + choice_tokens > model.config.block_size:
        raise SystemExit(f"context_tokens + choice_tokens = {context_tokens + choice_tokens}: expected at most the "
                         f"model's block_size={model.config.block_size}")
    enc = get_encoding(checkpoint['encoding'])
    folder = data_dir or checkpoint['config']['data_dir']
    if not os.path.exists(os.path.join(folder, 'meta.json')):
        raise SystemExit(f"{path} was trained on {folder}/, which holds no meta.json now: give --data_dir=")
    scores = evaluate(model, enc, folder)
    report = {'run': out_dir, 'iter': checkpoint['iter_num'], 'seed': seed, 'scores': scores}
    write_durably(os.path.join(out_dir, 'evaluate.json'), lambda f: f.write(json.dumps(report, indent=1).encode()))
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        print('| task | items | acc | acc_norm | chance |\n|---|---|---|---|---|')
        for name, s in scores.items():
            norm = f"{s['acc_norm']:.4f}" if 'acc_norm' in s else '-'
            print(f"| {name} | {s['items']} | {s['acc']:.4f} | {norm} | {s['chance']:.4f} |")
        print(f"wrote {out_dir}/evaluate.json")
