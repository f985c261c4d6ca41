"""What a decode request asks of the session model (`python_model.py`, written as `model.py`) and
how its answer is shaped: the decoder outputs it needs, its crop thresholds, which masks it gets
and their crops, and its rows put back in order after a run on each device holding some of them.
Written next to `model.py`; numpy and Triton's `triton_python_backend_utils` only.
"""

import numpy as np
import triton_python_backend_utils as pb_utils
import triton_sam_contract as contract
from triton_sam_arrays import crop_box

CROPS = {contract.SINGLE_MASK: contract.SINGLE_MASK_CROP, contract.MULTI_MASKS: contract.MULTI_MASK_CROP}  # output -> its crop


def decoder_outputs(request, cropped: bool, best: bool) -> list:
    """The decoder's outputs a decode request needs: those it asks for (all if none), the masks
    whose crop it asks for where it is `cropped` (it sends a crop threshold), and the multimask
    candidates in place of the single mask where it wants the `best` of them."""
    requested = request.requested_output_names()
    wanted = [name for name in contract.DECODER_OUTPUTS if name in requested]
    if cropped:
        wanted += [name for name, crop in CROPS.items() if crop in requested and name not in wanted]
    wanted = wanted or list(contract.DECODER_OUTPUTS)
    if best:
        wanted = [n for n in wanted if n not in (contract.SINGLE_MASK, contract.SINGLE_SCORE)]
        wanted += [n for n in (contract.MULTI_MASKS, contract.MULTI_SCORES) if n not in wanted]
    return wanted


def crop_threshold(request, batch: int):
    """The request's crop threshold per row ([B] float32), None if it sends none (then it gets no
    crop: Triton lists every output as requested when a client names none)."""
    tensor = pb_utils.get_input_tensor_by_name(request, contract.CROP_THRESHOLD)
    if tensor is None:
        return None
    thresholds = tensor.as_numpy().astype(np.float32).reshape(-1)
    if thresholds.shape != (batch,) or not np.isfinite(thresholds).all():
        raise ValueError(
            f"'{contract.CROP_THRESHOLD}' must be one finite number per prompt set, got {list(tensor.as_numpy().shape)}"
        )
    return thresholds


def answered_masks(request) -> str:
    """The decoder output whose masks a decode request gets, whole or cropped: the candidates where
    it asks for them (or for nothing in particular), else the single mask."""
    requested = request.requested_output_names()
    return (
        contract.SINGLE_MASK
        if requested and contract.MULTI_MASKS not in requested and contract.MULTI_MASK_CROP not in requested
        else contract.MULTI_MASKS
    )


def cropped_above(arrays: dict, thresholds: np.ndarray, requested) -> dict:
    """The `requested` crops of the decoder's mask `arrays` ([B, C, S, S]): cut to the samples above
    each row's threshold, grown by `contract.CROP_MARGIN` (one box for the batch and every mask;
    `triton_sam_arrays.crop_box`), and that box per row."""
    masks = {name: arrays[name] for name, crop in CROPS.items() if crop in requested and name in arrays}
    if not masks:
        return {}
    y0, x0, y1, x1 = crop_box(list(masks.values()), thresholds, contract.CROP_MARGIN)
    crops = {CROPS[name]: np.ascontiguousarray(logits[:, :, y0:y1, x0:x1]) for name, logits in masks.items()}
    return {**crops, contract.CROP_BOX: np.tile(np.array([y0, x0, y1, x1], np.int32), (len(thresholds), 1))}


def taken(array: np.ndarray, positions: list) -> np.ndarray:
    """The rows of `array` at `positions` (ascending); all of them as they are."""
    return array if len(positions) == len(array) else array[positions]


def in_row_order(pieces: list) -> dict:
    """A request's outputs by name from its pieces ((row positions, outputs) on each device holding
    some of its rows), rows in the request's order."""
    if len(pieces) == 1:
        return pieces[0][1]
    order = np.argsort(np.concatenate([positions for positions, _ in pieces]))
    return {name: np.concatenate([arrays[name] for _, arrays in pieces])[order] for name in pieces[0][1]}
