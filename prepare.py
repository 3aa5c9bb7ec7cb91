"""
Tokenise a corpus into token shards for train.py.

    python prepare.py                                   # English C4 from the hub (allenai/c4)
    python prepare.py --train_shards=18                 # more C4 for bigger configs (docs/training.md)
    python prepare.py --input_files='texts/*.txt' --encoding=byte --out_dir=data/mytext   # local files
    python prepare.py --recipe=paper --train_shards=15 --val_tokens=10_000_000 --out_dir=data/c4-t5  # the paper's data

Each document becomes its tokens (tiktoken's GPT-2 BPE, or UTF-8 bytes with encoding='byte') and an
end-of-text token; each source file one shard, {split}_{i:06d}.bin: C4's json.gz files through
`datasets`, or the files of the glob input_files (.json/.json.gz/.jsonl with a "text" field per
line, or .txt, one document per file), the validation split then being val_files or else the first
val_tokens tokens of the input files (the first file, or as many of the first files as that takes). A shard is written to a temporary file, flushed to disk
and renamed, so one that exists is complete: a rerun skips those and ends with the same bytes as a
clean run. meta.json records the settings; a folder made with other settings is refused.

recipe='paper' makes the CoLA paper's data instead (its loader is GaLore's): each document tokenised alone by
a Hugging Face tokenizer (T5's `t5-base` by default, or a local folder), its end token added, truncated and
padded to row_tokens, exactly the official `tokenizer(text, max_length=256, truncation=True,
padding="max_length")`: one document per row, no packing; train.py then takes the padding as no target. For C4 the
validation split is then C4's `en` validation streamed and shuffled with seed 42, as the official code reads it.
"""

import glob
import gzip
import hashlib
import itertools
import json
import os
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm import tqdm

from shards import get_encoding, load_meta, read_shard, write_durably, write_shard

# ----------------------------------------------------------------------------- config
out_dir = 'data/c4'  # the folder of token shards and meta.json that train.py reads as data_dir
input_files = ''  # '' = C4 through datasets; else a glob of local .json/.json.gz/.jsonl/.txt files
val_files = ''  # local mode: a glob of validation files; '' = the first val_tokens tokens of the input files
val_tokens = 100_000  # local mode: tokens of the validation split, taken from the input files' start
train_shards = 9  # C4 train files (of 1024, ~150M GPT-2 tokens each): 9 covers cola_60m's 1.31B tokens
val_shards = 1  # C4 validation files (of 8)
encoding = 'gpt2'  # 'gpt2' or 'byte' (recipe='packed')
recipe = 'packed'  # 'packed': documents joined by end-of-text tokens, cut into sequences by train.py; 'paper': the
#                    CoLA paper's (GaLore's loader): one document per row, T5 tokens, truncated and padded to row_tokens
tokenizer = 't5-base'  # recipe='paper': the tokenizer, a hub name (with a network) or a local folder with tokenizer.json
row_tokens = 256  # recipe='paper': tokens per row, the official max_length
num_proc = os.cpu_count()  # encoding threads
c4_path = 'allenai/c4'  # the dataset repository (or a local folder laid out like it)


# ----------------------------------------------------------------------------- sources

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


PAPER_VALIDATION = 'en validation, streamed and shuffled with seed 42'  # GaLore's and CoLA's validation data


