"""
Score a checkpoint of train.py on zero-shot downstream tasks with lm-evaluation-harness (lm-eval): lm-eval's task
definitions and scoring, our model through the `nanocola` model class below.

    python evaluate.py --out_dir=out-cpu-tiny                           # the built-in tasks, from the run's own data
    python evaluate.py --out_dir=out-cola-130m --tasks=hellaswag,arc_easy,arc_challenge,piqa,lambada_openai  # the hub
    python evaluate.py --out_dir=out-cola-130m --tasks=hellaswag_local,piqa_local   # offline: published files on disk
    python evaluate.py lm_eval run --model nanocola --model_args out_dir=out-cola-130m --tasks hellaswag piqa

The last line is lm-eval's own command line (every option of `lm_eval run`): lm-eval finds a model class only once it
is registered in its process, so `python evaluate.py lm_eval ...` registers `nanocola` and hands the rest to lm-eval
unchanged. Add `--include_path tasks` for this repository's task files.

Tasks, by name (tasks=, comma-separated):
- any lm-eval task, its data from the Hugging Face hub (a network, or datasets' offline cache);
- <task>_local (tasks/*_local.yaml: hellaswag, arc_easy, arc_challenge, piqa, lambada_openai): lm-eval's own task with
  its data read from the published files under data/tasks/ (each file says which and how to get them); the scores
  come out under the task's own name;
- the built-in next_passage and last_word (tasks/next_passage.yaml, tasks/last_word.yaml), made from the run's
  validation split with no download, deterministic from `seed`, the same items for every run on the same data:
  next_passage, a passage's first `context_tokens` tokens, then its true next `choice_tokens` tokens against three
  spans of the same length from elsewhere in the split; last_word, a window cut before its last complete word of 3 or
  more letters, the word the target (scored as lambada_openai: greedy exact match, perplexity). The items are drawn as
  tokens and handed to lm-eval as text, which it encodes again with the run's encoding.

The model: loglikelihood by lm-eval's own pairing of context and continuation (TemplateLM: the continuation's tokens
are those the whole text adds to the context's, trailing spaces of the context moved to the continuation), batches
padded on the right (a causal model: what follows a sequence changes none of its logits), sequences longer than
block_size cut on the left as lm-eval's hf model cuts them; loglikelihood_rolling over lm-eval's disjoint windows of
block_size tokens; generate_until greedy (sampled where a task asks), with a KV cache, prompts of equal length batched,
stopping at the task's stop strings or the end-of-text token. At the limits, as lm-eval's hf model or better, and
said: a context that is empty, or empty once its trailing spaces move to the continuation (the hf model fails on
both), is the end-of-text token, as lm-eval scores an empty context; a generation's context is cut on the left to
leave max_gen_toks free in block_size, and max_gen_toks >= block_size (no room left) or a continuation longer than
block_size (no window holds it) is refused in one line, where the hf model stops with an assertion.
DLR is folded first (the same function). Writes out_dir/evaluate.json: per task its metrics (acc, and acc_norm or
perplexity where the task has them), items and chance.
"""

import glob
import json
import os
import re
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import yaml
import lm_eval.models  # noqa: F401  lm-eval's own models (hf, ...) registered before ours: it adds them only to an empty registry
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from configurator import configure, public_settings
from model import KVCache, describe_checkpoint, load_checkpoint, model_from_checkpoint
from shards import get_encoding, load_meta, read_shard, shard_path, write_durably

# ----------------------------------------------------------------------------- config
out_dir = 'out'  # the run whose checkpoint (ckpt.pt) is scored; scores go to its evaluate.json
tasks = 'next_passage,last_word'  # lm-eval task names, comma-separated: the built-in two, hub tasks, or <task>_local
data_dir = ''  # '' = the run's own data_dir (for the built-in tasks)
items = 200  # items of each built-in task
context_tokens = 64  # built-in tasks: tokens of context before each choice
choice_tokens = 16  # built-in tasks: tokens of each choice
seed = 0  # built-in tasks: which items and distractors are drawn
limit = 0  # every task: score only its first `limit` items (0: all of them)
batch_size = 16  # sequences per forward pass
device = 'cpu'  # 'cpu', 'cuda' or 'cuda:N'
as_json = False  # print the scores as JSON

TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tasks')  # this repository's lm-eval task files
BUILT_IN = ('next_passage', 'last_word')


# ----------------------------------------------------------------------------- the model, as lm-eval sees it

class NanoCoLA(TemplateLM):
    """lm-eval's model class for a checkpoint of train.py: `--model nanocola --model_args out_dir=RUN`
    (checkpoint=best.pt for the best state, dtype=bfloat16 on a GPU)."""

    def __init__(self, out_dir='out', checkpoint='ckpt.pt', device='cpu', batch_size=16, dtype='float32', **unused):
        super().__init__()
        path = os.path.join(out_dir, checkpoint)
        state = load_checkpoint(path)
        print('scoring ' + describe_checkpoint(state, path), file=sys.stderr)
        if dtype not in ('float32', 'bfloat16'):
            raise SystemExit(f"dtype={dtype!r}: expected 'float32' or 'bfloat16'")
        if not (device or 'cpu').startswith('cuda') or not torch.cuda.is_available():  # (lm-eval's default: cuda:0)
            device = 'cpu'
        self.model = model_from_checkpoint(state, device, path).fold_dlr().to(getattr(torch, dtype)).eval()
        self.enc, self._device, self.checkpoint = get_encoding(state['encoding']), device, state
        self.batch_size = int(batch_size) if str(batch_size).isdigit() and int(batch_size) > 0 else 16  # 'auto': 16

    @property
    def eot_token_id(self):
        return self.enc.eot_token

    @property
    def max_length(self):
        return self.model.config.block_size

    def tok_encode(self, string, **unused):
        return self.enc.encode_to_numpy(string, disallowed_special=()).tolist()

    def tok_decode(self, tokens):
        return self.enc.decode(tokens)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm=False):
        """[(key, context tokens, continuation tokens)] -> [(sum of log p(continuation), whether greedy decoding
        gives it)], longest first in batches, answered in the order asked."""
        for key, _, continuation in requests:
            if len(continuation) > self.max_length:
                raise SystemExit(f"a continuation of {len(continuation)} tokens ({str(key)[:60]}...): expected at most "
                                 f"block_size={self.max_length}, the longest the model scores in one window")
        # a context that moved all of its text (spaces) to the continuation: the end-of-text token, as an empty one
        requests = [(key, context or [self.prefix_token_id], continuation) for key, context, continuation in requests]
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1] + requests[i][2]))
        answers = [None] * len(requests)
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            windows = [(requests[i][1] + requests[i][2])[-(self.max_length + 1):][:-1] for i in batch]  # as lm-eval's hf
            idx = torch.zeros(len(batch), max(map(len, windows)), dtype=torch.long)  # (B, T), padded on the right
            for row, window in enumerate(windows):
                idx[row, :len(window)] = torch.tensor(window)
            logprobs = F.log_softmax(self.model(idx.to(self._device))[0].float(), dim=-1).cpu()  # (B, T, vocab)
            for row, i in enumerate(batch):
                continuation = torch.tensor(requests[i][2])
                scored = logprobs[row, len(windows[row]) - len(continuation):len(windows[row])]  # (n, vocab)
                answers[i] = (float(scored.gather(1, continuation[:, None]).sum()),
                              bool((scored.argmax(-1) == continuation).all()))
                if requests[i][0] is not None:
                    self.cache_hook.add_partial('loglikelihood', requests[i][0], answers[i])
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """The log-likelihood of each whole text: lm-eval's disjoint windows of block_size tokens, the first after
        the end-of-text token, each later one seeing the tokens before it."""
        answers = []
        for (text,) in [r.args for r in requests]:
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            answers.append(sum(ll for ll, _ in self._loglikelihood_tokens([(None, c, t) for c, t in windows])))
            self.cache_hook.add_partial('loglikelihood_rolling', (text,), answers[-1])
        return answers

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm=False):
        """Each (context, gen_kwargs) continued up to max_gen_toks tokens (default 256), cut at the first of its
        `until` strings; the context cut on the left to leave room in block_size."""
        answers, groups = [None] * len(requests), {}
        for i, (context, kwargs) in enumerate(r.args for r in requests):
            max_new = int(kwargs.get('max_gen_toks', 256))
            if not 0 < max_new < self.max_length:
                raise SystemExit(f"generate_until: max_gen_toks={max_new} leaves no room for the context in the model's "
                                 f"block_size={self.max_length}: expected 1 to {self.max_length - 1} (lm-eval's "
                                 f"--gen_kwargs max_gen_toks=N sets it)")
            prompt = self.tok_encode(context)[-(self.max_length - max_new):]
            if not prompt:
                print("generate_until: an empty context: generating after the end-of-text token, as lm-eval scores "
                      "an empty context's log-likelihood", file=sys.stderr)
                prompt = [self.prefix_token_id]
            key = (len(prompt), json.dumps(kwargs, sort_keys=True, default=str))  # batched: same length, same settings
            groups.setdefault(key, []).append((i, prompt, max_new, kwargs))
        for group in groups.values():
            for start in range(0, len(group), self.batch_size):
                batch = group[start:start + self.batch_size]
                _, _, max_new, kwargs = batch[0]
                until = [u for u in ([kwargs['until']] if isinstance(kwargs.get('until'), str) else kwargs.get('until') or []) if u]
                texts = self.continue_prompts([p for _, p, _, _ in batch], max_new, until, kwargs)
                for (i, _, _, _), text in zip(batch, texts):
                    for stop in until:
                        text = text.split(stop)[0]
                    answers[i] = text
                    self.cache_hook.add_partial('generate_until', requests[i].args, text)
        return answers

    def continue_prompts(self, prompts, max_new, until, kwargs):
        """Equal-length prompts continued together through a KV cache: the prompts' forward once, then one token's."""
        temperature = float(kwargs.get('temperature', 1.0))
        sample = kwargs.get('do_sample', False) and temperature > 0
        caches = [KVCache(self.max_length) for _ in self.model.blocks]
        logits = self.model(torch.tensor(prompts, device=self._device), kv_caches=caches)[0][:, -1].float()  # (B, vocab)
        new, done = [[] for _ in prompts], [False] * len(prompts)
        for _ in range(max_new):
            if sample:
                token = torch.multinomial(F.softmax(logits / temperature, dim=-1), 1)  # (B, 1)
            else:
                token = logits.argmax(-1, keepdim=True)
            for row, t in enumerate(token[:, 0].tolist()):
                if not done[row]:
                    done[row] = t == self.eot_token_id
                    new[row] += [] if done[row] else [t]
                    done[row] = done[row] or any(u in self.tok_decode(new[row]) for u in until)
            if all(done) or caches[0].length == self.max_length:
                break
            logits = self.model(token, kv_caches=caches)[0][:, -1].float()
        return [self.tok_decode(tokens) for tokens in new]


