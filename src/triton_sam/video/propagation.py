"""One object's mask on one plane, tracked through the stack: what the napari panel's Propagate does."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .predictor import VolumePredictor, VolumeState

FORWARDS, BACKWARDS, BOTH = "forwards", "backwards", "both"
DIRECTIONS = {FORWARDS: (False,), BACKWARDS: (True,), BOTH: (False, True)}


def propagate_mask(
    predictor: VolumePredictor,
    state: VolumeState,
    frame: int,
    obj_id,
    mask: np.ndarray,
    direction: str = BOTH,
    max_planes: int | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """Take `mask` as `obj_id`'s mask on `frame` and track it `direction` for up to `max_planes`
    planes (None: to the end of the stack); yields (plane, boolean mask) as each plane is done.

    Planes where the object has prompts (`frame`, and earlier corrections) are not yielded: there
    the user's mask stands. Prompts from earlier calls stay, so a corrected plane guides the next run.
    Every object in `state` is tracked (as the official `propagate_in_video` does): give each
    object a state of its own to track it alone.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {sorted(DIRECTIONS)}, not {direction!r}")
    predictor.add_new_mask(state, frame, obj_id, mask)
    row = state.obj_index(obj_id)
    prompted = set(state.tracks[row].masks) | set(state.tracks[row].points)
    for reverse in DIRECTIONS[direction]:
        for plane, _, logits in predictor.propagate_in_video(state, frame, max_planes, reverse):
            if plane not in prompted:
                yield plane, logits[row, 0] > 0
