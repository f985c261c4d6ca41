"""Files Triton loads as python-backend models (`model.py`); they do not import triton-sam, only
the modules written next to them (`write_python_model`)."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

CONTRACT_FILE = "triton_sam_contract.py"  # triton_sam/contract.py, as the python models import it
ARRAYS_FILE = "triton_sam_arrays.py"  # signatures, crops and the best candidate, as the client computes them
FEATURE_STORES_FILE = "triton_sam_features.py"
REQUESTS_FILE = "triton_sam_requests.py"  # inputs, responses, errors and sessions every python model here uses
VOLUMES_FILE = "triton_sam_volumes.py"  # the session model's volume requests
VIDEO_GRAPHS_FILE = "triton_sam_video.py"
INSTANCE_FILE = "triton_sam_instance.py"  # the session model's instance-segmentation requests
CONCEPTS_FILE = "triton_sam_concepts.py"  # the session model's SAM3 concept requests
DECODES_FILE = "triton_sam_decodes.py"  # what a decode request asks for and how its answer is shaped
DEVICES_FILE = "triton_sam_devices.py"  # the session model's devices and where an image's features live
GRAPHS_FILE = "triton_sam_graphs.py"  # decodes replayed as CUDA graphs (the local engine's too)


def python_model_source() -> str:
    """Text of `python_model.py`, written as `<model>/1/model.py` into model repositories."""
    return resources.files(__name__).joinpath("python_model.py").read_text()


@functools.cache
def helper_sources() -> dict[str, str]:
    """File name -> text of the modules `model.py` imports, written next to it."""
    sources = {CONTRACT_FILE: resources.files("triton_sam").joinpath("contract.py").read_text()}
    for name in (
        ARRAYS_FILE,
        FEATURE_STORES_FILE,
        REQUESTS_FILE,
        VOLUMES_FILE,
        VIDEO_GRAPHS_FILE,
        INSTANCE_FILE,
        CONCEPTS_FILE,
        DECODES_FILE,
        DEVICES_FILE,
        GRAPHS_FILE,
    ):
        sources[name] = resources.files(__name__).joinpath(name).read_text()
    return sources


def write_python_model(directory: Path) -> Path:
    """Write `model.py` and the modules it imports into `directory` (a model's version folder)."""
    directory = Path(directory)
    for name, source in {"model.py": python_model_source(), **helper_sources()}.items():
        (directory / name).write_text(source)
    return directory / "model.py"
