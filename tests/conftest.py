import os

import pytest

# GPT-2's BPE files for tiktoken, offline, when the shared folder is there (users with a network need nothing).
_SHARED_TIKTOKEN = os.path.join(os.path.dirname(__file__), '..', '..', 'shared', 'tiktoken')
if os.path.isdir(_SHARED_TIKTOKEN):
    os.environ.setdefault('TIKTOKEN_CACHE_DIR', os.path.abspath(_SHARED_TIKTOKEN))

# Without a GPU, Triton's interpreter runs the kernels on CPU tensors; it must be on when kernels.py
# defines them. With a GPU, the tests marked cuda run the compiled kernels.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
import kernels  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line('markers', 'triton: runs the Triton kernels (interpreted on CPU)')
    config.addinivalue_line('markers', 'cuda: needs a CUDA GPU; skipped without one')


@pytest.fixture(autouse=True)
def _interpret_only_where_marked(request, monkeypatch):
    # The interpreter is far too slow to train with: elsewhere CPU tensors take the PyTorch path.
    if 'triton' not in request.keywords:
        monkeypatch.setattr(kernels, 'INTERPRET', False)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        for item in items:
            if 'cuda' in item.keywords:
                item.add_marker(pytest.mark.skip(reason='needs a CUDA GPU'))
