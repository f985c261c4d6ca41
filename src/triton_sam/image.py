"""Turn the arrays users have into the uint8 images SAM encoders are sent.

Conversion rules (documented in docs/python-api.md):
- uint8 is used as is; bool becomes 0/255;
- any other dtype (uint16, int, float) is scaled linearly from `contrast_limits` (default: the
  image's min and max) to 0..255 and clipped, the way a viewer shows it;
- grayscale (HxW or HxWx1) stays one channel (the encoder repeats it to RGB), RGBA drops alpha.

Planes of any size are converted without full-size float copies: scaling runs in blocks of rows
and resizing works on uint8 (memory stays near one uint8 plane). Windows of planes too large to
hold (a zoomed-out tile of a plane with no pyramid level to match) are reduced while they are read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from PIL import Image

from .errors import InvalidInputError
from .registry import ModelSpec

ContrastLimits = tuple[float, float]
_BLOCK_PIXELS = 2**22  # rows scaled per step: about 16 MiB of float32
_BAND_BYTES = 2**25  # a window reduced while read is read in bands of rows: about 32 MiB each, sums included


def to_uint8(image: np.ndarray, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """Validate `image` (HxW, HxWx1, HxWx3 or HxWx4) and return it as HxW or HxWx3 uint8."""
    return _scale_to_uint8(_channels(image), contrast_limits)


def stretch_channels(image: np.ndarray) -> np.ndarray:
    """micro-sam's normalisation (`micro_sam.util._to_image`): each channel's min..max stretched
    to 0..255 in float32 and truncated to uint8, whatever the dtype (uint8 too)."""
    plane = _channels(image).astype(np.float32)
    plane -= plane.min(axis=(0, 1))
    plane /= plane.max(axis=(0, 1)) + np.float32(1e-7)
    return (plane * 255).astype(np.uint8)


def _channels(image: np.ndarray) -> np.ndarray:
    """`image` validated, as HxW or HxWx3 (alpha dropped), in its own dtype."""
    image = np.asarray(image)
    _check_shape(image)
    if image.ndim == 3:
        image = image[..., :3] if image.shape[2] >= 3 else image[..., 0]
    return image


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


def read_window(array, y0: int, y1: int, x0: int, x1: int, max_side: int) -> np.ndarray:
    """`array[y0:y1, x0:x1]` as a numpy array (`array`: any array that slices: numpy, dask, zarr).
    A window with a side over `max_side` is read a band of rows at a time and reduced to the mean of
    each f x f block (f the smallest integer that brings both sides within `max_side`; the last
    blocks of a side may be smaller), in `array`'s dtype: memory stays near one band, not the window."""
    factor = -(-max(y1 - y0, x1 - x0) // max_side)
    if factor == 1:
        return np.asarray(array[y0:y1, x0:x1])
    dtype = np.dtype(array.dtype)
    values = (x1 - x0) * math.prod(array.shape[2:])  # in a row of the window
    band = max(1, _BAND_BYTES // (factor * values * dtype.itemsize + values * 8)) * factor  # rows read, their float64 sums
    out = np.empty((-(-(y1 - y0) // factor), -(-(x1 - x0) // factor), *array.shape[2:]), dtype)
    for y in range(y0, y1, band):
        means = _block_means(np.asarray(array[y : min(y + band, y1), x0:x1]), factor)
        row = (y - y0) // factor
        out[row : row + len(means)] = _rounded(means, dtype)
    return out


def _rounded(means: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Block means as `dtype` holds them: rounded for integers, set where mostly set for bool."""
    if dtype == np.bool_:
        return means >= 0.5
    return np.rint(means) if dtype.kind in "iu" else means


def _block_means(block: np.ndarray, factor: int) -> np.ndarray:
    """The mean of each `factor` x `factor` block of `block` (rows, columns, then any channels), float64."""
    rows, row_counts = _sum_rows(block, factor)
    sums, col_counts = _sum_rows(rows.swapaxes(0, 1), factor)
    counts = np.outer(row_counts, col_counts).reshape(len(row_counts), len(col_counts), *(1,) * (block.ndim - 2))
    return sums.swapaxes(0, 1) / counts


def _sum_rows(array: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """Sums (float64) of each `factor` consecutive rows of `array`, and how many rows each sums
    (`factor`, but fewer for the last when `factor` does not divide the rows)."""
    whole = array.shape[0] // factor * factor
    sums = array[:whole].reshape(whole // factor, factor, *array.shape[1:]).sum(axis=1, dtype=np.float64)
    counts = [factor] * (whole // factor)
    if whole < array.shape[0]:
        sums = np.concatenate([sums, array[whole:].sum(axis=0, dtype=np.float64, keepdims=True)])
        counts.append(array.shape[0] - whole)
    return sums, np.array(counts)


def encoder_input(image: np.ndarray, spec: ModelSpec, contrast_limits: ContrastLimits | None = None) -> np.ndarray:
    """What `spec`'s encoder gets for a user's image: uint8 [h, w, C] of size `spec.sent_hw`, C = 1
    for grayscale (the encoder repeats it to RGB: a third of the bytes) or 3.

    SAM2/SAM3 get the plane as it is and resize it on the server's device in float, as their
    official predictors do; only sides over `spec.max_sent_side` are first reduced here (Pillow's
    antialiased bilinear filter on uint8). SAM1 gets its `ResizeLongestSide` image made here, from
    uint8, as the official transform does (exact). micro-sam's models get the plane stretched as
    micro-sam stretches it (`stretch_channels`): the raw plane's, or the contrast-limited one's.
    """
    plane = to_uint8(image, contrast_limits)
    if spec.channel_stretch:
        plane = stretch_channels(image if contrast_limits is None else plane)
    plane = resize_uint8(plane, *spec.sent_hw(plane.shape[:2]))
    return plane[..., None] if plane.ndim == 2 else plane


class ArrayView:
    """`array[index]` read only when it is indexed further or converted (`index`: ints over the
    leading axes, or full slices to keep an axis). numpy and dask slice lazily themselves; zarr reads
    what it is indexed with at once, so `zarr_array[3]` would read a whole plane where one tile is
    needed, and `zarr_array[:, 3]` a whole stack where one plane is. Keys are basic: ints and slices
    (and one `...`), the first of them for the first kept axis."""

    def __init__(self, array, index: tuple) -> None:
        self.array, self.index = array, tuple(index)
        kept = [n for i, n in zip(self.index, array.shape) if isinstance(i, slice)]
        self.shape = (*kept, *array.shape[len(self.index) :])
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)

    def __getitem__(self, key):
        given = iter(_without_ellipsis(key if isinstance(key, tuple) else (key,), self.ndim))
        full = tuple(next(given, slice(None)) if isinstance(i, slice) else i for i in self.index)
        return self.array[full + tuple(given)]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self.array[self.index], dtype)


def lazy_index(array, index: tuple):
    """`array[index]` without reading it: a numpy view, else an `ArrayView`."""
    return array[index] if isinstance(array, np.ndarray) else ArrayView(array, index)


def _without_ellipsis(key: tuple, ndim: int) -> tuple:
    """`key` with its `...` (if any) spelt out as full slices."""
    at = next((i for i, k in enumerate(key) if k is Ellipsis), None)
    if at is None:
        return key
    return key[:at] + (slice(None),) * (ndim - len(key) + 1) + key[at + 1 :]


class ReadAhead:
    """Reads the next image (a tile, a plane; `read(key)`) on a worker thread while one is encoded:
    from a GPU server a read from disk, network storage or a dask graph can take longer than the encode."""

    def __init__(self, read: Callable[[Hashable], np.ndarray]) -> None:
        self._read = read
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="triton-sam-read-ahead")
        self._reads: dict[Hashable, Future] = {}

    def start(self, key: Hashable) -> None:
        """Begin reading `key` (unless it is being read)."""
        if key not in self._reads:
            self._reads[key] = self._pool.submit(self._read, key)

    def take(self, key: Hashable) -> np.ndarray:
        """What `key` reads: read ahead (waiting for the read to finish), or read now."""
        read = self._reads.pop(key, None)
        return self._read(key) if read is None else read.result()

    def in_batches(self, keys: Sequence[Hashable], size: int) -> Iterator[tuple[Sequence[Hashable], list[np.ndarray]]]:
        """`keys` `size` at a time, each batch with what it reads, the next batch's reads begun first."""
        batches = [keys[start : start + size] for start in range(0, len(keys), size)]
        for number, batch in enumerate(batches):
            for key in batches[number + 1] if number + 1 < len(batches) else ():
                self.start(key)
            yield batch, [self.take(key) for key in batch]

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *_) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)  # a read under way finishes: reads cannot be stopped
