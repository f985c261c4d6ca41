"""Turn the arrays users have into the uint8 images SAM encoders are sent.

Conversion rules (documented in the README):
- uint8 is used as is; bool becomes 0/255;
- any other dtype (uint16, int, float) is scaled linearly from `contrast_limits` (default: the
  image's min and max) to 0..255 and clipped, the way a viewer shows it;
- grayscale (HxW or HxWx1) stays one channel (the encoder repeats it to RGB), RGBA drops alpha.

Planes of any size are converted without full-size float copies: scaling runs in blocks of rows
and resizing works on uint8 (memory stays near one uint8 plane).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .errors import InvalidInputError
from .registry import ModelSpec

ContrastLimits = tuple[float, float]
_BLOCK_PIXELS = 2**22  # rows scaled per step: about 16 MiB of float32


def to_uint8(image: np.ndarray, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """Validate `image` (HxW, HxWx1, HxWx3 or HxWx4) and return it as HxW or HxWx3 uint8."""
    image = np.asarray(image)
    _check_shape(image)
    if image.ndim == 3:
        image = image[..., :3] if image.shape[2] >= 3 else image[..., 0]
    return _scale_to_uint8(image, contrast_limits)


def _check_shape(image: np.ndarray) -> None:
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3, 4)):
        raise InvalidInputError(
            f"Expected an image of shape HxW, HxWx3 or HxWx4, got shape {image.shape}. For stacks, pass one plane at a time."
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
    out = np.zeros(image.shape, np.uint8)
    if hi == lo:
        return out
    rows = max(1, _BLOCK_PIXELS // max(1, image[0].size))
    for start in range(0, image.shape[0], rows):
        block = (image[start : start + rows].astype(np.float32) - np.float32(lo)) * np.float32(255.0 / (hi - lo))
        np.clip(np.rint(block, out=block), 0, 255, out=block)
        out[start : start + rows] = block
    return out


def resize_uint8(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize an HxW or HxWx3 uint8 image with Pillow's antialiased bilinear filter on uint8 data.

    This is SAM1's `ResizeLongestSide.apply_image` (torchvision's resize of a PIL image), rounding
    included; each channel of an RGB image is resized independently, so grayscale may stay one channel.
    """
    if image.shape[:2] == (height, width):
        return image
    return np.asarray(Image.fromarray(np.ascontiguousarray(image)).resize((width, height), Image.BILINEAR))


def encoder_input(image: np.ndarray, spec: ModelSpec, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """What `spec`'s encoder gets for a user's image: uint8 [h, w, C] of size `spec.sent_hw`, C = 1
    for grayscale (the encoder repeats it to RGB: a third of the bytes) or 3.

    SAM2/SAM3 get the plane as it is and resize it on the server's device in float, as their
    official predictors do; only sides over `spec.max_sent_side` are first reduced here (Pillow's
    antialiased bilinear filter on uint8). SAM1 gets its `ResizeLongestSide` image made here, from
    uint8, as the official transform does (exact).
    """
    plane = to_uint8(image, contrast_limits)
    plane = resize_uint8(plane, *spec.sent_hw(plane.shape[:2]))
    return plane[..., None] if plane.ndim == 2 else plane