if 'nanocola' not in model_registry:  # (this file imported a second time: the class is registered already)
    model_registry.register('nanocola')(NanoCoLA)


# ----------------------------------------------------------------------------- the built-in tasks' items

def validation_tokens(folder, enc):
    meta = load_meta(folder)
    if meta['encoding'] != enc.name:
        raise SystemExit(f"{folder}/ holds {meta['encoding']!r} tokens, the checkpoint was trained on {enc.name!r}")
    tokens = np.concatenate([read_shard(shard_path(folder, s)) for s in meta['splits']['val']['shards']]).astype(np.int64)
    return tokens[tokens != meta['pad']] if meta.get('recipe') == 'paper' else tokens  # the paper's rows: no padding


def next_passage_items(tokens, enc, rng):
    """{context, choices, gold}: the true continuation and three spans from elsewhere, as text."""
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
        out.append({'context': enc.decode(tokens[start:start + context_tokens].tolist()),
                    'choices': [enc.decode(c) for c in choices], 'gold': gold})
    return out


def last_word_items(tokens, enc, rng):
    """{context, target}: a window of the split decoded, cut before its last complete word of 3+ letters, and
    ' ' + that word."""
    out, tries = [], 0
    while len(out) < items and tries < 20 * items:
        tries += 1
        start = int(rng.integers(0, len(tokens) - context_tokens - choice_tokens))
        text = enc.decode(tokens[start:start + context_tokens + choice_tokens].tolist())
        words = list(re.finditer(r'(?<=\s)([A-Za-z]{3,})(?=[\s.,;:!?])', text))
        if words and words[-1].start() > len(text) // 3:
            out.append({'context': text[:words[-1].start() - 1], 'target': ' ' + words[-1].group(1)})
    if not out:
        raise SystemExit("the validation split yields no last-word items (no words of 3 or more letters)")
    return out


