import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, run

from prepare import ByteEncoding, read_shard, write_shard

DOCS = [
    'Hello, world. This is a short document.',
    'Ünïcödé: naïve café, 東京, emoji 🚀 and a tab\there.',
    '',  # an empty document is still a document: it becomes a lone EOT
    'A long document. ' * 400,
    'Line one\nline two\n\nline four after a blank line.',
    'The last one, in C4 style, with "quotes" and \\backslashes\\.',
] + [f'Filler document number {i}: ' + 'lorem ipsum ' * (i % 7) for i in range(20)]


def run_prepare(cwd, *args, env=None):
    return run(cwd, 'prepare.py', *args, env=env, check=False)


def write_c4_file(path, docs):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, 'wt', encoding='utf-8') as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({'text': text, 'timestamp': '2019-04-25T12:57:54Z', 'url': f'https://example.com/{i}'}) + '\n')
            if i % 5 == 0:
                f.write('\n')  # blank lines are skipped


def stream(out_dir):
    """All tokens of out_dir, val then train, and meta.json."""
    meta = json.load(open(os.path.join(out_dir, 'meta.json')))
    tokens = [read_shard(os.path.join(out_dir, name)) for split in ('val', 'train')
              for name in meta['splits'][split]['shards']]
    return np.concatenate(tokens), meta


def encoding(name):
    if name == 'byte':
        return ByteEncoding()
    import tiktoken
    return tiktoken.get_encoding('gpt2')


def expected_tokens(docs, name):
    enc = encoding(name)
    return np.array([t for d in docs for t in enc.encode_ordinary(d) + [enc.eot_token]], dtype=np.uint16)


def digest(folder):
    return {f: hashlib.sha1(open(os.path.join(folder, f), 'rb').read()).hexdigest() for f in sorted(os.listdir(folder))}


@pytest.mark.parametrize('name', ['gpt2', 'byte'])
def test_local_json_gz_round_trips_documents_in_order(tmp_path, name):
    write_c4_file(str(tmp_path / 'src' / 'a.json.gz'), DOCS[:10])
    write_c4_file(str(tmp_path / 'src' / 'b.json.gz'), DOCS[10:])
    r = run_prepare(tmp_path, "--input=src/*.json.gz", '--out_dir=out', f'--encoding={name}', '--val_tokens=300',
                    '--shard_tokens=700')
    assert r.returncode == 0, r.stderr
    tokens, meta = stream(tmp_path / 'out')
    expected = expected_tokens(DOCS, name)
    np.testing.assert_array_equal(tokens, expected)
    enc = encoding(name)
    assert enc.decode(tokens.tolist()).split(enc.decode([enc.eot_token]))[:-1] == DOCS if name == 'gpt2' else True
    assert meta['encoding'] == name and meta['vocab_size'] == enc.n_vocab and meta['eot'] == enc.eot_token
    assert meta['splits']['val']['tokens'] == 300 and meta['splits']['train']['tokens'] == len(expected) - 300
    assert meta['splits']['train']['sources'] == ['src/a.json.gz', 'src/b.json.gz']
    shards = meta['splits']['train']['shards']
    assert len(shards) == -(-(len(expected) - 300) // 700)
    for shard in shards[:-1]:  # header counts: every shard but the last is full
        assert len(read_shard(tmp_path / 'out' / shard)) == 700
    assert not list((tmp_path / 'out').glob('*.tmp'))


def test_txt_files_are_one_document_each_and_val_input_splits(tmp_path):
    (tmp_path / 'txt').mkdir()
    for i, doc in enumerate(DOCS[:4]):
        (tmp_path / 'txt' / f'{i}.txt').write_text(doc, encoding='utf-8')
    (tmp_path / 'v.jsonl').write_text('\n'.join(json.dumps({'text': d}) for d in DOCS[4:6]) + '\n', encoding='utf-8')
    r = run_prepare(tmp_path, '--input=txt/*.txt', '--val_input=v.jsonl', '--out_dir=out', '--encoding=byte')
    assert r.returncode == 0, r.stderr
    tokens, meta = stream(tmp_path / 'out')
    np.testing.assert_array_equal(tokens, expected_tokens(DOCS[4:6] + DOCS[:4], 'byte'))
    assert meta['splits']['val']['sources'] == ['v.jsonl']


def test_c4_mode_reads_allenai_c4_layout_through_datasets(tmp_path):
    c4 = tmp_path / 'c4repo'  # a local folder laid out like the allenai/c4 repository
    write_c4_file(str(c4 / 'en' / 'c4-train.00000-of-01024.json.gz'), DOCS[:8])
    write_c4_file(str(c4 / 'en' / 'c4-train.00001-of-01024.json.gz'), DOCS[8:16])
    write_c4_file(str(c4 / 'en' / 'c4-validation.00000-of-00008.json.gz'), DOCS[16:])
    r = run_prepare(tmp_path, f'--c4_path={c4}', '--train_shards=2', '--val_shards=1', '--out_dir=out')
    assert r.returncode == 0, r.stderr
    tokens, meta = stream(tmp_path / 'out')
    np.testing.assert_array_equal(tokens, expected_tokens(DOCS[16:] + DOCS[:16], 'gpt2'))
    assert meta['splits']['train']['sources'] == ['en/c4-train.00000-of-01024.json.gz', 'en/c4-train.00001-of-01024.json.gz']


def test_failed_source_then_rerun_equals_a_clean_run(tmp_path):
    for i in range(3):
        write_c4_file(str(tmp_path / 'src' / f'{i}.json.gz'), DOCS[i * 8:(i + 1) * 8])
    args = ['--input=src/*.json.gz', '--encoding=byte', '--val_tokens=100', '--shard_tokens=500']
    assert run_prepare(tmp_path, *args, '--out_dir=clean').returncode == 0
    good = (tmp_path / 'src' / '2.json.gz').read_bytes()
    (tmp_path / 'src' / '2.json.gz').write_bytes(good[:len(good) // 2])  # a truncated download
    r = run_prepare(tmp_path, *args, '--out_dir=out')
    assert r.returncode != 0 and 'src/2.json.gz' in r.stderr.strip().splitlines()[-1]
    done = json.load(open(tmp_path / 'out' / 'meta.json'))['splits']['train']
    assert done['shards'] and not done['done'] and done['position'][0] >= 1  # kept what was finished
    before = {f: h for f, h in digest(tmp_path / 'out').items() if f.endswith('.bin')}
    (tmp_path / 'src' / '2.json.gz').write_bytes(good)
    assert run_prepare(tmp_path, *args, '--out_dir=out').returncode == 0
    after = digest(tmp_path / 'out')
    assert all(after[f] == h for f, h in before.items())  # finished shards were not rewritten
    np.testing.assert_array_equal(stream(tmp_path / 'out')[0], stream(tmp_path / 'clean')[0])
    assert [f for f in after if f.endswith('.bin')] == [f for f in digest(tmp_path / 'clean') if f.endswith('.bin')]


def test_a_partial_shard_is_never_read_as_complete(tmp_path):
    path = str(tmp_path / 'train_000000.bin')
    write_shard(path, np.arange(1000, dtype=np.uint16))
    assert len(read_shard(path)) == 1000
    data = open(path, 'rb').read()
    open(path, 'wb').write(data[:-10])
    with pytest.raises(ValueError, match='header says 1000 tokens'):
        read_shard(path)


def test_kill_and_rerun_equals_a_clean_run(tmp_path):
    write_c4_file(str(tmp_path / 'src' / 'big.json.gz'), DOCS * 60)
    args = ['--input=src/*.json.gz', '--encoding=byte', '--val_tokens=1000', '--shard_tokens=2000']
    assert run_prepare(tmp_path, *args, '--out_dir=clean').returncode == 0
    env = dict(os.environ, PREPARE_TEST_DIE_AFTER_SHARDS='3')
    r = subprocess.run([sys.executable, '-c', KILL_AFTER_SHARDS, *args, '--out_dir=out'], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr  # died with shards half done
    assert (tmp_path / 'out' / 'train_000003.bin.tmp').exists() and not (tmp_path / 'out' / 'train_000003.bin').exists()
    assert run_prepare(tmp_path, *args, '--out_dir=out').returncode == 0
    np.testing.assert_array_equal(stream(tmp_path / 'out')[0], stream(tmp_path / 'clean')[0])


# Runs prepare.py in-process and SIGKILLs itself while writing the 4th train shard's temporary file.
KILL_AFTER_SHARDS = f'''
import os, signal, sys
sys.path.insert(0, {ROOT!r})
import prepare
from configurator import configure, public_settings
vars(prepare).update(configure(public_settings(vars(prepare)), sys.argv[1:]))
real_write, written = prepare.write_shard, []
def dying_write(path, tokens):
    if 'train_' in path:
        if len(written) == int(os.environ['PREPARE_TEST_DIE_AFTER_SHARDS']):
            open(path + '.tmp', 'wb').write(b'half a shard')
            os.kill(os.getpid(), signal.SIGKILL)
        written.append(path)
    real_write(path, tokens)
prepare.write_shard = dying_write
prepare.prepare()
'''


@pytest.mark.parametrize('setup,args,message', [
    (None, ['--input=nothing/*.json.gz'], "no files match 'nothing/*.json.gz'"),
    ('no_text', ['--input=src/*.jsonl'], 'src/bad.jsonl:2: JSON line has no "text" string'),
    ('corrupt', ['--input=src/*.json.gz'], 'src/bad.json.gz: unreadable or corrupt file'),
    ('empty', ['--input=src/*.jsonl', '--val_input=src/*.jsonl'], 'no documents for the val split in src/empty.jsonl'),
    (None, ['--c4_path=allenai/c4', '--input=', '--train_shards=1'], 'could not read en/c4-validation.00000-of-00008.json.gz'),
    (None, ['--input=src/*.jsonl', '--encoding=utf16'], "encoding='utf16': expected 'gpt2' or 'byte'"),
    (None, ['--input=src/*.jsonl', '--out_dir=out', '--encoding=gpt2'], "out holds shards made with encoding='byte'"),
    (None, ['--input=src/*.jsonl', '--out_dir=out'], 'out holds val shards made from other sources'),
])
def test_bad_input_is_a_one_line_error_and_leaves_shards_untouched(tmp_path, setup, args, message):
    (tmp_path / 'src').mkdir()
    (tmp_path / 'src' / 'ok.jsonl').write_text(json.dumps({'text': 'fine'}) + '\n')
    assert run_prepare(tmp_path, '--input=src/ok.jsonl', '--encoding=byte', '--val_tokens=2', '--out_dir=out').returncode == 0
    before = digest(tmp_path / 'out')
    (tmp_path / 'src' / 'ok.jsonl').unlink()
    if setup == 'no_text':
        (tmp_path / 'src' / 'bad.jsonl').write_text('{"text": "a"}\n{"url": "b"}\n')
    elif setup == 'corrupt':
        (tmp_path / 'src' / 'bad.json.gz').write_bytes(b'\x1f\x8b\x08\x00' + b'garbage' * 10)
    elif setup == 'empty':
        (tmp_path / 'src' / 'empty.jsonl').write_text('\n\n')
    else:
        (tmp_path / 'src' / 'some.jsonl').write_text(json.dumps({'text': 'x'}) + '\n')
    r = run_prepare(tmp_path, '--out_dir=new', '--encoding=byte', *args, env={'HF_HUB_OFFLINE': '1'})
    assert r.returncode != 0
    assert message in r.stderr.strip().splitlines()[-1], r.stderr
    assert digest(tmp_path / 'out') == before  # an existing dataset is never touched
    assert not list(tmp_path.glob('new/*.bin'))  # and a failed one never looks finished
