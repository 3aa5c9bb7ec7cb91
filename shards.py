"""
The files that the scripts share: token shards and meta.json (prepare.py writes them, train.py,
analyze.py and sample.py read them), the two encodings, and the durable write every result goes through.

A shard, {split}_{i:06d}.bin, is a header of 256 int32 (MAGIC, VERSION, the token count, zeros) and then
the tokens as uint16. meta.json records the settings a folder was made with, the encoding, its vocabulary
size and end-of-text id, and each split's sources, shards and token count.
"""

import glob
import json
import os
import re

import numpy as np

MAGIC, VERSION, HEADER_INTS = 0x436F4C41, 1, 256  # MAGIC spells 'CoLA'


def write_durably(path, write):
    """write(f) into path atomically and durably: into a temporary file of this process's own,
    flushed to disk, then renamed into place and the rename flushed too (power cuts included). A
    failure (a full disk) removes the temporary file and leaves the previous path as it was, in one
    line; temporary files that killed processes left next to path are removed first."""
    for stale in glob.glob(glob.escape(path) + '.tmp*'):
        pid = stale.rsplit('.tmp', 1)[1]
        if pid.isdigit() and not process_alive(int(pid)):
            os.remove(stale)
    tmp = f'{path}.tmp{os.getpid()}'
    try:
        with open(tmp, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise SystemExit(f"could not write {path} ({e.strerror or type(e).__name__}); "
                         f"{'the previous ' + os.path.basename(path) + ' is unchanged' if os.path.exists(path) else 'nothing was written'}") from None
    folder = os.open(os.path.dirname(path) or '.', os.O_RDONLY)
    os.fsync(folder)
    os.close(folder)


def process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def shard_path(data_dir, name):
    """The path of a shard that meta.json names; a name that would leave data_dir is refused (meta.json is data)."""
    if not isinstance(name, str) or not re.fullmatch(r'(train|val)_\d{6}\.bin', name):
        raise SystemExit(f"{data_dir}/meta.json names the shard {name!r}: expected a name like train_000000.bin "
                         f"inside {data_dir}/")
    return os.path.join(data_dir, name)


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
    """meta.json of a data folder, or a one-line exit saying what is wrong with it."""
    path = os.path.join(data_dir, 'meta.json')
    try:
        meta = json.loads(open(path).read())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path} cannot be read ({getattr(e, 'strerror', None) or type(e).__name__}): "
                         f"rerun the prepare.py command that made {data_dir}/") from None
    if not isinstance(meta, dict) or not {'encoding', 'vocab_size', 'splits'} <= meta.keys():
        raise SystemExit(f"{path} is not a meta.json of prepare.py")
    return meta


# ----------------------------------------------------------------------------- encodings

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
