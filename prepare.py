"""
Tokenise a corpus into token shards for train.py.

    python prepare.py                                   # English C4 from the hub (allenai/c4)
    python prepare.py --train_shards=18                 # more C4 for bigger configs (README table)
    python prepare.py --input_files='texts/*.txt' --encoding=byte --out_dir=data/mytext   # local files

Each document becomes its tokens (tiktoken's GPT-2 BPE, or UTF-8 bytes with encoding='byte') and an
end-of-text token; each source file one shard, {split}_{i:06d}.bin: C4's json.gz files through
`datasets`, or the files of the glob input_files (.json/.json.gz/.jsonl with a "text" field per
line, or .txt, one document per file), the validation split then being val_files or else the first
val_tokens tokens of the first input file. A shard is written to a temporary file, flushed to disk
and renamed, so one that exists is complete: a rerun skips those and ends with the same bytes as a
clean run. meta.json records the settings; a folder made with other settings is refused.
"""

import glob
import gzip
import itertools
import json
import os
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm import tqdm

MAGIC, VERSION, HEADER_INTS = 0x436F4C41, 1, 256  # MAGIC spells 'CoLA'

# ----------------------------------------------------------------------------- config
out_dir = 'data/c4'
input_files = ''  # '' = C4 through datasets; else a glob of local .json/.json.gz/.jsonl/.txt files
val_files = ''  # local mode: a glob of validation files; '' = the first val_tokens tokens of input_files[0]
val_tokens = 100_000
train_shards = 9  # C4 train files (of 1024, ~150M GPT-2 tokens each): 9 covers cola_60m's 1.31B tokens
val_shards = 1  # C4 validation files (of 8)
encoding = 'gpt2'  # 'gpt2' or 'byte'
num_proc = os.cpu_count()  # encoding threads
c4_path = 'allenai/c4'  # the dataset repository (or a local folder laid out like it)


# ----------------------------------------------------------------------------- shard format

def write_durably(path, write):
    """write(f) into path atomically and durably: into a temporary file of this process's own,
    flushed to disk, then renamed into place and the rename flushed too (power cuts included)."""
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'wb') as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(os.path.dirname(path) or '.', os.O_RDONLY)
    os.fsync(folder)
    os.close(folder)


def write_shard(path, tokens):  # the header, then the tokens
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = MAGIC, VERSION, len(tokens)
    write_durably(path, lambda f: f.write(header.tobytes() + np.asarray(tokens, dtype=np.uint16).tobytes()))


def read_shard(path):
    """The tokens of a shard, as a read-only uint16 memmap; ValueError naming what is wrong."""
    size = os.path.getsize(path)
    if size < HEADER_INTS * 4:
        raise ValueError(f"{path}: cut inside its header ({size} bytes)")
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if header[0] != MAGIC or header[1] != VERSION:
        raise ValueError(f"{path}: not a version-{VERSION} nanoCoLA token shard (wrong magic number)")
    if size - HEADER_INTS * 4 != 2 * header[2]:
        raise ValueError(f"{path}: truncated: the header says {header[2]} tokens, the file holds {size} bytes")
    return np.memmap(path, dtype=np.uint16, mode='r', offset=HEADER_INTS * 4, shape=(int(header[2]),))


def load_meta(data_dir):
    return json.loads(open(os.path.join(data_dir, 'meta.json')).read())


# ----------------------------------------------------------------------------- encodings and sources

class ByteEncoding:
    """UTF-8 bytes 0..255 and an end-of-text token 256, with the methods of tiktoken's we use."""
    name, n_vocab, eot_token = 'byte', 257, 256

    def encode_to_numpy(self, text, disallowed_special=()):
        return np.frombuffer(text.encode('utf-8'), dtype=np.uint8)

    def decode(self, tokens):
        return bytes(t for t in tokens if t < 256).decode('utf-8', errors='replace')


def get_encoding(name):
    if name == 'byte':
        return ByteEncoding()
    if name != 'gpt2':
        raise SystemExit(f"encoding={name!r}: expected 'gpt2' or 'byte'")
    try:
        import tiktoken
        return tiktoken.get_encoding('gpt2')
    except Exception as e:  # tiktoken downloads its BPE files once, then caches them
        raise SystemExit(f"could not load tiktoken's gpt2 encoding ({type(e).__name__}); offline, point "
                         f"TIKTOKEN_CACHE_DIR at a folder holding its files, or use --encoding=byte") from None


