import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cwd, script, *args, torchrun=0, env=None, check=True):
    """Run one of the repository's scripts in cwd, as a user would (under torchrun with that many
    processes); returns the CompletedProcess, asserting success when check."""
    command = [sys.executable, os.path.join(ROOT, script), *args]
    if torchrun:
        command[1:1] = ['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={torchrun}']
    full_env = dict(os.environ, **(env or {}))  # conftest.py set TIKTOKEN_CACHE_DIR
    full_env.pop('TRITON_INTERPRET', None)  # conftest.py's switch is for the kernel tests: scripts run eager
    if torchrun:
        full_env['OMP_NUM_THREADS'] = '1'
    r = subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600)
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def refused(r, message):
    """Assert that a script stopped with a one-line error holding message: no traceback."""
    assert r.returncode != 0, r.stdout[-2000:]
    assert 'Traceback' not in r.stderr, r.stderr[-3000:]
    assert message in r.stderr.strip().splitlines()[-1], r.stderr[-3000:]


def digest(folder):
    """SHA-1 of every file below folder, by relative path: to show that nothing already written changed
    (train.lock aside: it holds the pid of the last run that asked for the folder)."""
    out = {}
    for base, _, files in os.walk(folder):
        for f in set(files) - {'train.lock'}:
            path = os.path.join(base, f)
            out[os.path.relpath(path, folder)] = hashlib.sha1(open(path, 'rb').read()).hexdigest()
    return out


def train_log(folder):
    """Train and val losses by iter; a later record of an iter (a resumed run's) replaces an earlier one."""
    records = [json.loads(line) for line in open(os.path.join(folder, 'log.jsonl'))]
    losses = {r['iter']: r['loss'] for r in records if 'loss' in r}
    return losses, {r['iter']: r['val_loss'] for r in records if 'val_loss' in r}


def t5_like_tokenizer(folder, texts, vocab_size=120):
    """A tiny stand-in for T5's tokenizer (the hub is out of reach in tests): a SentencePiece-style Unigram model
    trained with `tokenizers` on texts, T5's special tokens (<pad> 0, </s> 1, <unk> 2) and its post-processor (the
    end token after each text), saved as a folder that transformers' AutoTokenizer loads as a T5Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement='▁', prepend_scheme='always')
    tokenizer.decoder = decoders.Metaspace(replacement='▁', prepend_scheme='always')
    tokenizer.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=vocab_size, unk_token='<unk>',
                                                                 special_tokens=['<pad>', '</s>', '<unk>']))
    tokenizer.post_processor = processors.TemplateProcessing(single='$A </s>', special_tokens=[('</s>', 1)])
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, 'tokenizer.json'))
    with open(os.path.join(folder, 'tokenizer_config.json'), 'w') as f:
        json.dump({'tokenizer_class': 'T5Tokenizer', 'pad_token': '<pad>', 'eos_token': '</s>', 'unk_token': '<unk>',
                   'extra_ids': 0, 'model_max_length': 512}, f)
    return str(folder)
