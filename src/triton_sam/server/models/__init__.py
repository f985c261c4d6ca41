"""Files Triton loads as python-backend models (`model.py`); they do not import triton-sam."""

from importlib import resources

FEATURE_STORES_FILE = "triton_sam_features.py"  # the session model imports it from next to itself


def python_model_source() -> str:
    """Text of `python_model.py`, written as `<model>/1/model.py` into model repositories."""
    return resources.files(__name__).joinpath("python_model.py").read_text()


def feature_stores_source() -> str:
    """Text of the session model's feature stores, written next to its `model.py`."""
    return resources.files(__name__).joinpath(FEATURE_STORES_FILE).read_text()
