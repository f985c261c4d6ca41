"""The prompt tensors of a decode request to the session model, and a request of more prompt sets
than the server takes at once split into several."""

from __future__ import annotations

import numpy as np

from .. import contract
from ..prompts import DecodeRequest


def prompt_arrays(request: DecodeRequest) -> dict[str, np.ndarray]:
    """The prompt tensors of a request to the session model; the mask only when there is one."""
    arrays = {
        contract.POINT_COORDS: np.ascontiguousarray(request.point_coords, np.float32),
        contract.POINT_LABELS: np.ascontiguousarray(request.point_labels, np.int32),
    }
    if request.mask_input is not None:
        arrays[contract.MASK_INPUT] = np.ascontiguousarray(request.mask_input, np.float32)
    return arrays


def split_request(request: DecodeRequest, size: int | None) -> list[DecodeRequest]:
    """`request` as requests of at most `size` prompt sets (itself if it fits)."""
    if size is None or request.batch_size <= size:
        return [request]
    masks = request.mask_input
    return [
        DecodeRequest(
            point_coords=request.point_coords[start : start + size],
            point_labels=request.point_labels[start : start + size],
            mask_input=None if masks is None else masks[start : start + size],
            logits_above=request.logits_above,
            best_of_multimask=request.best_of_multimask,
        )
        for start in range(0, request.batch_size, size)
    ]
