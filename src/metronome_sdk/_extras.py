"""Optional packages, imported when a feature needs them, with an error that names the extra.

``pip install metronome-sdk`` brings the SDK and the engine only; the WebRTC transport,
the speech models and the benchmarks' plots come with the ``[webrtc]``, ``[voice]`` and
``[bench]`` extras, so a core import never loads aiortc, PyAV or matplotlib.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__: list[str] = []  # internal: the optional-import helper


class MissingExtra(ImportError):
    """An optional package is not installed: the message says which extra brings it."""


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module``, or raise ``MissingExtra`` saying that ``feature`` needs ``[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{feature} needs the [{extra}] extra: pip install 'metronome-sdk[{extra}]' (import {module} failed: {exc})"
        ) from exc
