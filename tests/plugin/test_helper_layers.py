"""The panel survives the user deleting its image and its helper layers, then Start on a new image.

napari 0.9.2 with vispy 0.17 dies in `glDrawArrays` when an Image is removed and then a Shapes
layer that has a Points layer above it (the plugin's box under its prompts did exactly that, 9 of 9
tries). The scenario runs in a process of its own, so that the crash fails this test instead of
ending the test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("napari")

SCENARIO = Path(__file__).with_name("helper_layers_scenario.py")
ROOT = Path(__file__).parents[2]  # the scenario sends its mouse events with benchmarks.gui


@pytest.mark.parametrize("run", range(3))
def test_deleting_the_image_and_the_helper_layers_then_start_on_a_new_image(run, synthetic_repository, tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(synthetic_repository), str(tmp_path), "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.count("round ") == 3 and "survived" in done.stdout
