"""`VolumePredictor` against the official `SAM2VideoPredictor`, same random-init weights (SAM2.1 tiny):
the same prompts on the same stack must give the same masks on every plane, forwards and
backwards, and the same object scores. Also what it does with bad input, how it reads planes, and
how it sends them to a real Triton server that encodes several at a time.

A scenario (prompts, then propagations) runs once with the official predictor per test module,
then with ours locally (see `ours` for the server's side). The official predictor reads frames
from JPEG files; both are given the same planes instead (`bench.fixtures.official_volume_state`).
Where sam2's CUDA extension is missing (here), the official predictor skips its hole filling, so
ours is compared with it off too.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fixtures import bench_volume, official_fills_holes, official_video_predictor, official_volume_state
from benchmarks.parity import mask_iou
from conftest import PARITY_SEED, release_memory, require_export_extra
from synthetic import ReadLog, SlowReads, slow_encodes
from triton_sam.errors import InvalidInputError
from triton_sam.video import VolumePredictor

MODEL = "sam2.1_hiera_tiny"
MIN_IOU = 0.99
SCORE_TOL = 1e-3
SHAPE = (240, 320)
H, W = SHAPE
_DISK = (0.42 * H, 0.33 * W, 0.1 * H)

# Steps: ("points" | "mask", plane, object, keywords) or ("propagate", keywords).
# Which memories and pointers a plane attends to is test_memory.py's (the windows, their limits, each
# direction); here the graphs must compute with the fullest of them as the official predictor does.
# 9 planes clicked on plane 7 are the fewest where a plane attends to all 7 memories SAM2.1 keeps
# with one more left out: plane 0 backwards, its 6 nearest planes' and the prompted plane's, the
# forward pass's plane 8 left out as a memory yet among its 8 object pointers (the whole stack).
# The 20 planes of the other scenario scale pointer distances by the model's limit (16), not the stack.
SCENARIOS = {
    "one object clicked on plane 7 of 9, tracked both ways": (
        9,
        0,
        [
            ("points", 7, 1, dict(points=[[0.45 * W, 0.45 * H], [0.1 * W, 0.9 * H]], labels=[1, 0])),
            ("propagate", {}),
            ("propagate", dict(reverse=True)),
        ],
    ),
    "a box and a mask on two planes of 20, then a correction and tracking back from it": (
        20,
        1,
        [
            ("points", 8, "box", dict(box=[0.55 * W, 0.5 * H, 0.9 * W, 0.95 * H])),
            ("mask", 9, "mask", None),
            ("propagate", dict(max_frame_num_to_track=3)),
            ("points", 11, "box", dict(points=[[0.7 * W, 0.6 * H]], labels=[0], clear_old_points=False)),
            ("propagate", dict(start_frame_idx=11, max_frame_num_to_track=2, reverse=True)),
        ],
    ),
}


def _disk_mask() -> np.ndarray:
    yy, xx = np.mgrid[:H, :W]
    cy, cx, r = _DISK
    return (yy - cy) ** 2 + (xx - cx) ** 2 < r**2


def _official_score(state: dict, obj: int, frame: int) -> float | None:
    """The official state's newest object score of object `obj` on `frame` (prompted ones first)."""
    for outputs in (state["temp_output_dict_per_obj"][obj], state["output_dict_per_obj"][obj]):
        for key in ("cond_frame_outputs", "non_cond_frame_outputs"):
            if frame in outputs[key]:
                return outputs[key][frame]["object_score_logits"].item()
    return None


def _our_score(state, obj: int, frame: int) -> float | None:
    track = state.tracks[obj]
    for outputs in (track.temp_cond, track.temp_non_cond, track.cond, track.non_cond):
        if frame in outputs:
            return outputs[frame].object_score_logits.item()
    return None


def _run(steps, predictor, state, score, to_numpy) -> list[tuple]:
    """(frame, object ids, mask logits, object scores) after each prompt and each propagated plane."""
    records = []

    def record(frame, obj_ids, masks) -> None:
        records.append((frame, list(obj_ids), to_numpy(masks), [score(state, i, frame) for i in range(len(obj_ids))]))

    for kind, *args in steps:
        if kind == "points":
            frame, obj, options = args
            record(*predictor.add_new_points_or_box(state, frame, obj, **options))
        elif kind == "mask":
            frame, obj, _ = args
            record(*predictor.add_new_mask(state, frame, obj, _disk_mask()))
        else:
            for result in predictor.propagate_in_video(state, **args[0]):
                record(*result)
    return records


def _keeping_every_plane_s_features(reference) -> dict:
    """Make the official predictor keep the image features of every plane it encodes, not only of
    the last one (its `_get_image_feature`: "we can use an LRU cache for more frames in the
    future"), so that a plane it comes back to (a prompted plane, then tracked; a corrected one,
    then tracked back) is encoded once: the same features, half a minute less. The features by
    plane (the plane's image held, so its address names it alone); clear them with the state."""
    encode, kept = reference.forward_image, {}

    def forward_image(image):
        if image.data_ptr() not in kept:
            kept[image.data_ptr()] = image, encode(image)
        return kept[image.data_ptr()][1]

    reference.forward_image = forward_image
    return kept


@pytest.fixture(scope="module")
def official_records():
    """The official predictor's records of each scenario, computed once."""
    require_export_extra()
    import torch

    torch.set_grad_enabled(False)
    reference = official_video_predictor(MODEL, PARITY_SEED)
    features = _keeping_every_plane_s_features(reference)
    cache = {}

    def records(name: str, contrast_limits) -> list[tuple]:
        if name not in cache:
            planes, seed, steps = SCENARIOS[name]
            state = official_volume_state(reference, bench_volume(planes, SHAPE, seed), contrast_limits)
            cache[name] = _run(steps, reference, state, _official_score, lambda masks: masks.numpy())
            del state
            features.clear()
            release_memory()  # the official state's planes, features and memories
        return cache[name]

    return records


