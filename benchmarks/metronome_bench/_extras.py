"""The SDK's optional packages a benchmark needs, checked before a long run rather than after it."""

from __future__ import annotations

import importlib
from types import ModuleType

from metronome_sdk.cli import MissingExtra

__all__ = ["require"]


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module``, or raise ``MissingExtra`` saying that ``feature`` needs metronome-sdk's ``[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{feature} needs the [{extra}] extra: pip install 'metronome-sdk[{extra}]' (import {module} failed: {exc})"
        ) from exc
