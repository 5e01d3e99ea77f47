"""``scripts/gpu_check.sh``, the CUDA path's first-contact check, as far as a machine without a GPU can go.

The check itself is untested: no GPU has run it. Here: it parses, its dry run names the four
stages with their budgets (at most 5 minutes in all) and where the figures go, and its Python
stages parse and answer ``--help``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STAGES = ["imports", "forward", "e2e", "scale"]

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")


@needs_bash
def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


@needs_bash
def test_dry_run_prints_the_stages_and_runs_nothing(tmp_path: Path) -> None:
    out = tmp_path / "figures"
    done = subprocess.run(
        [str(SCRIPT), "--dry-run", "--out", str(out)], check=True, capture_output=True, text=True, timeout=30
    )
    stages = re.findall(r"^stage (\w+) \(at most (\d+) s\): timeout \2 .* --out (\S+)", done.stdout, re.M)
    assert [s for s, _, _ in stages] == STAGES
    assert sum(int(b) for _, b, _ in stages) <= 300
    assert {o for _, _, o in stages} == {str(out)}
    assert not out.exists()  # a dry run writes nothing


@needs_bash
def test_output_folder_defaults_to_OUT(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "from-env")}
    done = subprocess.run([str(SCRIPT), "--dry-run"], check=True, capture_output=True, text=True, timeout=30, env=env)
    assert f"--out {tmp_path / 'from-env'} " in done.stdout


@needs_bash
def test_unknown_argument_is_refused() -> None:
    done = subprocess.run([str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "unknown argument" in done.stderr


def test_stages_script_knows_the_four_stages() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--help"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "{" + ",".join(STAGES) + "}" in done.stdout


def test_script_keeps_going_when_a_stage_fails() -> None:
    text = SCRIPT.read_text()
    assert re.search(r"^set -uo pipefail", text, re.M) and not re.search(r"^set -\w*e", text, re.M)
    assert "UNTESTED" in text
