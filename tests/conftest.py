from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import hypothesis.internal.observability  # noqa: F401
import pytest
import torch

# hypothesis' pytest plugin imports this lazily at the very end of a run; compiling it then, with
# aiortc and engine threads still alive, crashed CPython 3.11.7 ("AST constructor recursion depth
# mismatch") after every test had passed, so import it up front.

# the vLLM tests run where vLLM is installed (`make test-vllm`, in .venv-vllm); elsewhere they
# are not collected at all, rather than reported as skipped
collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm"]

# keep tests independent of the user's cache unless told otherwise
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(300))


@pytest.fixture(params=["torch", "fused"])
def kernels(request: pytest.FixtureRequest) -> str:
    """Both of the engine's paths: plain torch ops, and the fused kernels (kernels/ops.cpp)."""
    return str(request.param)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the test: small models' steps take a millisecond on one thread, and
    idle intra-op threads spinning against other processes on a 2-core machine make them far slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
