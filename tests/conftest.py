import itertools
import json
import os
import random

import pytest

# Without a GPU, Triton's interpreter runs the kernels on CPU tensors; it must be on when cola_op.py
# defines them. With a GPU, the tests marked cuda run the compiled kernels.
import torch

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
import cola_op  # noqa: E402
from helpers import PROCESS_MARK, end_processes, run, t5_like_tokenizer  # noqa: E402
from dataclasses import replace  # noqa: E402

from model import ModelConfig, Transformer  # noqa: E402

# The one tiny model of the tests, and the same shapes as train.py settings.
TINY = ModelConfig(vocab_size=96, block_size=32, n_layer=2, n_head=2, n_embd=64, intermediate_size=128, rank=16)
TINY_TRAIN = ['--n_layer=2', '--n_head=2', '--n_embd=64', '--intermediate_size=128', '--rank=16', '--block_size=32',
              '--batch_size=4', '--learning_rate=3e-3', '--min_lr=3e-4', '--warmup_iters=5', '--lr_decay_iters=40',
              '--eval_tokens=1024', '--log_interval=1', '--device=cpu', '--dtype=float32', '--compile_model=False']


def gpt2_available(timeout_s=20):
    """Whether tiktoken's gpt2 files load: from TIKTOKEN_CACHE_DIR, or a download that a machine without a network
    may never end (tiktoken sets no timeout), so given timeout_s in a thread of its own."""
    import threading
    found = []

    def load():
        try:
            import tiktoken
            tiktoken.get_encoding('gpt2')
            found.append(True)
        except Exception:
            pass
    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(found)


# Tests that encode with GPT-2's BPE need its files: online, or in TIKTOKEN_CACHE_DIR.
needs_gpt2 = pytest.mark.skipif(not gpt2_available(), reason="GPT-2's BPE files are not available offline: "
                                "set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cached gpt2 files")


def pytest_configure(config):
    config.addinivalue_line('markers', 'triton: runs the Triton kernels (interpreted on CPU)')
    config.addinivalue_line('markers', 'cuda: needs a CUDA GPU; skipped without one')


os.environ.setdefault(PROCESS_MARK, f'worker-{os.getpid()}')  # the module fixtures' processes
_tests_started = itertools.count()


@pytest.fixture(autouse=True)
def _no_process_left_behind(monkeypatch):
    """Every process a test starts (helpers.start and run, or Popen with the test's environment) carries a mark of
    the test; at its end any still alive, grandchildren included, are killed and the test fails naming them."""
    mark = f'{os.getpid()}-{next(_tests_started)}'
    monkeypatch.setenv(PROCESS_MARK, mark)
    yield
    left = end_processes(mark)
    assert not left, f"the test left {len(left)} process(es) running, now killed: {'; '.join(c for _, c in left)}"


@pytest.fixture(autouse=True)
def _interpret_only_where_marked(request, monkeypatch):
    # The interpreter is far too slow to train with: elsewhere CPU tensors take the PyTorch path.
    if 'triton' not in request.keywords:
        monkeypatch.setattr(cola_op, 'INTERPRET', False)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        for item in items:
            if 'cuda' in item.keywords:
                item.add_marker(pytest.mark.skip(reason='needs a CUDA GPU'))


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """A folder holding byte shards (data/) of a small made-up corpus (corpus.txt): sentences from a
    tiny grammar, easy to start learning."""
    folder = tmp_path_factory.mktemp('train')
    rng = random.Random(0)
    subjects, verbs, objects = ['the cat', 'a dog', 'my friend', 'the king'], ['sees', 'likes', 'finds'], ['the sea', 'a bird', 'bread']
    with open(folder / 'corpus.txt', 'w') as f:
        f.write(' '.join(f'{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}.' for _ in range(8000)))
    run(folder, 'prepare.py', '--input_files=corpus.txt', '--encoding=byte', '--out_dir=data', '--val_tokens=4096')
    return folder


def assert_cola_m_exact(config):
    """CoLA-M's checkpoint gives the loss and every gradient of the same model without it."""
    idx = torch.randint(0, config.vocab_size, (3, config.block_size))
    results = []
    for mode in ('none', 'cola-m'):
        torch.manual_seed(0)
        model = Transformer(replace(config, checkpointing=mode))
        _, loss = model(idx, idx)
        loss.backward()
        results.append((loss, {n: p.grad for n, p in model.named_parameters()}))
    (loss, grads), (loss_m, grads_m) = results
    torch.testing.assert_close(loss_m, loss, rtol=1e-6, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads_m[name], grads[name], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope='module')
def paper_data(tmp_path_factory):
    """A folder with a T5-like tokenizer (tok/) and the paper's recipe's rows (data/, 32 tokens a row) of made-up
    documents of 1 to 40 words, one per JSON line (train.jsonl, val.jsonl): many padded, some truncated."""
    folder = tmp_path_factory.mktemp('paper')
    rng = random.Random(1)
    words = ['the', 'cat', 'sees', 'a', 'dog', 'likes', 'bread', 'king', 'finds', 'sea', 'bird', 'my', 'friend']
    docs = [' '.join(rng.choice(words) for _ in range(rng.randint(1, 40))) + '.' for _ in range(1200)]
    t5_like_tokenizer(folder / 'tok', docs)
    for name, part in [('train.jsonl', docs[200:]), ('val.jsonl', docs[:200])]:
        (folder / name).write_text(''.join(json.dumps({'text': d}) + '\n' for d in part))
    run(folder, 'prepare.py', '--recipe=paper', '--tokenizer=tok', '--row_tokens=32', '--input_files=train.jsonl',
        '--val_files=val.jsonl', '--out_dir=data')
    return folder
