"""
The two extra corpora of the study (docs/study.md, "Other corpora"), made from packages that install offline:
each one text file of about 2 MB, its documents shuffled with a fixed seed so that the validation split that
prepare.py takes from the file's start is a sample of the whole, not its first chapter.

    apt-get download fortunes && dpkg -x fortunes_*.deb fortunes-deb    # Debian's fortune cookies (BSD fortune-mod)
    python assets/corpora.py fortunes fortunes-deb/usr/share/games/fortunes data/fortunes.txt
    python assets/corpora.py code "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" data/code.txt
    python prepare.py --input_files=data/fortunes.txt --encoding=byte --out_dir=data/fortunes
    python prepare.py --input_files=data/code.txt --encoding=byte --out_dir=data/code

- fortunes: every fortune of the package's English collections (the plain files, not the .u8 copies, the .dat
  indexes or the offensive ones), split at the package's `%` lines: quotations, jokes, verse, definitions.
- code: the top-level .py modules of CPython's standard library (Lib/*.py, PSF licence), whole files, until
  max_bytes: Python source, comments and docstrings. Its bytes depend on the Python version (3.11.7 here).
"""

import random
import sys
from pathlib import Path

max_bytes = 2_000_000  # the corpus's size, as the other corpus of the study's first look


def fortunes(folder):
    """The fortunes of every plain collection file in folder, one document each."""
    documents = []
    for path in sorted(Path(folder).iterdir()):
        if path.is_file() and path.suffix not in ('.dat', '.u8') and not path.is_symlink():
            text = path.read_text(encoding='latin-1')
            documents += [d.strip('\n') + '\n' for d in text.split('\n%\n') if d.strip()]
    return documents


def code(folder):
    """The standard library's top-level modules, one document each."""
    return [p.read_text(encoding='utf-8') for p in sorted(Path(folder).glob('*.py'))]


if __name__ == '__main__':
    if len(sys.argv) != 4 or sys.argv[1] not in ('fortunes', 'code'):
        sys.exit('usage: python assets/corpora.py fortunes|code <source folder> <output .txt>')
    kind, source, output = sys.argv[1:]
    if not Path(source).is_dir():
        sys.exit(f'{source!r} is not a folder: expected the {kind} source folder named in this file\'s docstring')
    if Path(output).exists():
        sys.exit(f'{output!r} exists: remove it or name another output file')
    documents = fortunes(source) if kind == 'fortunes' else code(source)
    random.Random(0).shuffle(documents)
    text, size = [], 0
    for d in documents:
        if size + len(d.encode()) > max_bytes:
            break
        text.append(d)
        size += len(d.encode())
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(('%\n' if kind == 'fortunes' else '\n').join(text), encoding='utf-8')  # fortune's own separator
    print(f'{output}: {len(text)} of {len(documents)} {kind} documents, {Path(output).stat().st_size:,} bytes')
