"""Files Triton loads as python-backend models (`model.py`); they do not import triton-sam."""

from importlib import resources


def python_model_source() -> str:
    """Text of `python_model.py`, written as `<model>/1/model.py` into model repositories."""
    return resources.files(__name__).joinpath("python_model.py").read_text()
