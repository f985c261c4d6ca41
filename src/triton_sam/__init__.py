"""triton-sam: interactive Segment Anything, encoded on NVIDIA Triton or locally with ONNX Runtime."""

__version__ = "0.1.0"

from .errors import TritonSamError  # noqa: E402
from .predictor import Predictor  # noqa: E402

__all__ = ["Predictor", "TritonSamError", "__version__"]
