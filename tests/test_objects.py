"""A committed object cut to its box: the same pixels of the plane, in a mask of the box's size."""

from __future__ import annotations

import numpy as np

from triton_sam.objects import Committed


def _placed(committed: Committed, shape: tuple[int, int]) -> np.ndarray:
    plane = np.zeros(shape, bool)
    (y, x), (h, w) = committed.offset, committed.mask.shape
    plane[y : y + h, x : x + w] = committed.mask
    return plane


def test_a_committed_object_cropped_to_its_box_covers_the_same_pixels_of_the_plane():
    mask = np.zeros((50, 60), bool)
    mask[10:20, 30:35] = True
    mask[25, 12] = True
    committed = Committed(None, mask, 3, {"model_id": "m"}, (100, 200))
    boxed = committed.cropped()
    assert boxed.offset == (110, 212) and boxed.mask.shape == (16, 23)
    assert (boxed.object_id, boxed.provenance) == (3, {"model_id": "m"})
    assert np.array_equal(_placed(boxed, (200, 300)), _placed(committed, (200, 300)))
    empty = Committed(None, np.zeros((4, 4), bool), 1)
    assert empty.cropped() is empty
