"""The local engine's memory on a CPU stays bounded: measured in a fresh process (psutil, /proc peaks)."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/clear_refs and VmHWM (Linux)")

# Load SAM2.1 tiny, decode a batch of prompt sets on random features, then encode an image.
CHILD = """
import json, sys
from pathlib import Path
import numpy as np, psutil
from triton_sam.engines import ImageFeatures
from triton_sam.engines.local import CPU_DECODE_BATCH, LocalEngine
from triton_sam.engines.providers import CPU
from triton_sam.prompts import build_request
from triton_sam.registry import get_model
from triton_sam.repository import locate

def resident():
    return psutil.Process().memory_info().rss / 2**20

def peak_since_reset():  # the peak resident (VmHWM) since clear_refs was told "5"
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024

spec = get_model("sam2.1_hiera_tiny")
engine = LocalEngine(locate(spec, Path(sys.argv[1])), providers=[CPU])
loaded = resident()
Path("/proc/self/clear_refs").write_text("5")  # the peak from here on, not the load's
rng = np.random.default_rng(0)
features = ImageFeatures({name: rng.standard_normal((1, *shape), np.float32) for name, shape in spec.feature_shapes.items()})
points = rng.uniform(0, 1024, (3 * CPU_DECODE_BATCH, 1, 2))
engine.decode(features, build_request((1024, 1024), (1024, 1024), point_coords=points, point_labels=np.ones((len(points), 1))))
batch_peak, after_batch = peak_since_reset(), resident()
engine.encode(np.zeros((1024, 1024, 3), np.uint8))
print(json.dumps({"loaded": loaded, "batch_peak": batch_peak, "after_batch": after_batch, "after_encode": resident()}))
"""


def test_sam2_tiny_stays_within_bounds_on_a_cpu(sam2_tiny_repository):
    """Resident after an encode <= 1.5 GiB, its intermediates given back (they were ~750 MiB kept
    for good); a batched decode runs a few prompt sets at a time and gives its memory back too."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(sam2_tiny_repository)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    mib = json.loads(done.stdout.strip().splitlines()[-1])
    assert mib["after_encode"] <= 1536 and mib["after_encode"] - mib["loaded"] < 250, mib
    assert mib["batch_peak"] - mib["loaded"] < 800 and mib["after_batch"] - mib["loaded"] < 150, mib
