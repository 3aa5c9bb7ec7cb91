"""
Tokenise a corpus into token shards for train.py.

    python prepare.py                                   # English C4 from the hub (allenai/c4)
    python prepare.py --train_shards=18                 # more C4 for bigger configs (README table)
    python prepare.py --input='texts/*.txt' --encoding=byte --out_dir=data/mytext   # local files

Each document is encoded with tiktoken's GPT-2 BPE (encode_ordinary) or as raw UTF-8 bytes
(encoding='byte', for CPU-sized experiments), followed by the end-of-text token.

Sources. C4 mode reads the source files en/c4-train.NNNNN-of-01024.json.gz (the first train_shards)
and en/c4-validation.NNNNN-of-00008.json.gz (the first val_shards) through `datasets`. Local mode
reads the files matching the glob `input`: .json, .json.gz, .jsonl (one JSON object with a "text"
field per line; blank lines are skipped) or .txt (one document per file). The validation split is
then `val_input`'s files if given, else the first val_tokens tokens of `input`'s token stream.

Output, in out_dir: train_000000.bin, ..., val_000000.bin, ... and meta.json. A shard is a
256 x int32 header (MAGIC, VERSION, token count, zeros) followed by the tokens as uint16; every
shard but a split's last holds exactly shard_tokens tokens. meta.json records the encoding, vocab
size, EOT id, sources, shards and token counts, and where each split stopped.

Reliability: a shard is written under a temporary name and renamed once complete, then recorded in
meta.json with the position in the sources where the next shard starts; an interrupted run
resumes from there (whole source files already done are skipped). A folder made with another
encoding or from other sources is refused, never mixed or overwritten.
"""

import glob
import gzip
import json
import os
import sys
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MAGIC, VERSION, HEADER_INTS = 0x436F4C41, 1, 256  # MAGIC spells 'CoLA'
C4_PATH = 'allenai/c4'

# ----------------------------------------------------------------------------- config
out_dir = 'data/c4'
input = ''  # '' = C4 through datasets; else a glob of local .json/.json.gz/.jsonl/.txt files
val_input = ''  # local mode: a glob of validation files; '' = the first val_tokens tokens of input
val_tokens = 100_000
train_shards = 9  # C4 train files (of 1024, ~150M GPT-2 tokens each): 9 covers cola_60m's 1.31B tokens
val_shards = 1  # C4 validation files (of 8)
encoding = 'gpt2'  # 'gpt2' or 'byte'
shard_tokens = 100_000_000
num_proc = os.cpu_count()
c4_path = C4_PATH  # the dataset repository (or a local folder laid out like it)
bench = False  # True: report MB/s of this pipeline against bare tiktoken encoding, write nothing


# ----------------------------------------------------------------------------- shard format

def write_shard(path, tokens):
    """Write tokens (uint16) to path atomically: a temporary file, renamed when complete."""
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = MAGIC, VERSION, len(tokens)
    with open(path + '.tmp', 'wb') as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())
    os.replace(path + '.tmp', path)


def read_shard(path):
    """The tokens of a shard, as a read-only uint16 memmap."""
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if len(header) < 3 or header[0] != MAGIC or header[1] != VERSION:
        raise ValueError(f"{path}: not a version-{VERSION} nanoCoLA token shard")
    tokens = np.memmap(path, dtype=np.uint16, mode='r', offset=HEADER_INTS * 4)
    if len(tokens) != header[2]:
        raise ValueError(f"{path}: header says {header[2]} tokens, file holds {len(tokens)}")
    return tokens


def load_meta(data_dir):
    with open(os.path.join(data_dir, 'meta.json')) as f:
        return json.load(f)


def _write_json(path, obj):
    with open(path + '.tmp', 'w') as f:
        json.dump(obj, f, indent=1)
    os.replace(path + '.tmp', path)


# ----------------------------------------------------------------------------- encodings

class ByteEncoding:
    """UTF-8 bytes 0..255 and an end-of-text token 256."""
    name, n_vocab, eot_token = 'byte', 257, 256

    def encode_ordinary(self, text):
        return list(text.encode('utf-8'))

    def encode_to_numpy(self, text, disallowed_special=()):
        return np.frombuffer(text.encode('utf-8'), dtype=np.uint8)

    def decode(self, tokens):
        return bytes(t for t in tokens if t < 256).decode('utf-8', errors='replace')


def get_encoding(name):
    if name == 'byte':
        return ByteEncoding()
    if name == 'gpt2':
        import tiktoken
        try:
            return tiktoken.get_encoding('gpt2')
        except Exception as e:  # tiktoken downloads its BPE files once, then caches them
            raise SystemExit(f"could not load tiktoken's gpt2 encoding ({type(e).__name__}); offline, point "
                             f"TIKTOKEN_CACHE_DIR at a folder holding its files, or use --encoding=byte") from None
    raise SystemExit(f"encoding={name!r}: expected 'gpt2' or 'byte'")


