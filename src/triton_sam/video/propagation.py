"""Objects' masks on one plane, tracked through the stack: what the napari panel's Propagate does."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping

import numpy as np

from .predictor import VolumePredictor, VolumeState

FORWARDS, BACKWARDS, BOTH = "forwards", "backwards", "both"
DIRECTIONS = {FORWARDS: (False,), BACKWARDS: (True,), BOTH: (False, True)}


def propagate_masks(
    predictor: VolumePredictor,
    state: VolumeState,
    frame: int,
    masks: Mapping[Hashable, np.ndarray],
    direction: str = BOTH,
    max_planes: int | None = None,
) -> Iterator[tuple[int, dict[Hashable, np.ndarray]]]:
    """Take each of `masks` (object id -> H x W bool) as its object's mask on `frame` and track them
    `direction` for up to `max_planes` planes (None: to the end of the stack); yields (plane,
    {object id: boolean mask}) as each plane is done, each pixel given to the object whose logit
    is highest there (above 0), so the masks of a plane never overlap.

    An object is left out on planes where it has prompts (`frame`, and earlier corrections): there
    the user's mask stands. Prompts from earlier calls stay, so a corrected plane guides the next
    run. Every object in `state` is tracked (as the official `propagate_in_video` does): give the
    objects a state of their own to track them alone.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {sorted(DIRECTIONS)}, not {direction!r}")
    for obj_id, mask in masks.items():
        predictor.add_new_mask(state, frame, obj_id, mask)
    rows = {obj_id: state.obj_index(obj_id) for obj_id in masks}
    prompted = {obj_id: set(state.tracks[row].masks) | set(state.tracks[row].points) for obj_id, row in rows.items()}
    for reverse in DIRECTIONS[direction]:
        for plane, _, logits in predictor.propagate_in_video(state, frame, max_planes, reverse):
            best = np.argmax(logits[:, 0], axis=0)
            inside = np.max(logits[:, 0], axis=0) > 0
            tracked = {obj_id: inside & (best == row) for obj_id, row in rows.items() if plane not in prompted[obj_id]}
            if tracked:
                yield plane, tracked
