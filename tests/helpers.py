import hashlib
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


PROCESS_MARK = 'NANOCOLA_TEST_PROCESS'  # conftest.py sets it per test; whatever a test starts inherits it, children too


def start(cwd, script, *args, torchrun=0, env=None, **popen):
    """Start one of the repository's scripts in cwd, as a user would (under torchrun with that many processes), and
    return its Popen. It and everything it starts carry the test's PROCESS_MARK, by which conftest.py ends them all
    when the test ends, whatever happened."""
    command = [sys.executable, os.path.join(ROOT, script), *args]
    if torchrun:
        command[1:1] = ['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={torchrun}']
    full_env = dict(os.environ, **(env or {}))  # conftest.py set TIKTOKEN_CACHE_DIR and the mark
    full_env.pop('TRITON_INTERPRET', None)  # conftest.py's switch is for the kernel tests: scripts run eager
    if torchrun:
        full_env['OMP_NUM_THREADS'] = '1'
    return subprocess.Popen(command, cwd=cwd, env=full_env, text=True, **popen)


def run(cwd, script, *args, torchrun=0, env=None, check=True, timeout=600):
    """Run one of the repository's scripts in cwd to its end (start's arguments); returns the CompletedProcess,
    asserting success when check. A run that passes timeout is ended, with everything it started."""
    process = start(cwd, script, *args, torchrun=torchrun, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_processes(os.environ[PROCESS_MARK])
        raise AssertionError(f"{script} {' '.join(args)} had not ended after {timeout} s") from None
    r = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def wait_for(condition, process, what, timeout=600):
    """Poll condition() until it holds; fail naming what was awaited if process (where given) ends first or timeout
    seconds pass: generous, since a machine busy with other jobs is slow, never wrong. A file not yet there reads
    as not yet."""
    deadline = time.time() + timeout
    while True:
        try:
            if condition():
                return
        except FileNotFoundError:
            pass
        if process is not None and process.poll() is not None:
            raise AssertionError(f"waited for {what}, but the process ended first (exit code {process.returncode})")
        if time.time() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.1)


def processes_of(mark):
    """(pid, command line) of every live process whose environment holds PROCESS_MARK=mark: what a test started, and
    what those started, wherever they were re-parented (torchrun starts its ranks in sessions of their own)."""
    found, needle = [], f'{PROCESS_MARK}={mark}'.encode()
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/environ', 'rb') as f:
                if needle not in f.read().split(b'\0') or int(pid) == os.getpid():
                    continue
            with open(f'/proc/{pid}/stat') as f:
                if f.read().rpartition(')')[2].split()[0] == 'Z':  # dead, waiting for its parent to read its status
                    continue
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                found.append((int(pid), f.read().replace(b'\0', b' ').decode(errors='replace').strip()))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def end_processes(mark, wait_s=30):
    """SIGKILL every process of processes_of(mark) and wait until none is left; returns those it found."""
    found = processes_of(mark)
    for pid, _ in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + wait_s
    while processes_of(mark) and time.time() < deadline:
        time.sleep(0.1)
    return found


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


def published_task_files(folder):
    """Made-up items in the files and formats the hub publishes for lm-eval's tasks, where tasks/*_local.yaml read
    them (under folder/data/tasks/): HellaSwag's parquet (its [tags] to clean), ARC's parquet (question, choices with
    text and label, answerKey), PIQA's parquet, LAMBADA's JSON lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def parquet(path, rows):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = os.path.join(folder, 'data', 'tasks')
    endings = [['sees the sea.', 'likes [title] a bird.', 'finds bread.', 'the king.'], ['a dog.', 'my friend.', 'the sea.', 'bread.']]
    parquet(os.path.join(tasks, 'hellaswag', 'default', 'validation', '0000.parquet'), [
        {'ind': i, 'activity_label': 'Walking', 'ctx_a': '[header] the cat [title] sees a dog.', 'ctx_b': 'the king',
         'ctx': '', 'endings': endings[i % 2], 'source_id': 'x', 'split': 'val', 'split_type': 'indomain',
         'label': str(i % 4)} for i in range(4)])
    for name, answers in [('ARC-Easy', 'ABCA'), ('ARC-Challenge', 'CB')]:
        parquet(os.path.join(tasks, 'ai2_arc', name, 'test-00000-of-00001.parquet'), [
            {'id': f'q{i}', 'question': f'What does the cat see {i}?', 'answerKey': answer,
             'choices': {'text': ['the sea', 'a bird', 'bread'], 'label': ['A', 'B', 'C']}} for i, answer in enumerate(answers)])
    parquet(os.path.join(tasks, 'piqa', 'piqa_validation.parquet'), [
        {'goal': 'find bread', 'sol1': 'look for the king', 'sol2': 'sleep', 'label': 0},
        {'goal': 'see the sea', 'sol1': 'a dog', 'sol2': 'walk to the sea', 'label': 1}])
    os.makedirs(os.path.join(tasks, 'lambada_openai', 'data'))
    with open(os.path.join(tasks, 'lambada_openai', 'data', 'lambada_test.jsonl'), 'w') as f:
        f.write(''.join(json.dumps({'text': t}) + '\n' for t in ['my friend likes the sea and the king finds bread',
                                                                   'the cat sees a bird']))
