"""The GPU checks' own scripts, run on the CPU at tiny shapes, so that a GPU session's few minutes are not spent on
a broken script."""
import os

from helpers import ROOT, run


def test_gpu_train_runs_every_row_of_its_table_on_the_cpu(tmp_path):
    out = run(tmp_path, os.path.join(ROOT, '.ci', 'gpu_train.py'), '--smoke', env={'OUT': str(tmp_path / 'out')}).stdout
    rows = [line for line in out.splitlines() if line.startswith('| ') and not line.startswith('| run')]
    assert len(rows) == 2 * 9 and not any('failed' in row or 'not run' in row for row in rows), out  # each printed twice
    assert '| 130m full-rank |' in out and '1.00x' in out and '| 1b-width cola fsdp2 |' in out
    assert (tmp_path / 'out' / 'train_runs.txt').read_text().count('=====') == 9
