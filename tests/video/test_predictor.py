"""`VolumePredictor` against the official `SAM2VideoPredictor`, same random-init weights (SAM2.1 tiny):
the same prompts on the same stack must give the same masks on every plane, forwards and
backwards, and the same object scores. Also what it does with bad input.

The official predictor reads frames from JPEG files; both are given the same planes instead
(`bench.fixtures.official_volume_state`). Where sam2's CUDA extension is missing (here), the
official predictor skips its hole filling, so ours is compared with it off too.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import PARITY_SEED, require_export_extra
from triton_sam.bench.fixtures import bench_volume, official_video_predictor, official_volume_state
from triton_sam.bench.parity import mask_iou
from triton_sam.errors import InvalidInputError
from triton_sam.video import VolumePredictor

MODEL = "sam2.1_hiera_tiny"
MIN_IOU = 0.99
SCORE_TOL = 1e-3
SHAPE = (240, 320)


def _official_fills_holes() -> bool:
    try:
        from sam2 import _C  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def repository(exported_repository):
    return exported_repository(MODEL)


@pytest.fixture(scope="module")
def predictors(repository):
    require_export_extra()
    import torch

    torch.set_grad_enabled(False)
    reference = official_video_predictor(MODEL, PARITY_SEED)
    with VolumePredictor(MODEL, repository, fill_hole_area=None if _official_fills_holes() else 0) as ours:
        yield ours, reference


def _check_plane(ours, state, reference, ref_state, frame, masks, ref_masks) -> None:
    """Masks of every object on `frame` and their object scores equal the official ones."""
    ref_masks = ref_masks.numpy()
    assert masks.shape == ref_masks.shape == (len(state.obj_ids), 1, *SHAPE)
    for obj, (mask, ref_mask) in enumerate(zip(masks, ref_masks)):
        iou = mask_iou(mask[0] > 0, ref_mask[0] > 0)
        assert iou >= MIN_IOU, f"plane {frame}, object {state.obj_ids[obj]}: IoU {iou:.4f}"
        track = state.tracks[obj]
        ours_out = next(
            (o[frame] for o in (track.temp_cond, track.temp_non_cond, track.cond, track.non_cond) if frame in o), None
        )
        ref_out = _official_latest(ref_state, obj, frame)
        if ours_out is None or ref_out is None:  # not prompted nor tracked there yet: absent
            assert ours_out is None and ref_out is None and np.all(mask <= 0)
            continue
        score, ref_score = ours_out.object_score_logits.item(), ref_out["object_score_logits"].item()
        assert abs(score - ref_score) <= SCORE_TOL, f"plane {frame}: object score {score} vs {ref_score}"


def _official_latest(ref_state: dict, obj: int, frame: int) -> dict | None:
    """The official state's newest output of object `obj` on `frame` (prompted ones first)."""
    for outputs in (ref_state["temp_output_dict_per_obj"][obj], ref_state["output_dict_per_obj"][obj]):
        for key in ("cond_frame_outputs", "non_cond_frame_outputs"):
            if frame in outputs[key]:
                return outputs[key][frame]
    return None


def _propagate_both(ours, state, reference, ref_state, **options) -> list[int]:
    ours_planes = list(ours.propagate_in_video(state, **options))
    ref_planes = list(reference.propagate_in_video(ref_state, **options))
    assert [p[0] for p in ours_planes] == [p[0] for p in ref_planes]
    for (frame, obj_ids, masks), (_, ref_ids, ref_masks) in zip(ours_planes, ref_planes):
        assert obj_ids == list(ref_ids)
        _check_plane(ours, state, reference, ref_state, frame, masks, ref_masks)
    return [p[0] for p in ours_planes]


@pytest.mark.parity
def test_an_object_clicked_on_the_middle_plane_is_tracked_through_20_planes_both_ways_as_officially(predictors):
    ours, reference = predictors
    volume = bench_volume(20, SHAPE)
    state = ours.init_state(volume)
    ref_state = official_volume_state(reference, volume, state.contrast_limits)
    h, w = SHAPE
    points, labels = [[0.45 * w, 0.45 * h], [0.1 * w, 0.9 * h]], [1, 0]
    frame, ids, masks = ours.add_new_points_or_box(state, 10, 1, points=points, labels=labels)
    _, _, ref_masks = reference.add_new_points_or_box(ref_state, 10, 1, points=points, labels=labels)
    _check_plane(ours, state, reference, ref_state, 10, masks, ref_masks)

    assert _propagate_both(ours, state, reference, ref_state) == list(range(10, 20))
    assert _propagate_both(ours, state, reference, ref_state, reverse=True) == list(range(10, -1, -1))


@pytest.mark.parity
def test_box_mask_and_correction_prompts_on_two_objects_give_the_official_masks(predictors):
    ours, reference = predictors
    volume = bench_volume(8, SHAPE, seed=1)
    state = ours.init_state(volume)
    ref_state = official_volume_state(reference, volume, state.contrast_limits)
    h, w = SHAPE
    box = [0.55 * w, 0.5 * h, 0.9 * w, 0.95 * h]
    yy, xx = np.mgrid[:h, :w]
    mask = (yy - 0.4 * h) ** 2 + (xx - 0.3 * w) ** 2 < (0.1 * h) ** 2
    for predictor, st in ((ours, state), (reference, ref_state)):
        predictor.add_new_points_or_box(st, 2, "box", box=box)
    _, _, masks = ours.add_new_mask(state, 3, "mask", mask)
    _, _, ref_masks = reference.add_new_mask(ref_state, 3, "mask", mask)
    _check_plane(ours, state, reference, ref_state, 3, masks, ref_masks)
    assert _propagate_both(ours, state, reference, ref_state, max_frame_num_to_track=3) == [2, 3, 4, 5]

    # A correction on a tracked plane (kept with the earlier prompts), then tracking back from it.
    correction = dict(points=[[0.7 * w, 0.6 * h]], labels=[0], clear_old_points=False)
    _, _, masks = ours.add_new_points_or_box(state, 5, "box", **correction)
    _, _, ref_masks = reference.add_new_points_or_box(ref_state, 5, "box", **correction)
    _check_plane(ours, state, reference, ref_state, 5, masks, ref_masks)
    assert _propagate_both(ours, state, reference, ref_state, start_frame_idx=5, max_frame_num_to_track=2, reverse=True) == [
        5,
        4,
        3,
    ]


def test_bad_prompts_are_refused_and_change_nothing(repository):
    require_export_extra()
    with VolumePredictor(MODEL, repository) as ours:
        state = ours.init_state(bench_volume(3, (64, 80)))
        with pytest.raises(InvalidInputError, match="no prompts|No object"):
            next(ours.propagate_in_video(state))
        with pytest.raises(InvalidInputError, match="not in this stack"):
            ours.add_new_points_or_box(state, 3, 1, points=[[10, 10]], labels=[1])
        with pytest.raises(InvalidInputError, match="outside|inside"):
            ours.add_new_points_or_box(state, 0, 1, points=[[500, 10]], labels=[1])
        with pytest.raises(InvalidInputError, match="box must come first"):
            ours.add_new_points_or_box(state, 0, 1, box=[1, 1, 20, 20], clear_old_points=False)
        with pytest.raises(InvalidInputError, match="one non-empty plane"):
            ours.add_new_mask(state, 0, 1, np.zeros((2, 64, 80), bool))
        assert state.obj_ids == [] and state.tracks == []
        with pytest.raises(InvalidInputError, match="stack of planes"):
            ours.init_state(np.zeros((64, 80), np.uint8))
