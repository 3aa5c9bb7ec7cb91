"""The suite's own hygiene: a test that leaves a process running fails, and the process does not outlive it."""

import os
import subprocess
import sys

from helpers import ROOT

LEAVES_A_PROCESS = '''
import subprocess

def test_that_forgets_its_child(tmp_path_factory):
    child = subprocess.Popen(['sleep', '300'])
    open({pid_file!r}, 'w').write(str(child.pid))
'''


def test_a_test_that_leaves_a_process_running_fails_naming_it_and_the_process_is_killed(tmp_path):
    pid_file = tmp_path / 'pid'
    (tmp_path / 'test_forgetful.py').write_text(LEAVES_A_PROCESS.format(pid_file=str(pid_file)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, 'tests')]))
    r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-n', '0', '-p', 'no:cacheprovider', '-p', 'conftest',
                        '--rootdir', str(tmp_path), str(tmp_path / 'test_forgetful.py')],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and 'the test left 1 process(es) running, now killed: sleep 300' in r.stdout, r.stdout[-3000:]
    pid = int(pid_file.read_text())
    assert not os.path.exists(f'/proc/{pid}') or open(f'/proc/{pid}/stat').read().rpartition(')')[2].split()[0] == 'Z'
