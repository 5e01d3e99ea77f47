"""``FailingCompiler``: a C++ compiler that cannot build here, put in torch's way through ``CXX``.

torch's ``cpp_extension`` runs ``$CXX``, the variable it documents for choosing the compiler.
This one answers torch's version check, records each compile command and fails as a cross
compiler asked for ``-mcpu=native`` fails: a test sees the flags a build passes and what the
engine does when a build fails, and nothing is compiled.
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["FailingCompiler"]

ERROR = "c++: error: unknown value 'native' for -mcpu"

_SCRIPT = """#!/bin/sh
case "$*" in
  *-dumpfullversion*) echo 12.2.0; exit 0 ;;
esac
echo "$*" >> {calls}
echo {error} >&2
exit 1
"""


class FailingCompiler:
    """A ``g++`` in ``folder`` (torch accepts it by its name) that fails every compile."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "g++"
        self._calls = folder / "calls"
        self.path.write_text(_SCRIPT.format(calls=shlex.quote(str(self._calls)), error=shlex.quote(ERROR)))
        self.path.chmod(0o755)

    @property
    def calls(self) -> list[list[str]]:
        """The arguments of each compile it was asked for, in order."""
        if not self._calls.exists():
            return []
        return [line.split() for line in self._calls.read_text().splitlines()]
