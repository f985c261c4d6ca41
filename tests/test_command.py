"""The `triton-sam` command itself: what it says of its own version."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

from triton_sam import __version__


def test_version_is_the_installed_distribution_s():
    done = subprocess.run([sys.executable, "-m", "triton_sam.cli", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == f"triton-sam {version('triton-sam')}" == f"triton-sam {__version__}"
