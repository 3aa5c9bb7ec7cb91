import gzip
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import needs_gpt2
from helpers import ROOT, digest, refused, run

from shards import ByteEncoding, read_shard, write_shard

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
    return np.concatenate([np.append(enc.encode_to_numpy(d, disallowed_special=()), enc.eot_token) for d in docs]).astype(np.uint16)


@pytest.mark.parametrize('name', [pytest.param('gpt2', marks=needs_gpt2), 'byte'])
def test_local_json_gz_round_trips_documents_in_order(tmp_path, name):
    write_c4_file(str(tmp_path / 'src' / 'a.json.gz'), DOCS[:10])
    write_c4_file(str(tmp_path / 'src' / 'b.json.gz'), DOCS[10:])
    r = run_prepare(tmp_path, "--input_files=src/*.json.gz", '--out_dir=out', f'--encoding={name}', '--val_tokens=300')
    assert r.returncode == 0, r.stderr
    tokens, meta = stream(tmp_path / 'out')
    np.testing.assert_array_equal(tokens, expected_tokens(DOCS, name))
    enc = encoding(name)
    ends = np.flatnonzero(tokens == enc.eot_token)
    assert [enc.decode(doc.tolist()) for doc in np.split(tokens, ends + 1)[:-1]] == [d + enc.decode([enc.eot_token]) for d in DOCS]
    assert meta['encoding'] == name and meta['vocab_size'] == enc.n_vocab and meta['eot'] == enc.eot_token
    first_file = len(expected_tokens(DOCS[:10], name))
    assert meta['splits']['val']['tokens'] == 300 and meta['splits']['val']['sources'] == ['src/a.json.gz']
    assert meta['splits']['train']['shards'] == ['train_000000.bin', 'train_000001.bin']  # one per source file
    assert [len(read_shard(tmp_path / 'out' / s)) for s in meta['splits']['train']['shards']] == \
        [first_file - 300, len(tokens) - first_file]
    assert not list((tmp_path / 'out').glob('*.tmp*'))


def test_txt_files_are_one_document_each_and_val_files_are_the_validation_split(tmp_path):
    (tmp_path / 'txt').mkdir()
    for i, doc in enumerate(DOCS[:4]):
        (tmp_path / 'txt' / f'{i}.txt').write_text(doc, encoding='utf-8')
    (tmp_path / 'v.jsonl').write_text('\n'.join(json.dumps({'text': d}) for d in DOCS[4:6]) + '\n', encoding='utf-8')
    r = run_prepare(tmp_path, '--input_files=txt/*.txt', '--val_files=v.jsonl', '--out_dir=out', '--encoding=byte')
    assert r.returncode == 0, r.stderr
    tokens, meta = stream(tmp_path / 'out')
    np.testing.assert_array_equal(tokens, expected_tokens(DOCS[4:6] + DOCS[:4], 'byte'))
    assert meta['splits']['val']['sources'] == ['v.jsonl']


@needs_gpt2
def test_a_folder_of_small_documents_gets_a_validation_split_with_the_default_settings(tmp_path):
    # 300 files of 1,000 bytes: the default val_tokens (100,000) spans the first 100 files (and their end-of-text tokens)
    texts = [f'document {i:03d} ' + 'abcdefghij' * 98 + 'z' * 6 for i in range(300)]
    for i, text in enumerate(texts):
        (tmp_path / f'doc{i:03d}.txt').write_text(text)
    assert run_prepare(tmp_path, '--input_files=doc*.txt', '--encoding=byte', '--out_dir=out').returncode == 0
    stream = np.concatenate([np.append(np.frombuffer(t.encode(), dtype=np.uint8), 256) for t in texts]).astype(np.uint16)
    meta = json.loads((tmp_path / 'out' / 'meta.json').read_text())
    val = read_shard(tmp_path / 'out' / 'val_000000.bin')
    train = np.concatenate([read_shard(tmp_path / 'out' / name) for name in meta['splits']['train']['shards']])
    assert len(val) == 100_000 and np.array_equal(val, stream[:100_000])
    assert np.array_equal(train, stream[100_000:])  # the rest, in order, nothing twice, nothing lost


