"""The images of a series: which files they are, in what order, and the shape of their labels.

TIFF is read with tifffile (scikit-image's own reader), PNG and JPEG with Pillow. Labels have the
image's shape less its colour samples: a plane (Y, X) for a grey or RGB image, (Z, Y, X) for a stack.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

from ..errors import InvalidInputError

SUFFIXES = (".tif", ".tiff", ".png", ".jpg", ".jpeg")
_LABEL_SUFFIX = ".labels.tif"  # a series' own label files, never taken for images (an output folder inside the images')
_PILLOW_MODES = {"L", "I;16", "I", "F", "RGB", "RGBA"}  # what `image.to_uint8` takes as Pillow gives it


def natural_key(name: str) -> list:
    """Sort key that orders "img2" before "img10", ignoring case."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", name)]


def is_image(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(SUFFIXES) and not name.endswith(_LABEL_SUFFIX) and not name.startswith(".")


def find_images(folder: Path) -> list[Path]:
    """The image files directly in `folder`, in natural order (sub-folders are not searched)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidInputError(f"{folder} is not a folder.")
    images = sorted((p for p in folder.iterdir() if p.is_file() and is_image(p)), key=lambda p: natural_key(p.name))
    if not images:
        raise InvalidInputError(f"{folder} holds no images ({', '.join(SUFFIXES)}); choose the folder that holds them.")
    return images


def label_shape(path: Path) -> tuple[int, ...]:
    """The shape of `path`'s labels, read from its header: (Y, X) for a plane, (Z, Y, X) for a stack."""
    try:
        if path.suffix.lower() in (".tif", ".tiff"):
            with tifffile.TiffFile(path) as tiff:
                series = tiff.series[0]
                shape = tuple(n for n, axis in zip(series.shape, series.axes) if axis != "S")
        else:
            with Image.open(path) as image:
                shape = (image.height, image.width)
    except (OSError, ValueError, IndexError, tifffile.TiffFileError) as error:
        raise InvalidInputError(f"{path} cannot be read as an image ({error}).") from error
    if len(shape) not in (2, 3) or 0 in shape:
        raise InvalidInputError(
            f"{path} has shape {shape} without its colour samples; a series takes planes (Y, X) and stacks (Z, Y, X): "
            "save one stack per file."
        )
    return shape


def read_image(path: Path) -> np.ndarray:
    """`path`'s pixels: (Y, X) or (Y, X, samples) for a plane, (Z, Y, X[, samples]) for a stack."""
    if path.suffix.lower() not in (".tif", ".tiff"):
        with Image.open(path) as image:
            return np.asarray(image if image.mode in _PILLOW_MODES else image.convert("RGB"))
    with tifffile.TiffFile(path) as tiff:
        series = tiff.series[0]
        pixels = series.asarray()
        if "S" in series.axes:  # samples last, as napari and `image.to_uint8` expect them
            pixels = np.moveaxis(pixels, series.axes.index("S"), -1)
    return pixels
