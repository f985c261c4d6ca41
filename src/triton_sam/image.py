"""Turn the arrays users have into the RGB uint8 images SAM models are fed.

Conversion rules (documented in the README):
- uint8 is used as is; bool becomes 0/255;
- any other dtype (uint16, int, float) is scaled linearly from `contrast_limits` (default: the
  image's min and max) to 0..255 and clipped, the way a viewer shows it;
- grayscale (HxW or HxWx1) is repeated to 3 channels, RGBA drops alpha.

Planes of any size are converted without full-size float copies: scaling runs in blocks of rows,
and planes over `LARGE_PLANE_PIXELS` are resized from uint8 (memory stays near one uint8 plane).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .contract import encoder_input_dtype
from .errors import InvalidInputError
from .registry import STRETCH, ModelSpec

ContrastLimits = tuple[float, float]
# Above this many pixels a channel is resized from uint8 (Pillow rounds between its two passes,
# at most one grey level away) instead of from a float copy four times its size.
LARGE_PLANE_PIXELS = 4096 * 4096
_BLOCK_PIXELS = 2**22  # rows scaled per step: about 16 MiB of float32


def to_uint8(image: np.ndarray, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """Validate `image` (HxW, HxWx1, HxWx3 or HxWx4) and return it as HxW or HxWx3 uint8."""
    image = np.asarray(image)
    _check_shape(image)
    if image.ndim == 3:
        image = image[..., :3] if image.shape[2] >= 3 else image[..., 0]
    return _scale_to_uint8(image, contrast_limits)


def to_rgb_uint8(image: np.ndarray, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """`to_uint8`, with grayscale repeated to three channels: HxWx3 uint8."""
    return _as_rgb(to_uint8(image, contrast_limits))


def _as_rgb(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image)


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
    out = np.zeros(image.shape, np.uint8)
    if hi == lo:
        return out
    rows = max(1, _BLOCK_PIXELS // max(1, image[0].size))
    for start in range(0, image.shape[0], rows):
        block = (image[start : start + rows].astype(np.float32) - np.float32(lo)) * np.float32(255.0 / (hi - lo))
        np.clip(np.rint(block, out=block), 0, 255, out=block)
        out[start : start + rows] = block
    return out


def _resize_channel(channel: np.ndarray, size: int) -> np.ndarray:
    """One uint8 channel to size x size with Pillow's antialiased bilinear filter, as float32."""
    if channel.size > LARGE_PLANE_PIXELS:
        return np.asarray(Image.fromarray(np.ascontiguousarray(channel)).resize((size, size), Image.BILINEAR), np.float32)
    return np.asarray(Image.fromarray(channel.astype(np.float32)).resize((size, size), Image.BILINEAR))


def resize_square(image: np.ndarray, size: int, steps: int = 1) -> np.ndarray:
    """Resize an HxW or HxWxC uint8 image to size x size, ignoring the aspect ratio (SAM2's transform).

    Each channel is resized in float with Pillow's antialiased bilinear filter, which is the
    filter torchvision's `Resize(antialias=True)` reproduces, and rounded once at the end: to
    whole grey levels (uint8), or with `steps` > 1 to 1/`steps` of one (int16).
    """
    dtype = np.dtype(encoder_input_dtype(steps)).type
    if image.shape[:2] == (size, size):
        return image if steps == 1 else image.astype(dtype) * dtype(steps)
    channels = [image] if image.ndim == 2 else [image[..., c] for c in range(image.shape[2])]
    resized = np.stack([_resize_channel(c, size) for c in channels], axis=-1)
    out = np.clip(np.rint(resized * np.float32(steps)), 0, 255 * steps).astype(dtype)
    return out[..., 0] if image.ndim == 2 else out


def resize_uint8(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize an HxW or HxWx3 uint8 image with Pillow's antialiased bilinear filter on uint8 data.

    This is SAM1's `ResizeLongestSide.apply_image` (torchvision's resize of a PIL image), rounding
    included; each channel of an RGB image is resized independently, so grayscale may go first.
    """
    if image.shape[:2] == (height, width):
        return image
    return np.asarray(Image.fromarray(np.ascontiguousarray(image)).resize((width, height), Image.BILINEAR))


def model_input(
    image: np.ndarray, size: int, contrast_limits: ContrastLimits | None = None, steps: int = 1
) -> np.ndarray:
    """What a SAM2 encoder gets for a user's image: RGB (see `to_rgb_uint8`), size x size, in
    whole grey levels or 1/`steps` of one (`resize_square`).

    Grayscale is resized before it is repeated to RGB: a third of the work and memory.
    """
    return _as_rgb(resize_square(to_uint8(image, contrast_limits), size, steps))


def encoder_input(image: np.ndarray, spec: ModelSpec, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """What `spec`'s encoder gets: stretched to a square (SAM2, `model_input`), or resized to
    `spec.input_hw` from uint8 as SAM1's `ResizeLongestSide` does (the encoder pads)."""
    if spec.resize == STRETCH:
        return model_input(image, spec.input_size, contrast_limits, spec.input_steps)
    plane = to_uint8(image, contrast_limits)
    return _as_rgb(resize_uint8(plane, *spec.input_hw(plane.shape[:2])))
