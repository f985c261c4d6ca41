"""Files Triton loads as python-backend models (`model.py`); they do not import triton-sam."""

from importlib import resources

FEATURE_STORES_FILE = "triton_sam_features.py"  # the session model imports these from next to itself
VIDEO_GRAPHS_FILE = "triton_sam_video.py"


def python_model_source() -> str:
    """Text of `python_model.py`, written as `<model>/1/model.py` into model repositories."""
    return resources.files(__name__).joinpath("python_model.py").read_text()


def helper_sources() -> dict[str, str]:
    """File name -> text of the modules the session model imports, written next to its `model.py`."""
    return {name: resources.files(__name__).joinpath(name).read_text() for name in (FEATURE_STORES_FILE, VIDEO_GRAPHS_FILE)}