def test_c4_mode_reads_allenai_c4_layout_through_datasets(tmp_path):
    c4 = tmp_path / 'c4repo'  # a local folder laid out like the allenai/c4 repository
    write_c4_file(str(c4 / 'en' / 'c4-train.00000-of-01024.json.gz'), DOCS[:8])
    write_c4_file(str(c4 / 'en' / 'c4-train.00001-of-01024.json.gz'), DOCS[8:16])
    write_c4_file(str(c4 / 'en' / 'c4-validation.00000-of-00008.json.gz'), DOCS[16:])
    r = run_prepare(tmp_path, f'--c4_path={c4}', '--train_shards=2', '--val_shards=1', '--out_dir=out', '--encoding=byte')
    assert r.returncode == 0, r.stderr
    tokens, meta = stream(tmp_path / 'out')
    np.testing.assert_array_equal(tokens, expected_tokens(DOCS[16:] + DOCS[:16], 'byte'))
    assert meta['splits']['train']['sources'] == ['en/c4-train.00000-of-01024.json.gz', 'en/c4-train.00001-of-01024.json.gz']


def test_failed_source_then_rerun_equals_a_clean_run(tmp_path):
    for i in range(3):
        write_c4_file(str(tmp_path / 'src' / f'{i}.json.gz'), DOCS[i * 8:(i + 1) * 8])
    args = ['--input_files=src/*.json.gz', '--encoding=byte', '--val_tokens=100']
    assert run_prepare(tmp_path, *args, '--out_dir=clean').returncode == 0
    good = (tmp_path / 'src' / '2.json.gz').read_bytes()
    (tmp_path / 'src' / '2.json.gz').write_bytes(good[:len(good) // 2])  # a truncated download
    refused(run_prepare(tmp_path, *args, '--out_dir=out'), 'src/2.json.gz: unreadable or corrupt file')
    before = digest(tmp_path / 'out')
    assert {'train_000000.bin', 'train_000001.bin'} <= before.keys()  # kept what was finished
    (tmp_path / 'src' / '2.json.gz').write_bytes(good)
    assert run_prepare(tmp_path, *args, '--out_dir=out').returncode == 0
    after = digest(tmp_path / 'out')
    assert all(after[f] == h for f, h in before.items() if f.endswith('.bin'))  # finished shards were not rewritten
    assert after == digest(tmp_path / 'clean')  # the same bytes as a clean run, meta.json included


def test_a_partial_shard_is_never_read_as_complete(tmp_path):
    path = str(tmp_path / 'train_000000.bin')
    write_shard(path, np.arange(1000, dtype=np.uint16))
    assert len(read_shard(path)) == 1000
    data = open(path, 'rb').read()
    open(path, 'wb').write(data[:-10])
    with pytest.raises(ValueError, match='header says 1000 tokens'):
        read_shard(path)


def test_kill_and_rerun_equals_a_clean_run(tmp_path):
    for i in range(6):
        write_c4_file(str(tmp_path / 'src' / f'{i}.json.gz'), DOCS * 3)
    args = ['--input_files=src/*.json.gz', '--encoding=byte', '--val_tokens=1000']
    assert run_prepare(tmp_path, *args, '--out_dir=clean').returncode == 0
    env = dict(os.environ, PREPARE_TEST_DIE_AFTER_SHARDS='3')
    r = subprocess.run([sys.executable, '-c', KILL_AFTER_SHARDS, *args, '--out_dir=out'], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr  # died with shards half done
    assert list((tmp_path / 'out').glob('.train_000003.bin.tmp*')) and not (tmp_path / 'out' / 'train_000003.bin').exists()
    assert run_prepare(tmp_path, *args, '--out_dir=out').returncode == 0
    assert {f: h for f, h in digest(tmp_path / 'out').items() if '.tmp' not in f} == digest(tmp_path / 'clean')


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
            folder, name = os.path.split(path)
            open(os.path.join(folder, f'.{{name}}.tmp{{os.getpid()}}.x1y2z3'), 'wb').write(b'half a shard')
            os.kill(os.getpid(), signal.SIGKILL)
        written.append(path)
    real_write(path, tokens)
prepare.write_shard = dying_write
prepare.prepare()
'''


@pytest.mark.parametrize('setup,args,message', [
    (None, ['--input_files=nothing/*.json.gz'], "no files match 'nothing/*.json.gz'"),
    ('no_text', ['--input_files=src/*.jsonl'], 'src/bad.jsonl:2: JSON line has no "text" string'),
    ('corrupt', ['--input_files=src/*.json.gz'], 'src/bad.json.gz: unreadable or corrupt file'),
    ('latin1', ['--input_files=src/*.txt'], 'src/latin1.txt: not UTF-8 text'),
    ('binary', ['--input_files=src/*.txt'], 'src/binary.txt: not UTF-8 text'),
    ('empty', ['--input_files=src/*.jsonl', '--val_files=val/*.jsonl'], 'no documents for the val split in val/empty.jsonl'),
    (None, ['--input_files=src/*.jsonl', '--val_tokens=100'], 'the input files hold only 2 tokens, all taken by the validation split'),
    (None, ['--c4_path=allenai/c4', '--input_files=', '--train_shards=1'], 'could not read en/c4-validation.00000-of-00008.json.gz'),
    (None, ['--input_files=src/*.jsonl', '--encoding=utf16'], "encoding='utf16': expected 'gpt2' or 'byte'"),
    (None, ['--input_files=src/*.jsonl', '--out_dir=out', '--encoding=gpt2'], "out/ holds shards made with encoding='byte' (this run: 'gpt2')"),
    (None, ['--input_files=src/*.jsonl', '--out_dir=out'], "out/ holds shards made with train_files=['src/ok.jsonl']"),
    ('keep', ['--input_files=src/ok.jsonl', '--out_dir=out', '--val_tokens=1'], "out/ holds shards made with val_tokens=2 (this run: 1)"),
    (None, ['--input_files=src/*.jsonl', '--out_dir=/sys/nanocola'], "out_dir='/sys/nanocola' cannot be created"),
    ('keep', ['--input_files=src/*.jsonl', '--val_files=src/ok.jsonl', '--out_dir=other'],
     'src/ok.jsonl is both a training file (input_files) and a validation file (val_files)'),
])
def test_bad_input_is_a_one_line_error_and_leaves_shards_untouched(tmp_path, setup, args, message):
    (tmp_path / 'src').mkdir()
    (tmp_path / 'src' / 'ok.jsonl').write_text(json.dumps({'text': 'fine'}) + '\n')
    assert run_prepare(tmp_path, '--input_files=src/ok.jsonl', '--encoding=byte', '--val_tokens=2', '--out_dir=out').returncode == 0
    before = digest(tmp_path / 'out')
    if setup != 'keep':
        (tmp_path / 'src' / 'ok.jsonl').unlink()
    if setup == 'no_text':
        (tmp_path / 'src' / 'bad.jsonl').write_text('{"text": "a"}\n{"url": "b"}\n')
    elif setup == 'corrupt':
        (tmp_path / 'src' / 'bad.json.gz').write_bytes(b'\x1f\x8b\x08\x00' + b'garbage' * 10)
    elif setup == 'latin1':
        (tmp_path / 'src' / 'latin1.txt').write_bytes('café crème'.encode('latin-1'))
    elif setup == 'binary':
        (tmp_path / 'src' / 'binary.txt').write_bytes(bytes(range(256)))
    elif setup == 'empty':
        (tmp_path / 'src' / 'some.jsonl').write_text(json.dumps({'text': 'x'}) + '\n')
        (tmp_path / 'val').mkdir()
        (tmp_path / 'val' / 'empty.jsonl').write_text('\n\n')
    else:
        (tmp_path / 'src' / 'some.jsonl').write_text(json.dumps({'text': 'x'}) + '\n')
    refused(run_prepare(tmp_path, '--out_dir=new', '--encoding=byte', *args, env={'HF_HUB_OFFLINE': '1'}), message)
    assert digest(tmp_path / 'out') == before  # an existing dataset is never touched
    assert not (tmp_path / 'new').exists()  # and a failed one leaves nothing behind


def test_an_empty_out_dir_made_beforehand_is_used(tmp_path):
    (tmp_path / 'src').mkdir()
    (tmp_path / 'src' / 'ok.jsonl').write_text(json.dumps({'text': 'fine words here'}) + '\n')
    (tmp_path / 'out').mkdir()
    r = run_prepare(tmp_path, '--input_files=src/ok.jsonl', '--encoding=byte', '--val_tokens=2', '--out_dir=out')
    assert r.returncode == 0, r.stderr
    assert (tmp_path / 'out' / 'meta.json').exists()


def test_the_paper_recipes_rows_are_the_official_pipelines_token_for_token_and_pad_for_pad(paper_data):
    """Each document its own row: what transformers' tokenizer call in GaLore's and CoLA's loader gives (max_length,
    truncation, padding='max_length'), in the documents' order, and nothing else."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(paper_data / 'tok'))
    meta = json.loads((paper_data / 'data' / 'meta.json').read_text())
    assert (meta['recipe'], meta['row_tokens'], meta['pad'], meta['eot']) == ('paper', 32, 0, 1)
    assert meta['encoding'] == f"hf:{paper_data / 'tok'}" and meta['vocab_size'] == len(tokenizer)
    for split, source in [('train', 'train.jsonl'), ('val', 'val.jsonl')]:
        docs = [json.loads(line)['text'] for line in (paper_data / source).read_text().splitlines()]
        official = tokenizer(docs, max_length=32, truncation=True, padding='max_length')['input_ids']
        rows = np.concatenate([read_shard(paper_data / 'data' / s) for s in meta['splits'][split]['shards']])
        np.testing.assert_array_equal(rows.reshape(-1, 32), np.array(official))
    assert 0 < np.mean(rows == 0) < 0.9 and any(row[-1] == 1 and row[-2] != 0 for row in official)  # padded; truncated


def test_the_paper_recipe_leaves_out_documents_with_nothing_to_predict(tmp_path, paper_data):
    (tmp_path / 'docs.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in ['the cat', '', 'a dog sees']))
    r = run_prepare(tmp_path, '--recipe=paper', f"--tokenizer={paper_data / 'tok'}", '--row_tokens=8',
                    '--input_files=docs.jsonl', '--val_tokens=8', '--out_dir=out')
    assert r.returncode == 0, r.stderr
    rows = np.concatenate([read_shard(p) for p in sorted((tmp_path / 'out').glob('*.bin'))]).reshape(-1, 8)
    assert len(rows) == 2 and all((row != 0).sum() >= 2 for row in rows)  # the empty one, its end token alone, is gone


def test_the_paper_recipes_rows_are_the_official_pipelines_whatever_transformers_is_installed():
    """Rows recorded from the official call under transformers 4.48.3 (tests/fixtures/t5_like/official_rows.json) on
    documents with newlines, runs of spaces, literal special tokens, an empty one and one cut short."""
    from shards import get_encoding
    folder = os.path.join(ROOT, 'tests', 'fixtures', 't5_like')
    recorded = json.load(open(os.path.join(folder, 'official_rows.json')))
    assert get_encoding('hf:' + folder).rows(recorded['documents'], 16) == recorded['rows']


def test_the_study_corpora_are_every_document_once_shuffled_and_nothing_is_overwritten(tmp_path):
    folder = tmp_path / 'fortunes'
    folder.mkdir()
    (folder / 'wisdom').write_text('Know thyself.\n%\nLess is more.\n\t\t-- someone\n%\n')
    (folder / 'wisdom.dat').write_bytes(b'\x00\x01 an index, not text')
    (folder / 'wisdom.u8').write_text('Know thyself.\n%\n')  # the package's UTF-8 copy of the same file
    r = run(tmp_path, os.path.join('assets', 'corpora.py'), 'fortunes', 'fortunes', 'out.txt')
    assert r.stdout.startswith('out.txt: 2 of 2 fortunes documents')
    assert sorted((tmp_path / 'out.txt').read_text().split('%\n')) == ['Know thyself.\n', 'Less is more.\n\t\t-- someone\n']
    refused(run(tmp_path, os.path.join('assets', 'corpora.py'), 'fortunes', 'fortunes', 'out.txt', check=False),
            "'out.txt' exists: remove it or name another output file")
