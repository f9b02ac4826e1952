"""The linter (ruff, configured in ruff.toml) passes on the package, its tests and configs."""

import subprocess
import sys

from conftest import ROOT


def test_ruff_finds_nothing():
  proc = subprocess.run([sys.executable, "-m", "ruff", "check", "minilm_jax", "tests", "configs"], cwd=ROOT,
                        capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr
