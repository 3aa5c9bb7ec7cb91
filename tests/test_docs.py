"""The README and docs/ as a user reads them: every command in their code blocks names a script, config files and
settings that exist, and the load-and-compare snippet of docs/evaluation.md runs as written."""
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import TINY_TRAIN
from helpers import ROOT, run

PAGES = ['README.md', *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))]


def code_blocks(page):
    return re.findall(r'```(\w*)\n(.*?)```', open(os.path.join(ROOT, page), encoding='utf-8').read(), re.S)


def documented_commands():
    """(page, the command's words) of every `python <script>.py ...` or torchrun line in the pages' shell blocks and
    inline code."""
    found = []
    for page in PAGES:
        inline = re.findall(r'`((?:python3?|torchrun) [^`]+)`', open(os.path.join(ROOT, page), encoding='utf-8').read())
        for language, block in code_blocks(page) + [('', line) for line in inline]:
            for line in block.splitlines():
                for command in re.split(r'\s+&&\s+', line.split('  #')[0].strip()):
                    try:
                        words = shlex.split(command)
                    except ValueError:  # a line continued on the next (an open quote): its words as they stand
                        words = command.split()
                    if words[:1] in (['python'], ['python3'], ['torchrun']) and any(w.endswith('.py') for w in words):
                        found.append((page, words))
    return found


def settings_of(script):
    """The settings a script takes: its module-level settings with their meanings, as its --help lists them."""
    from configurator import setting_comments
    return set(setting_comments(os.path.join(ROOT, script)))


def test_every_documented_command_names_a_script_configs_and_settings_that_exist():
    commands = documented_commands()
    assert len(commands) > 50  # the pages' commands were found
    helps, wrong = {}, []
    for page, words in commands:
        script = next(w for w in words if w.endswith('.py') and not w.startswith('--'))
        if script in ('script.py', 'x.py'):  # the pattern a page explains, not a command
            continue
        if not os.path.exists(os.path.join(ROOT, script)):
            wrong.append(f"{page}: {' '.join(words)}: no {script}")
            continue
        after = words[words.index(script) + 1:]
        if script.startswith(('.ci/', 'assets/')) or after[:1] == ['lm_eval']:
            continue  # their own command lines
        keys = helps.setdefault(script, settings_of(script))
        for word in after:
            if word.startswith('config/') and '<' not in word and not os.path.exists(os.path.join(ROOT, word)):
                wrong.append(f"{page}: {' '.join(words)}: no {word}")
            elif word.startswith('--') and word != '--help' and word[2:].split('=')[0] not in keys:
                wrong.append(f"{page}: {' '.join(words)}: {script} has no setting {word}")
    assert not wrong, '\n'.join(wrong)


def test_the_load_and_compare_snippet_of_docs_evaluation_runs_as_written(data, tmp_path):
    snippet = next(block for language, block in code_blocks('docs/evaluation.md') if language == 'python')
    run(tmp_path, 'train.py', *TINY_TRAIN, f"--data_dir={data / 'data'}", '--out_dir=out-cpu-tiny', '--max_iters=2')
    run(tmp_path, 'export.py', '--out_dir=out-cpu-tiny', '--export_dir=hf-cpu-tiny')
    r = subprocess.run([sys.executable, '-c', snippet], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT))  # as from the repository's root
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.strip().splitlines()[-1]) < 1e-4


@pytest.mark.parametrize('page', PAGES)
def test_docs_speak_to_a_user_with_only_the_clone(page):
    text = open(os.path.join(ROOT, page), encoding='utf-8').read()
    for team_word in ('../shared', 'issue #', 'lent one'):
        assert team_word not in text, f"{page} mentions {team_word!r}"


CODE = sorted(os.path.relpath(p, ROOT) for pattern in ('*.py', 'config/*.py', 'methods/*.py', '.ci/gpu_*')
              for p in glob.glob(os.path.join(ROOT, pattern)))


@pytest.mark.parametrize('path', CODE)
def test_code_a_user_reads_names_nothing_outside_the_clone(path):
    text = open(os.path.join(ROOT, path), encoding='utf-8').read()
    for team_word in ('../shared', '/work/', 'issue #', '(#'):
        assert team_word not in text, f"{path} mentions {team_word!r}"