def read_local(path):
    """The documents of a local file, in order."""
    try:
        if path.endswith('.txt'):
            yield open(path, encoding='utf-8').read()
            return
        with (gzip.open if path.endswith('.gz') else open)(path, 'rt', encoding='utf-8') as f:
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
    except UnicodeDecodeError as e:
        raise SystemExit(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise SystemExit(f"{path}: unreadable or corrupt file ({type(e).__name__}: {e})") from None


def read_c4(data_file):
    """The documents of one C4 source file, streamed through `datasets`."""
    import datasets
    try:
        for record in datasets.load_dataset(c4_path, data_files=data_file, split='train', streaming=True):
            yield record['text']
    except (ConnectionError, OSError, ValueError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SystemExit(f"could not read {data_file} from {c4_path} ({message}); without a network, "
                         f"tokenise local files instead: --input_files='path/*.json.gz'") from None


def local_files(pattern):
    files = sorted(glob.glob(pattern, recursive=True))
    if not files:
        raise SystemExit(f"no files match {pattern!r}")
    for f in files:
        if not f.endswith(('.json', '.json.gz', '.jsonl', '.jsonl.gz', '.txt')):
            raise SystemExit(f"{f}: unsupported file type; expected .json, .json.gz, .jsonl or .txt")
    return files


def tokenize(enc, source, pool):
    """All tokens of one source file as uint16, each document followed by the end-of-text token.
    tiktoken releases the GIL, so the pool's threads encode in parallel."""
    documents = read_local(source) if input_files else read_c4(source)
    eot, parts = np.array([enc.eot_token], dtype=np.uint16), []
    while chunk := list(itertools.islice(documents, 1024)):
        for ids in pool.map(lambda text: enc.encode_to_numpy(text, disallowed_special=()), chunk):
            parts += [ids.astype(np.uint16), eot]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


# ----------------------------------------------------------------------------- the pipeline

def save(meta, shard=None, tokens=None):
    """Write meta.json and, first, a shard; the first write creates out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    if shard:
        write_shard(os.path.join(out_dir, shard), tokens)
    write_durably(os.path.join(out_dir, 'meta.json'), lambda f: f.write(json.dumps(meta, indent=1).encode()))


def write_split(enc, pool, meta, split, sources, first_offset=0):
    """One shard per source, {split}_{i:06d}.bin, skipping those a previous run finished; the first
    source's first first_offset tokens are left out (the validation split took them)."""
    shards = []
    for i, source in enumerate(tqdm(sources, desc=split, unit=' files', dynamic_ncols=True)):
        name = f'{split}_{i:06d}.bin'
        if not os.path.exists(os.path.join(out_dir, name)):
            tokens = tokenize(enc, source, pool)[first_offset if i == 0 else 0:]
            if len(tokens) == 0:
                continue
            save(meta, name, tokens)
        shards.append(name)
    if not shards:
        raise SystemExit(f"no documents for the {split} split in {sources[0]}{' ...' if len(sources) > 1 else ''}")
    meta['splits'][split] = {'sources': sources, 'shards': shards,
                             'tokens': sum(len(read_shard(os.path.join(out_dir, s))) for s in shards)}
    save(meta)


def split_off_validation(enc, pool, meta, first_file):
    """The first val_tokens tokens of the first input file, as val_000000.bin."""
    if not os.path.exists(os.path.join(out_dir, 'val_000000.bin')):
        tokens = tokenize(enc, first_file, pool)
        if len(tokens) <= val_tokens:
            raise SystemExit(f"{first_file} holds only {len(tokens):,} tokens, all taken by the validation split "
                             f"(val_tokens={val_tokens:,}): pass a lower --val_tokens or --val_files")
        meta['splits']['val'] = {'sources': [first_file], 'shards': ['val_000000.bin'], 'tokens': val_tokens}
        save(meta, 'val_000000.bin', tokens[:val_tokens])


def open_out_dir(enc, settings):
    """meta.json of out_dir if it was made with these settings (a rerun), else a new one; refuses a
    folder made with other settings. Nothing is created yet."""
    if os.path.exists(os.path.join(out_dir, 'meta.json')):
        meta = load_meta(out_dir)
        for key, value in settings.items():
            if meta['settings'].get(key) != value:
                raise SystemExit(f"{out_dir}/ holds shards made with {key}={meta['settings'].get(key)!r} "
                                 f"(this run: {value!r}); use another out_dir")
        return meta
    if glob.glob(os.path.join(out_dir, '*.bin')):
        raise SystemExit(f"{out_dir}/ holds .bin files but no meta.json; use another out_dir")
    if not os.path.exists(out_dir):
        try:  # can out_dir be made? (made, then removed: a run that fails leaves nothing behind)
            os.makedirs(out_dir)
            os.removedirs(out_dir)
        except OSError as e:
            raise SystemExit(f"out_dir={out_dir!r} cannot be created ({e.strerror})") from None
    return {'settings': settings, 'encoding': enc.name, 'vocab_size': enc.n_vocab, 'eot': enc.eot_token, 'splits': {}}


def prepare():
    enc = get_encoding(encoding)
    if not input_files:
        val = [f'en/c4-validation.{i:05d}-of-00008.json.gz' for i in range(val_shards)]
        train = [f'en/c4-train.{i:05d}-of-01024.json.gz' for i in range(train_shards)]
    else:
        train, val = local_files(input_files), local_files(val_files) if val_files else None
    settings = {'encoding': enc.name, 'c4_path': None if input_files else c4_path, 'train_files': train,
                'val_files': val, 'val_tokens': None if val else val_tokens}
    meta = open_out_dir(enc, settings)
    with ThreadPoolExecutor(num_proc) as pool:  # a rerun skips every shard that exists
        if val:
            write_split(enc, pool, meta, 'val', val)
        else:  # the first val_tokens tokens are validation, the rest train
            split_off_validation(enc, pool, meta, train[0])
        write_split(enc, pool, meta, 'train', train, first_offset=0 if val else val_tokens)
    for split, state in meta['splits'].items():
        print(f"{split}: {state['tokens']:,} tokens in {len(state['shards'])} shard(s)")
    print(f"wrote {out_dir}/ ({meta['encoding']}, vocab {meta['vocab_size']})")


if __name__ == '__main__':
    from configurator import configure, public_settings
    globals().update(configure(public_settings(globals()), sys.argv[1:]))
    prepare()
