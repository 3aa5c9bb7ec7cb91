"""The shape of the repository: what imports what, where each method's names appear, what compiles."""

import ast
import glob
import os
import py_compile

import pytest
from helpers import ROOT, run

SCRIPTS = {'train', 'prepare', 'sample', 'bench', 'compare', 'analyze', 'export'}  # run by users, imported by no one


def modules():
    """Module name -> path, for every Python file of the repository outside tests/."""
    paths = glob.glob(os.path.join(ROOT, '*.py')) + glob.glob(os.path.join(ROOT, 'methods', '*.py'))
    return {os.path.relpath(p, ROOT)[:-3].replace(os.sep, '.').removesuffix('.__init__'): p for p in paths}


def imports(path, known):
    """The repository's modules that the file at path imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f'{node.module}.{a.name}' for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known and n != 'methods'}
    return found


def test_no_import_cycles_and_no_script_imports_another():
    known = modules()
    graph = {name: imports(path, known) for name, path in known.items()}
    for name, deps in graph.items():
        assert not deps & SCRIPTS, f"{name} imports the script(s) {deps & SCRIPTS}"
        if name.startswith('methods.'):  # a method is switched on by the model or train.py, never the reverse
            assert deps <= {'cola_op'}, f"{name} imports {deps}"
    state = {}

    def visit(name, path):
        if state.get(name) == 'open':
            raise AssertionError(f"import cycle: {' -> '.join(path + [name])}")
        if state.get(name) != 'done':
            state[name] = 'open'
            for dep in graph[name]:
                visit(dep, path + [name])
            state[name] = 'done'

    for name in graph:
        visit(name, [])


@pytest.mark.parametrize('name,home', [('sparsify24', 'methods/elas.py'), ('ElasMLP', 'methods/elas.py'),
                                       ('TSVDLinear', 'methods/tsvd.py'), ('adapt_ranks', 'methods/tsvd.py'),
                                       ('silu_mm', 'cola_op.py')])
def test_a_methods_internals_appear_only_in_its_own_file(name, home):
    # outside its file a method is only switched on (its key, its MLP or layer class); its workings stay home
    allowed = {home, 'bench.py', 'model.py', 'analyze.py'} if name in ('ElasMLP', 'TSVDLinear') else {home}
    users = {os.path.relpath(p, ROOT) for p in modules().values() if name in open(p).read()}
    assert users <= allowed, users - allowed


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(ROOT, 'config', '*.py'))), ids=os.path.basename)
def test_every_config_file_compiles_as_python(path, tmp_path):
    py_compile.compile(path, cfile=str(tmp_path / 'out.pyc'), doraise=True)  # e.g. no PEP 263 look-alike on line 1 or 2


def test_the_kernel_benchmark_has_help_without_a_gpu():
    out = run(ROOT, 'cola_op.py', '--help').stdout
    assert 'silu(z) @ B' in out and 'usage: python cola_op.py' in out


def test_docs_cite_the_papers_not_files_outside_the_repository():
    paths = glob.glob(os.path.join(ROOT, '*.md')) + glob.glob(os.path.join(ROOT, 'docs', '*.md')) + list(modules().values())
    for path in paths:
        assert 'shared/papers.md' not in open(path).read(), path  # a clone has no ../shared


@pytest.mark.parametrize('path', ['.venv/bin/python', 'analysis/analysis.md', 'out-cpu-tiny/ckpt.pt', 'data/tiny/meta.json'])
def test_what_the_readme_and_scripts_create_is_ignored_by_git(path):
    import subprocess
    assert subprocess.run(['git', 'check-ignore', '-q', path], cwd=ROOT).returncode == 0, path


def test_pytest_q_still_prints_the_summary_line_and_skip_reasons():
    import subprocess
    import sys
    test = 'tests/test_layout.py::test_docs_cite_the_papers_not_files_outside_the_repository'
    r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-n', '0', '-p', 'no:cacheprovider', test,
                        'tests/test_cola_op.py::test_cuda_kernels_match_reference'], cwd=ROOT, capture_output=True, text=True)
    assert '1 passed' in r.stdout.splitlines()[-1], r.stdout
    if 'skipped' in r.stdout.splitlines()[-1]:  # without a GPU: the reason is shown
        assert 'SKIPPED' in r.stdout and 'needs a CUDA GPU' in r.stdout, r.stdout
