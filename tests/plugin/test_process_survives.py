"""What once killed napari's process with the panel open: each scenario (`process_scenarios.py`)
runs in a process of its own, so that a crash fails its test instead of ending the test run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("napari")

SCENARIOS = Path(__file__).with_name("process_scenarios.py")
ROOT = Path(__file__).parents[2]  # the scenarios send their mouse events with benchmarks.gui


def _run(scenario: str, repository: Path, settings: Path, argument: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCENARIOS), scenario, str(repository), str(settings), argument],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.rstrip().endswith("survived"), done.stdout
    return done.stdout + done.stderr


def test_deleting_the_image_and_the_helper_layers_then_start_on_a_new_image(synthetic_repository, tmp_path):
    """napari 0.9.2 with vispy 0.17 dies in `glDrawArrays` when an Image is removed and then a Shapes
    layer with a Points layer above it: the plugin's box under its prompts did (9 of 9 tries). Three
    rounds in one process (three processes of three rounds each took 90 s of CI, five rounds 42 s)."""
    assert _run("helper-layers", synthetic_repository, tmp_path, "3").count("round ") == 3


@pytest.mark.parametrize("work", ["encode-all", "segment-all"])
def test_closing_napari_while_the_panel_works(work, synthetic_repository, tmp_path):
    """The work's last results arrive after the panel's Qt objects are gone: a slot touching them
    raised, with napari's exception hook gone too (the process aborted)."""
    output = _run("close-mid-work", synthetic_repository, tmp_path, work)
    assert "closing while running: Stop" in output and "has been deleted" not in output
