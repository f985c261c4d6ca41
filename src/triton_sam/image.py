"""Turn the arrays users have into the RGB uint8 images SAM models are fed.

Conversion rules (documented in the README):
- uint8 is used as is; bool becomes 0/255;
- any other dtype (uint16, int, float) is scaled linearly from `contrast_limits` (default: the
  image's min and max) to 0..255 and clipped, the way a viewer shows it;
- grayscale (HxW or HxWx1) is repeated to 3 channels, RGBA drops alpha.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .errors import InvalidInputError

ContrastLimits = tuple[float, float]


def to_rgb_uint8(image: np.ndarray, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """Validate `image` (HxW, HxWx1, HxWx3 or HxWx4) and return it as an HxWx3 uint8 array."""
    image = np.asarray(image)
    _check_shape(image)
    if image.ndim == 3:
        image = image[..., :3] if image.shape[2] >= 3 else image[..., 0]
    scaled = _scale_to_uint8(image, contrast_limits)
    if scaled.ndim == 2:
        scaled = np.repeat(scaled[..., None], 3, axis=2)
    return np.ascontiguousarray(scaled)


def _check_shape(image: np.ndarray) -> None:
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3, 4)):
        raise InvalidInputError(
            f"Expected an image of shape HxW, HxWx3 or HxWx4, got shape {image.shape}. "
            "For stacks, pass one plane at a time."
        )
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InvalidInputError(f"The image is empty (shape {image.shape}).")
    if image.dtype.kind not in "biuf":
        raise InvalidInputError(f"Unsupported image dtype {image.dtype}; use an integer, float or bool image.")


def _scale_to_uint8(image: np.ndarray, contrast_limits: ContrastLimits | None) -> np.ndarray:
    if image.dtype == np.bool_:
        return image.astype(np.uint8) * 255
    if image.dtype.kind == "f" and not np.isfinite(image).all():
        raise InvalidInputError("The image contains NaN or infinite values; replace them before segmenting.")
    if image.dtype == np.uint8 and contrast_limits is None:
        return image
    lo, hi = contrast_limits if contrast_limits is not None else (image.min(), image.max())
    lo, hi = float(lo), float(hi)
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi < lo:
        raise InvalidInputError(f"Invalid contrast limits ({lo}, {hi}).")
    if hi == lo:
        return np.zeros(image.shape, np.uint8)
    scaled = (image.astype(np.float32) - np.float32(lo)) * np.float32(255.0 / (hi - lo))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def resize_square(rgb: np.ndarray, size: int) -> np.ndarray:
    """Resize an HxWx3 uint8 image to size x size, ignoring the aspect ratio (SAM2's transform).

    Each channel is resized in float with Pillow's antialiased bilinear filter, which is the
    filter torchvision's `Resize(antialias=True)` reproduces, and rounded once at the end.
    """
    if rgb.shape[:2] == (size, size):
        return rgb
    channels = [
        np.asarray(Image.fromarray(rgb[..., c].astype(np.float32)).resize((size, size), Image.BILINEAR))
        for c in range(rgb.shape[2])
    ]
    return np.clip(np.rint(np.stack(channels, axis=-1)), 0, 255).astype(np.uint8)


def model_input(image: np.ndarray, size: int, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """What the encoder gets for a user's image: RGB uint8 (see `to_rgb_uint8`), size x size."""
    return resize_square(to_rgb_uint8(image, contrast_limits), size)
