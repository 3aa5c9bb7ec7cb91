"""
The files that the scripts share: token shards and meta.json (prepare.py writes them, train.py,
analyze.py and sample.py read them), the encodings (GPT-2 BPE, bytes, a Hugging Face tokenizer), and the
writes every result goes through.

A shard, {split}_{i:06d}.bin, is a header of 256 int32 (MAGIC, VERSION, the token count, zeros) and then
the tokens as uint16. meta.json records the settings a folder was made with, the encoding, its vocabulary
size and end-of-text id, and each split's sources, shards and token count.
"""

import glob
import json
import os
import re
import shutil
import tempfile

import numpy as np

MAGIC, VERSION, HEADER_INTS = 0x436F4C41, 1, 256  # MAGIC spells 'CoLA'


def write_durably(path, write):
    """write(f) into path atomically and durably: into a temporary file of a name no one can predict, created
    exclusively (so never through a link planted in its place), flushed to disk, then renamed into place and the
    rename flushed too (power cuts included). Whatever fails inside (a full disk: OSError, or torch.save's
    RuntimeError), the temporary file is removed, the previous path stays as it was, and the error is one line."""
    folder, name = os.path.split(path)
    folder = folder or '.'
    remove_stale_temporaries(folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f'.{name}.tmp{os.getpid()}.', dir=folder)
    except OSError as e:
        raise SystemExit(f"could not write {path} ({e.strerror}); nothing was written") from None
    try:
        with os.fdopen(fd, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a link at path itself, never what it points to
    except BaseException as e:
        os.remove(tmp)
        if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: as they were, the temporary file gone
            raise
        kept = f'the previous {name} is unchanged' if os.path.exists(path) else 'nothing was written'
        raise SystemExit(f"could not write {path} ({write_failure(e, folder)}); {kept}") from None
    directory = os.open(folder, os.O_RDONLY)
    os.fsync(directory)
    os.close(directory)


def write_failure(error, folder):
    """Why a write failed, in a few words: the OS's reason, or for a library's own error (torch.save reports a full
    disk as a RuntimeError) the free space, else the error's first line."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    if shutil.disk_usage(folder).free < 1 << 20:
        return 'no space left on the device'
    first = str(error).strip().splitlines()[0] if str(error).strip() else ''
    return f'{type(error).__name__}: {first[:160]}' if first else type(error).__name__


def remove_stale_temporaries(folder):
    """Remove the temporary files (.NAME.tmpPID.XXXX) that killed processes left in folder."""
    for stale in glob.glob(os.path.join(glob.escape(folder), '.*.tmp*')):
        pid = re.search(r'\.tmp(\d+)\.[^.]+$', stale)
        if pid and not os.path.islink(stale) and not process_alive(int(pid.group(1))):
            os.remove(stale)


def make_writable_folder(path, setting='out_dir'):
    """Create the folder path (if need be) and check that files can be written in it, before any work: else one line."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise SystemExit(f"{setting}={path!r} is a file, not a folder: use another {setting}")
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise SystemExit(f"{setting}={path!r} cannot be written ({e.strerror}): use a writable folder") from None


def open_to_append(path, mode='a'):
    """path opened for appending text (a log; mode 'a+' to read it too), refused in one line if it is a link: no
    write of ours goes where a link planted in an output folder points."""
    try:
        fd = os.open(path, (os.O_RDWR if '+' in mode else os.O_WRONLY) | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        why = 'it is a symbolic link' if os.path.islink(path) else e.strerror
        raise SystemExit(f"could not open {path} ({why}): remove it, or use another folder") from None
    return os.fdopen(fd, mode)


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


class TokenizerEncoding:
    """A Hugging Face tokenizer (the paper's recipe: T5's SentencePiece), with the methods of tiktoken's we use. Its
    name, 'hf:' + the tokenizer's hub name or local folder, is what meta.json and checkpoints record. Run by the
    `tokenizers` library exactly as its tokenizer.json defines it (normaliser, pre-tokeniser, model, end token), as
    transformers 4 ran it in the official pipeline: transformers 5's T5 class replaces the file's pre-tokeniser and
    would lose newlines, runs of spaces and the space before a literal </s>."""

    def __init__(self, source):
        try:
            from tokenizers import Tokenizer
            folder = source if os.path.isdir(source) else os.path.dirname(_hub_file(source, 'tokenizer.json'))
            self.tokenizer = Tokenizer.from_file(os.path.join(folder, 'tokenizer.json'))
            special = json.load(open(os.path.join(folder, 'tokenizer_config.json')))
        except ImportError:
            raise SystemExit("the paper's recipe tokenises with tokenizers: pip install tokenizers") from None
        except Exception as e:  # no network and no such folder, or a folder that holds no tokenizer
            raise SystemExit(f"could not load the tokenizer {source!r} ({type(e).__name__}): give a hub name with a "
                             f"network, or a local folder holding tokenizer.json and tokenizer_config.json") from None
        token_id = lambda token: self.tokenizer.token_to_id(token['content'] if isinstance(token, dict) else token)
        self.name, self.n_vocab = 'hf:' + source, self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.eot_token, self.pad_token = token_id(special.get('eos_token', '</s>')), token_id(special.get('pad_token', '<pad>'))

    def encode_to_numpy(self, text, disallowed_special=()):
        return np.array(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, tokens):
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def rows(self, texts, row_tokens):
        """The official pipeline's rows: each text tokenised alone, its end token added, truncated and padded to
        row_tokens, as GaLore's and CoLA's data loader's `tokenizer(texts, max_length=row_tokens, truncation=True,
        padding='max_length')` makes them."""
        self.tokenizer.enable_truncation(max_length=row_tokens)
        self.tokenizer.enable_padding(length=row_tokens, pad_id=self.pad_token, pad_token=self.tokenizer.id_to_token(self.pad_token))
        try:
            return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]
        finally:
            self.tokenizer.no_truncation()
            self.tokenizer.no_padding()


def _hub_file(name, filename):
    """A file of a tokenizer on the Hugging Face hub, downloaded once into its cache (with its tokenizer_config.json)."""
    from huggingface_hub import hf_hub_download
    hf_hub_download(name, 'tokenizer_config.json')
    return hf_hub_download(name, filename)


def get_encoding(name):
    if name == 'byte':
        return ByteEncoding()
    if name.startswith('hf:'):
        return TokenizerEncoding(name[3:])
    if name != 'gpt2':
        raise SystemExit(f"encoding={name!r}: expected 'gpt2', 'byte' or 'hf:' + a tokenizer's name or folder")
    try:
        import tiktoken
        return tiktoken.get_encoding('gpt2')
    except Exception as e:  # tiktoken downloads its BPE files once, then caches them
        raise SystemExit(f"could not load tiktoken's gpt2 encoding ({type(e).__name__}); offline, point "
                         f"TIKTOKEN_CACHE_DIR at a folder holding its files, or use --encoding=byte") from None