# ----------------------------------------------------------------------------- sources

def read_local(path):
    """The documents of a local file, in order."""
    if path.endswith('.txt'):
        with open(path, encoding='utf-8') as f:
            yield f.read()
        return
    opener = gzip.open if path.endswith('.gz') else open
    try:
        with opener(path, 'rt', encoding='utf-8') as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise SystemExit(f"{path}:{line_no}: not a JSON line") from None
                if not isinstance(record, dict) or not isinstance(record.get('text'), str):
                    raise SystemExit(f"{path}:{line_no}: JSON line has no \"text\" string")
                yield record['text']
    except (gzip.BadGzipFile, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise SystemExit(f"{path}: unreadable or corrupt file ({type(e).__name__}: {e})") from None


def read_c4(path, data_file):
    """The documents of one C4 source file, streamed through `datasets`."""
    import datasets
    datasets.logging.set_verbosity_error()
    try:
        for record in datasets.load_dataset(path, data_files=data_file, split='train', streaming=True):
            yield record['text']
    except (ConnectionError, OSError, ValueError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SystemExit(f"could not read {data_file} from {path} ({message}); without a network, "
                         f"tokenise local files instead: --input='path/*.json.gz'") from None


def read_source(source):
    return read_c4(c4_path, source) if not input else read_local(source)


def c4_files(split, count, total):
    return [f'en/c4-{split}.{i:05d}-of-{total:05d}.json.gz' for i in range(count)]


def local_files(pattern):
    files = sorted(glob.glob(pattern, recursive=True))
    if not files:
        raise SystemExit(f"no files match {pattern!r}")
    for f in files:
        if not f.endswith(('.json', '.json.gz', '.jsonl', '.jsonl.gz', '.txt')):
            raise SystemExit(f"{f}: unsupported file type; expected .json, .json.gz, .jsonl or .txt")
    return files


# ----------------------------------------------------------------------------- the pipeline

def documents(sources, position):
    """(source index, doc index, text) from position = [source, doc, token offset] onwards."""
    for s in range(position[0], len(sources)):
        for d, text in enumerate(read_source(sources[s])):
            if s > position[0] or d >= position[1]:
                yield s, d, text


def ordered_map(fn, items, workers):
    """fn over items on a thread pool, in order, with a bounded number in flight (tiktoken releases
    the GIL, so the threads encode in parallel while this thread reads on). An error reading the
    items is raised only after the results of the items before it."""
    error = None
    with ThreadPoolExecutor(workers) as pool:
        pending = deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
        except (Exception, SystemExit) as e:
            error = e
        while pending:
            yield pending.popleft().result()
    if error:
        raise error


def batches(docs, size=64):
    """Lists of size docs; on an error, the docs read before it come first."""
    batch = []
    try:
        for doc in docs:
            batch.append(doc)
            if len(batch) == size:
                yield batch
                batch = []
    except (Exception, SystemExit):
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def encoded_batches(enc, sources, position):
    """From position on, batches (docs, tokens, ends, first): docs lists (source, doc index) pairs,
    tokens (uint16) holds their tokens, each document's ending in EOT, ends[i] is where document i
    ends in tokens, and the first document's tokens start at its token index first."""
    eot = np.array([enc.eot_token], dtype=np.uint32)

    def encode(batch):  # encode_to_numpy with no special tokens is encode_ordinary, minus a Python list
        ids = [enc.encode_to_numpy(text, disallowed_special=()) for _, _, text in batch]
        tokens = np.concatenate([part for doc in ids for part in (doc, eot)]).astype(np.uint16)
        return [(s, d) for s, d, _ in batch], tokens, np.cumsum([len(doc) + 1 for doc in ids])
    first = position[2]
    for docs, tokens, ends in ordered_map(encode, batches(documents(sources, position)), num_proc):
        yield docs, tokens[first:], ends - first, first
        first = 0


def prepare_split(enc, split, sources, meta, meta_path, start=(0, 0, 0), limit=None):
    """Tokenise sources, from position start = [source, doc, token], into split's shards, resuming
    from what meta records; with a limit, stop after that many tokens."""
    state = meta['splits'].setdefault(split, {'sources': sources, 'shards': [], 'tokens': 0,
                                              'position': list(start), 'done': False})
    if state['sources'] != sources:
        raise SystemExit(f"{out_dir} holds {split} shards made from other sources; use another out_dir")
    if state['done']:
        return state
    from tqdm import tqdm
    buffer, buffered, t0 = [], 0, time.time()

    def flush(next_position):  # write the buffer as the next shard, then record it
        nonlocal buffer, buffered
        name = f'{split}_{len(state["shards"]):06d}.bin'
        write_shard(os.path.join(out_dir, name), np.concatenate(buffer))
        state['shards'].append(name)
        state['tokens'] += buffered
        state['position'] = [int(p) for p in next_position]
        _write_json(meta_path, meta)
        buffer, buffered = [], 0

    def at_limit():
        return limit is not None and state['tokens'] + buffered == limit

    with tqdm(desc=split, unit=' docs', dynamic_ncols=True) as bar:
        for docs, tokens, ends, first in encoded_batches(enc, sources, state['position']):
            i = 0  # the next token of this batch to place
            while i < len(tokens) and not at_limit():
                room = shard_tokens - buffered
                if limit is not None:
                    room = min(room, limit - state['tokens'] - buffered)
                buffer.append(tokens[i:i + room])
                buffered += len(buffer[-1])
                i += len(buffer[-1])
                if buffered == shard_tokens or at_limit():  # the next shard starts at token i: where is that?
                    k = int(np.searchsorted(ends, i, side='right'))  # in document k, or just past the batch
                    if k == len(docs):
                        flush([docs[-1][0], docs[-1][1] + 1, 0])
                    else:
                        flush([*docs[k], i - (ends[k - 1] if k else -first)])
            bar.update(len(docs))
            bar.set_postfix_str(f'{(state["tokens"] + buffered) / (time.time() - t0):,.0f} tokens/s', refresh=False)
            if at_limit():
                break
    if buffered:
        flush([len(sources), 0, 0])
    if state['tokens'] == 0:
        raise SystemExit(f"no documents for the {split} split in {sources[0]}{' ...' if len(sources) > 1 else ''}")
    state['done'] = True
    _write_json(meta_path, meta)
    return state


def open_meta(enc):
    """meta.json of out_dir: the one there if it was made with this encoding, else a new one."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, 'meta.json')
    if os.path.exists(path):
        meta = load_meta(out_dir)
        if meta['encoding'] != enc.name or meta['shard_tokens'] != shard_tokens:
            raise SystemExit(f"{out_dir} holds shards made with encoding={meta['encoding']!r}, "
                             f"shard_tokens={meta['shard_tokens']}; use another out_dir")
        return meta, path
    if glob.glob(os.path.join(out_dir, '*.bin')):
        raise SystemExit(f"{out_dir} holds .bin files but no meta.json; use another out_dir")
    return {'encoding': enc.name, 'vocab_size': enc.n_vocab, 'eot': enc.eot_token, 'shard_tokens': shard_tokens,
            'splits': {}}, path


def prepare():
    enc = get_encoding(encoding)
    if not input:
        splits = [('val', c4_files('validation', val_shards, 8)), ('train', c4_files('train', train_shards, 1024))]
    elif val_input:
        splits = [('val', local_files(val_input)), ('train', local_files(input))]
    else:
        splits = None
    meta, meta_path = open_meta(enc)
    if splits:
        for split, sources in splits:
            prepare_split(enc, split, sources, meta, meta_path)
    else:  # one stream: its first val_tokens tokens are the validation split, the rest train
        files = local_files(input)
        val = prepare_split(enc, 'val', files, meta, meta_path, limit=val_tokens)
        if val['position'][0] >= len(files):
            raise SystemExit(f"{input!r} holds only {val['tokens']} tokens, all taken by val_tokens={val_tokens}; "
                             f"lower val_tokens or pass val_input")
        prepare_split(enc, 'train', files, meta, meta_path, start=val['position'])
    for split in ('train', 'val'):
        state = meta['splits'][split]
        print(f"{split}: {state['tokens']:,} tokens in {len(state['shards'])} shard(s)")
    print(f"wrote {out_dir}/ ({meta['encoding']}, vocab {meta['vocab_size']})")


def benchmark():
    """MB/s of text through this pipeline (reading, encoding, writing shards to a temporary folder)
    against bare encoding of the same documents, already in memory, on the same number of threads."""
    import shutil
    import tempfile
    global out_dir
    enc = get_encoding(encoding)
    texts = [text for f in local_files(input) for text in read_local(f)]
    mb = sum(len(t.encode('utf-8')) for t in texts) / 1e6
    bare, full = [], []
    for _ in range(3):  # interleaved, medians
        t0 = time.time()  # bare: each thread encodes a contiguous 1/num_proc of the documents
        with ThreadPoolExecutor(num_proc) as pool:
            list(pool.map(lambda part: [enc.encode_to_numpy(t, disallowed_special=()) for t in part], [texts[i::num_proc] for i in range(num_proc)]))
        bare.append(time.time() - t0)
        out_dir = tempfile.mkdtemp()
        t0 = time.time()
        prepare()
        full.append(time.time() - t0)
        shutil.rmtree(out_dir)
    bare_rate, full_rate = mb / sorted(bare)[1], mb / sorted(full)[1]
    print(f"{mb:.1f} MB of text, {num_proc} threads: bare encode {bare_rate:.2f} MB/s, prepare.py {full_rate:.2f} MB/s "
          f"({full_rate / bare_rate:.0%} of bare)")


if __name__ == '__main__':
    from configurator import configure, public_settings
    settings = configure(public_settings(globals()), sys.argv[1:])
    globals().update(settings)
    benchmark() if bench else prepare()