def read_c4(data_file):
    """The documents of one C4 source file, streamed through `datasets`; for the paper's recipe's validation,
    C4's whole `en` validation split streamed and shuffled with seed 42, as the official code reads it, until
    val_tokens tokens (those of its rows that are not padding)."""
    import datasets
    try:
        if data_file == PAPER_VALIDATION:
            seen = 0
            for record in datasets.load_dataset(c4_path, 'en', split='validation', streaming=True).shuffle(seed=42):
                yield record['text']
                seen += min(row_tokens, len(record['text'].split()) + 1)  # an estimate that errs long: stops late
                if seen >= 2 * val_tokens:
                    return
            return
        for record in datasets.load_dataset(c4_path, data_files=data_file, split='train', streaming=True):
            yield record['text']
    except (ConnectionError, OSError, ValueError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SystemExit(f"could not read {data_file} from {c4_path} ({message}); without a network, "
                         f"tokenise local files instead: --input_files='path/*.json.gz'") from None


def local_files(pattern):
    """The files of a glob in sorted order, each real file once (a symlink loop or a second link to a file
    would read it again and again)."""
    files, seen = [], set()
    for f in sorted(glob.glob(pattern, recursive=True)):
        if os.path.isfile(f) and os.path.realpath(f) not in seen:
            seen.add(os.path.realpath(f))
            files.append(f)
    if not files:
        raise SystemExit(f"no files match {pattern!r}")
    for f in files:
        if not f.endswith(('.json', '.json.gz', '.jsonl', '.jsonl.gz', '.txt')):
            raise SystemExit(f"{f}: unsupported file type; expected .json, .json.gz, .jsonl or .txt")
    return files


def tokenize(enc, source, pool):
    """All tokens of one source file as uint16, each document followed by the end-of-text token.
    tiktoken releases the GIL, so the pool's threads encode in parallel. The paper's recipe: each document
    a row of row_tokens instead (its end token, truncated, padded), rows with nothing to predict (an empty
    document: its end token alone) left out."""
    documents = read_local(source) if input_files else read_c4(source)
    eot, parts = np.array([enc.eot_token], dtype=np.uint16), []
    while chunk := list(itertools.islice(documents, 1024)):
        if recipe == 'paper':
            rows = np.array(enc.rows(chunk, row_tokens), dtype=np.uint16)  # (documents, row_tokens)
            parts += list(rows[(rows != enc.pad_token).sum(1) >= 2])
            continue
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


def write_split(enc, pool, meta, split, sources, taken=()):
    """One shard per source, {split}_{i:06d}.bin, skipping those a previous run finished; the first
    taken[i] tokens of source i are left out (the validation split took them)."""
    shards = []
    for i, source in enumerate(tqdm(sources, desc=split, unit=' files', dynamic_ncols=True)):
        name = f'{split}_{i:06d}.bin'
        if os.path.exists(os.path.join(out_dir, name)):
            check_unchanged(meta, source, name)
        else:
            meta.setdefault('stamps', {})[source] = stamp(source)
            tokens = tokenize(enc, source, pool)[taken[i] if i < len(taken) else 0:]
            if len(tokens) == 0:
                continue
            save(meta, name, tokens)
        shards.append(name)
    if not shards:
        raise SystemExit(f"no documents for the {split} split in {sources[0]}{' ...' if len(sources) > 1 else ''}")
    meta['splits'][split] = {'sources': sources, 'shards': shards,
                             'tokens': sum(len(read_shard(os.path.join(out_dir, s))) for s in shards)}
    save(meta)


def split_off_validation(enc, pool, meta, files):
    """The first val_tokens tokens of the input files, in order, as val_000000.bin: from the first file,
    or from as many of the first files as that takes (a folder of small documents). Returns how many
    tokens it took from each of those files, which the train split leaves out."""
    if 'val' in meta['splits']:  # a rerun: the split is made
        for source in meta['splits']['val']['sources']:
            check_unchanged(meta, source, 'val_000000.bin')
        return meta['splits']['val'].get('taken', [val_tokens])  # (folders made before 'taken': the first file's)
    parts, taken, total = [], [], 0
    for source in files:
        meta.setdefault('stamps', {})[source] = stamp(source)
        tokens = tokenize(enc, source, pool)
        take = min(len(tokens), val_tokens - total)
        if recipe == 'paper':  # whole rows
            take = min(len(tokens), -(-take // row_tokens) * row_tokens)
        parts.append(tokens[:take])
        taken.append(take)
        total += take
        if total >= val_tokens:
            break
    if total < val_tokens or (len(taken) == len(files) and take == len(tokens)):  # nothing left to train on
        raise SystemExit(f"the input files hold only {total:,} tokens, all taken by the validation split "
                         f"(val_tokens={val_tokens:,}): pass a lower --val_tokens or --val_files")
    meta['splits']['val'] = {'sources': files[:len(taken)], 'shards': ['val_000000.bin'], 'tokens': total,
                             'taken': taken}
    save(meta, 'val_000000.bin', np.concatenate(parts))
    return taken


def stamp(source):
    """The SHA-1 of a local source's bytes (None for C4's files), recorded when it is read: a rerun then
    knows whether it changed, and a folder's meta.json stays the same bytes whenever it is made."""
    if not input_files:
        return None
    digest = hashlib.sha1()
    with open(source, 'rb') as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def check_unchanged(meta, source, shard):
    """A rerun keeps a finished shard only if its source has not changed since it was read."""
    if meta.get('stamps', {}).get(source, stamp(source)) != stamp(source):
        raise SystemExit(f"{source} changed since {out_dir}/{shard} was made from it: make the data anew into "
                         f"another out_dir (or delete {out_dir}/ first)")


def open_out_dir(settings):
    """meta.json of out_dir if it was made with these settings (a rerun), else None; refuses a folder
    made with other settings. Nothing is created yet."""
    if os.path.exists(os.path.join(out_dir, 'meta.json')):
        meta = load_meta(out_dir)
        for key, value in settings.items():
            if meta['settings'].get(key) != value:
                raise SystemExit(f"{out_dir}/ holds shards made with {key}={meta['settings'].get(key)!r} "
                                 f"(this run: {value!r}); use another out_dir")
        return meta
    if glob.glob(os.path.join(out_dir, '*.bin')):
        raise SystemExit(f"{out_dir}/ holds .bin files but no meta.json; use another out_dir")
    made, folder = [], os.path.abspath(out_dir)  # can out_dir be made? Made, then only the folders made removed
    while not os.path.exists(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    try:
        os.makedirs(out_dir, exist_ok=True)  # an empty folder made beforehand is fine
    except OSError as e:
        raise SystemExit(f"out_dir={out_dir!r} cannot be created ({e.strerror})") from None
    finally:
        for new in made:  # innermost first; folders that existed before are never touched
            if os.path.isdir(new):
                os.rmdir(new)
    return None


def prepare():
    for name, value, low, high in [('val_tokens', val_tokens, 1, None), ('train_shards', train_shards, 1, 1024),
                                   ('val_shards', val_shards, 1, 8), ('num_proc', num_proc, 1, None)]:
        if not isinstance(value, int) or value < low or (high and value > high):
            raise SystemExit(f"{name}={value!r}: expected an integer from {low}" + (f" to {high}" if high else " up"))
    if not input_files:
        val = [f'en/c4-validation.{i:05d}-of-00008.json.gz' for i in range(val_shards)]
        train = [f'en/c4-train.{i:05d}-of-01024.json.gz' for i in range(train_shards)]
    else:
        train, val = local_files(input_files), local_files(val_files) if val_files else None
        both = [f for f in train if os.path.realpath(f) in {os.path.realpath(v) for v in val or []}]
        if both:
            raise SystemExit(f"{both[0]} is both a training file (input_files) and a validation file (val_files): the "
                             f"validation loss would be measured on text the model trains on; give disjoint globs")
    if recipe not in ('packed', 'paper'):
        raise SystemExit(f"recipe={recipe!r}: expected 'packed' or 'paper'")
    if recipe == 'packed' and encoding not in ('gpt2', 'byte'):
        raise SystemExit(f"encoding={encoding!r}: expected 'gpt2' or 'byte' (a Hugging Face tokenizer: --recipe=paper "
                         f"--tokenizer=NAME)")
    if recipe == 'paper' and not input_files:  # the official validation: C4's, streamed, shuffled with seed 42
        val = [PAPER_VALIDATION]
    source = os.path.abspath(tokenizer) if os.path.exists(tokenizer) else tokenizer  # a local folder: from anywhere
    settings = {'encoding': 'hf:' + source if recipe == 'paper' else encoding, 'c4_path': None if input_files else c4_path,
                'train_files': train, 'val_files': val,
                'val_tokens': val_tokens if not val or val == [PAPER_VALIDATION] else None}  # (where it cuts the split)
    if recipe == 'paper':
        settings |= {'recipe': 'paper', 'row_tokens': row_tokens}
        if row_tokens < 2:
            raise SystemExit(f"row_tokens={row_tokens}: expected 2 or more")
    meta = open_out_dir(settings)  # before the encoding loads: a folder made otherwise is refused offline too
    enc = get_encoding(settings['encoding'])
    if enc.n_vocab > 65536:
        raise SystemExit(f"{enc.name} has {enc.n_vocab:,} tokens: shards hold uint16 ids, at most 65,536")
    meta = meta or {'settings': settings, 'encoding': enc.name, 'vocab_size': enc.n_vocab, 'eot': enc.eot_token,
                    'splits': {}, **({'recipe': 'paper', 'row_tokens': row_tokens, 'pad': enc.pad_token}
                                     if recipe == 'paper' else {})}
    with ThreadPoolExecutor(num_proc) as pool:  # a rerun skips every shard that exists
        if val:
            write_split(enc, pool, meta, 'val', val)
            write_split(enc, pool, meta, 'train', train)
        else:  # the first val_tokens tokens are validation, the rest train
            write_split(enc, pool, meta, 'train', train, taken=split_off_validation(enc, pool, meta, train))
    for split, state in meta['splits'].items():
        print(f"{split}: {state['tokens']:,} tokens in {len(state['shards'])} shard(s)")
    print(f"wrote {out_dir}/ ({meta['encoding']}, vocab {meta['vocab_size']})")


if __name__ == '__main__':
    from configurator import configure, public_settings
    globals().update(configure(public_settings(globals()), sys.argv[1:]))
    prepare()