# Locally: the server runs the same graphs (`VideoGraphs`) on the memories its handles name, which
# tests/server/test_python_model.py checks request by request against `LocalVideo` (remember, track
# with memories and pointers, take a mask as the object's); the windows, pointers and corrections
# are the client's, the same code for either backend; and Triton's path end to end is
# test_backends.py's and the batched test below (a third official comparison cost ~95 s of CI).
@pytest.fixture
def ours(exported_repository):
    require_export_extra()
    fill = None if official_fills_holes() else 0
    with VolumePredictor(MODEL, fill_hole_area=fill, model_repository=exported_repository(MODEL)) as predictor:
        yield predictor
    release_memory()  # its ORT sessions' buffers and the planes' features


@pytest.mark.parity
@pytest.mark.parametrize("name", SCENARIOS)
def test_every_plane_gets_the_official_masks_and_object_scores(name, ours, official_records):
    planes, seed, steps = SCENARIOS[name]
    state = ours.init_state(bench_volume(planes, SHAPE, seed))
    records = _run(steps, ours, state, _our_score, lambda masks: masks)
    expected = official_records(name, state.contrast_limits)
    assert [r[0] for r in records] == [r[0] for r in expected]  # the same planes in the same order
    for (frame, ids, masks, scores), (_, ref_ids, ref_masks, ref_scores) in zip(records, expected):
        assert ids == ref_ids and masks.shape == ref_masks.shape == (len(ids), 1, *SHAPE)
        for obj, (mask, ref_mask) in enumerate(zip(masks, ref_masks)):
            iou = mask_iou(mask[0] > 0, ref_mask[0] > 0)
            assert iou >= MIN_IOU, f"plane {frame}, object {ids[obj]}: IoU {iou:.4f}"
        for score, ref_score in zip(scores, ref_scores):
            assert (score is None) == (ref_score is None), f"plane {frame}: {scores} vs {ref_scores}"
            assert score is None or abs(score - ref_score) <= SCORE_TOL, f"plane {frame}: {scores} vs {ref_scores}"
    if name.startswith("one object"):
        assert len(records) == 1 + 2 + 8  # the prompt, planes 7..8, then 7..0


def test_bad_prompts_are_refused_and_change_nothing(exported_repository):
    require_export_extra()
    with VolumePredictor(MODEL, model_repository=exported_repository(MODEL)) as ours:
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
    with pytest.raises(InvalidInputError, match="SAM2.1 model"):
        VolumePredictor("mobile_sam", model_repository=exported_repository(MODEL))


def test_propagation_reads_each_plane_once_and_the_next_while_one_is_tracked(exported_repository, monkeypatch):
    """From slow storage (a zarr or dask stack; on a GPU server a read can take longer than an
    encode) each plane is read once for all objects, while the plane before it is encoded and
    tracked; a lazy stack's contrast limits are found a plane at a time."""
    require_export_extra()
    volume = bench_volume(4, (64, 80))
    with VolumePredictor(MODEL, model_repository=exported_repository(MODEL)) as ours:
        lazy = ReadLog(volume)  # no min(), as zarr
        assert ours.init_state(lazy).contrast_limits == (volume.min(), volume.max())
        assert sorted(lazy.reads) == [(z,) for z in range(4)]
        slow = SlowReads(volume, 0.2)
        state = ours.init_state(slow, contrast_limits=(0, 5000))
        ours.add_new_points_or_box(state, 0, 1, points=[[20, 20]], labels=[1])
        ours.add_new_points_or_box(state, 0, 2, points=[[60, 40]], labels=[1])
        slow.started.clear()
        encoded = slow_encodes(ours.engine, 0.2, monkeypatch)
        assert [frame for frame, _, _ in ours.propagate_in_video(state)] == list(range(4))
    assert sorted(key for key, _ in slow.started) == [(z,) for z in range(4)]  # plane 0 for its memories
    read = [slow.read_at((z,)) for z in range(1, 4)]
    assert len(encoded) == 3 and all(read[k + 1] < encoded[k] for k in range(2))


def test_through_a_server_that_encodes_planes_together_they_go_there_that_many_at_a_time(request, monkeypatch):
    """Propagating through a server that encodes several images in one run (a GPU server's
    `encode_batch`), the planes to track go there that many to a request, each plane once; the
    masks are those of planes sent one by one."""
    require_export_extra()
    volume = bench_volume(4, (64, 80))  # plane 0 prompted, then a batch of 2 and the 1 left
    url = request.getfixturevalue("models_server").grpc_url
    masks, batches = {}, []

    def counted(encode_many):
        return lambda images: batches.append(len(images)) or encode_many(images)

    for together in (False, True):
        with VolumePredictor(MODEL, backend="triton", url=url) as ours:
            if together:
                monkeypatch.setattr(ours.engine, "encode_batch", 2, raising=False)
                monkeypatch.setattr(ours.engine, "encode_many", counted(ours.engine.encode_many))
            state = ours.init_state(volume)
            ours.add_new_points_or_box(state, 0, 1, points=[[20, 20]], labels=[1])
            masks[together] = {frame: logits > 0 for frame, _, logits in ours.propagate_in_video(state)}
    assert batches == [1, 2, 1]  # plane 0 once (its prompt and its memory: cached), then planes 1-2, then 3
    assert sorted(masks[True]) == list(range(4))
    for frame, mask in masks[False].items():
        np.testing.assert_array_equal(masks[True][frame], mask)
