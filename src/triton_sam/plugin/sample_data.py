"""Sample images that work offline (they ship with scikit-image)."""

from __future__ import annotations

import numpy as np


def coins() -> list[tuple]:
    """A 2D grayscale image with many separate round objects."""
    from skimage import data

    return [(data.coins(), {"name": "coins"}, "image")]


def coins_stack(planes: int = 8) -> list[tuple]:
    """A 3D stack (ZYX) whose planes are the coins image shifted a little more each plane."""
    from skimage import data

    image = data.coins()
    stack = np.stack([np.roll(image, shift=4 * z, axis=1) for z in range(planes)])
    return [(stack, {"name": "coins stack"}, "image")]