# ----------------------------------------------------------------------------- scoring through lm-eval

def local_data_files(name):
    """The data files that tasks/<name>.yaml reads (paths relative to where lm-eval runs)."""
    path = os.path.join(TASKS_DIR, name + '.yaml')
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    return [m.group(1) for m in map(re.compile(r'^\s+\w+: (data/tasks/\S+)$').match, lines) if m]


def score(lm, names, folder, scratch):
    """({task: {metric: value, items, chance}}, {task: lm-eval's per-item samples}) for the task names given; the
    built-in tasks' items written to scratch first."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    specs = []
    if any(name in BUILT_IN for name in names):
        tokens, rng = validation_tokens(folder, lm.enc), np.random.default_rng(seed)
        made = {'next_passage': next_passage_items(tokens, lm.enc, rng), 'last_word': last_word_items(tokens, lm.enc, rng)}
    for name in names:
        if name in BUILT_IN:
            path = os.path.join(scratch, name + '.jsonl')
            with open(path, 'w', encoding='utf-8') as f:
                f.writelines(json.dumps(item) + '\n' for item in made[name])
            with open(os.path.join(TASKS_DIR, name + '.yaml')) as f:  # the task file, its data file replaced
                name = yaml.safe_load(f) | {'dataset_kwargs': {'data_files': {'test': path}}}
        specs.append(name)
    # indexing lm-eval's own task files (about 15,000) takes seconds a call; the built-in tasks need none of them
    manager = TaskManager(include_path=TASKS_DIR, include_defaults=not all(name in BUILT_IN for name in names))
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        raise SystemExit(f"tasks={unknown[0]!r}: not an lm-eval task nor one of {TASKS_DIR}/ (lm_eval ls tasks lists them)")
    try:
        loaded = manager.load(specs)  # reads each task's data: the hub's, or files on disk
    except Exception as e:  # no network, a missing file, a file of another format
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
        missing = [(name, f) for name in names for f in local_data_files(name) if not glob.glob(f)]
        if missing:
            name, path = missing[0]
            raise SystemExit(f"tasks={name!r}: no file {path} in {os.getcwd()}: the published data that "
                             f"{TASKS_DIR}/{name}.yaml reads, which says how to get it") from None
        raise SystemExit(f"tasks={','.join(names)!r}: could not read a task's data ({type(e).__name__}: {why}); offline, use "
                         f"<task>_local with the published files under data/tasks/ ({TASKS_DIR}/*_local.yaml say which)") from None
    results = simple_evaluate(model=lm, tasks=list(loaded['tasks'].values()), limit=limit or None, bootstrap_iters=0,
                              log_samples=True, verbosity='ERROR')
    scores = {}
    for name, metrics in results['results'].items():
        if name not in results['samples']:  # a group (a *_local file): its task has the scores
            continue
        samples = results['samples'][name]
        multiple_choice = results['configs'][name]['output_type'] == 'multiple_choice'
        scores[name] = {key.split(',')[0]: value for key, value in metrics.items()
                        if key.endswith(',none') and '_stderr' not in key}
        scores[name] |= {'items': len(samples),  # chance: a uniform guess among each item's choices (a cloze: none)
                         'chance': float(np.mean([1 / len(s['arguments']) for s in samples])) if multiple_choice else 0.0}
    return scores, results['samples']


if __name__ == '__main__':
    if sys.argv[1:2] == ['lm_eval']:  # lm-eval's own command line, with nanocola registered
        asked = ' '.join(sys.argv[sys.argv.index('--tasks') + 1:] if '--tasks' in sys.argv else [])
        built_in = [name for name in BUILT_IN if re.search(rf'(^|[\s,]){name}([\s,]|$)', asked)]
        if built_in:  # their items are made from a run's validation split, which lm-eval's command line cannot give
            raise SystemExit(f"--tasks {built_in[0]}: the built-in tasks are made from a run's own validation split: "
                             f"python evaluate.py --out_dir=RUN --tasks={','.join(built_in)} (--include_path tasks "
                             f"serves the *_local tasks)")
        from lm_eval.__main__ import cli_evaluate
        sys.argv = ['lm_eval'] + sys.argv[2:]
        cli_evaluate()
        sys.exit(0)
    globals().update(configure(public_settings(globals()), sys.argv[1:]))
    for name, value in [('items', items), ('context_tokens', context_tokens), ('choice_tokens', choice_tokens),
                        ('batch_size', batch_size)]:
        if value < 1:
            raise SystemExit(f"{name}={value}: expected a positive number")
    if seed < 0 or limit < 0:
        raise SystemExit(f"seed={seed}, limit={limit}: expected 0 or more")
    names = [name.strip() for name in tasks.split(',') if name.strip()]
    if not names:
        raise SystemExit(f"tasks={tasks!r}: expected lm-eval task names, comma-separated (e.g. next_passage,last_word)")
    if not (device == 'cpu' or (device.startswith('cuda') and torch.cuda.is_available())):
        raise SystemExit(f"device={device!r}: expected 'cpu', or 'cuda' on a machine with a CUDA GPU")
    lm = NanoCoLA(out_dir, device=device, batch_size=batch_size)
    if context_tokens + choice_tokens > lm.max_length and any(name in BUILT_IN for name in names):
        raise SystemExit(f"context_tokens + choice_tokens = {context_tokens + choice_tokens}: expected at most the "
                         f"model's block_size={lm.max_length}")
    folder = data_dir or lm.checkpoint['config']['data_dir']
    if any(name in BUILT_IN for name in names) and not os.path.exists(os.path.join(folder, 'meta.json')):
        raise SystemExit(f"{out_dir}/ckpt.pt was trained on {folder}/, which holds no meta.json now: give --data_dir=")
    import lm_eval
    with tempfile.TemporaryDirectory() as scratch:
        scores, _ = score(lm, names, folder, scratch)
    report = {'run': out_dir, 'iter': lm.checkpoint['iter_num'], 'seed': seed, 'scored_by': f'lm-eval {lm_eval.__version__}',
              'scores': scores}
    write_durably(os.path.join(out_dir, 'evaluate.json'), lambda f: f.write(json.dumps(report, indent=1).encode()))
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        print('| task | items | acc | acc_norm | chance |\n|---|---|---|---|---|')
        show = lambda s, key: f"{s[key]:.4f}" if key in s and (key != 'chance' or s[key]) else '-'  # noqa: E731  (a cloze: no chance)
        for name, s in scores.items():
            print(f"| {name} | {s['items']} | {show(s, 'acc')} | {show(s, 'acc_norm')} | {show(s, 'chance')} |")
        print(f"wrote {out_dir}/evaluate.json")
