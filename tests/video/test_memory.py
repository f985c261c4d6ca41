"""Which memories and object pointers a plane attends to, as `SAM2Base._prepare_memory_conditioned_features`
chooses them, and the bfloat16 rounding of stored memories."""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.server.models.triton_sam_video import to_bfloat16
from triton_sam.video.memory import FrameOutput, ObjectTrack, VideoSettings, memory_inputs, select_cond_frames

SETTINGS = VideoSettings(
    image_size=1024,
    num_maskmem=7,
    memory_temporal_stride_for_eval=1,
    max_cond_frames_in_attn=-1,
    max_obj_ptrs_in_encoder=16,
    only_obj_ptrs_in_the_past_for_eval=True,
    use_signed_tpos_enc_to_obj_ptrs=True,
    multimask_output_in_sam=True,
    multimask_output_for_tracking=True,
    multimask_min_pt_num=0,
    multimask_max_pt_num=1,
    binarize_mask_from_pts_for_mem_enc=True,
    use_mask_input_as_output_without_sam=True,
    fill_hole_area=8,
    non_overlap_masks=False,
    clear_non_cond_mem_around_input=False,
    add_all_frames_to_correct_as_cond=False,
)


def _output(plane: int) -> FrameOutput:
    """An output whose memory and pointer hold its plane number, so the choice can be read back."""
    return FrameOutput(
        pred_masks=np.zeros((1, 1, 4, 4), np.float32),
        obj_ptr=np.full(8, plane, np.float32),
        object_score_logits=np.ones((1, 1), np.float32),
        memory=np.full((1, 2, 3, 3), plane, np.float32),
    )


def _track(cond: list[int], non_cond: list[int]) -> ObjectTrack:
    return ObjectTrack(cond={t: _output(t) for t in cond}, non_cond={t: _output(t) for t in non_cond})


def _chosen(inputs) -> tuple[list, list, list, list]:
    return (
        [int(m[0, 0, 0, 0]) for m in inputs.memories],
        inputs.memory_tpos.tolist(),
        [int(p[0]) for p in inputs.obj_ptrs],
        np.round(inputs.obj_ptr_tpos * 15).astype(int).tolist(),
    )


def test_a_plane_attends_to_the_prompted_plane_and_the_six_before_it():
    track = _track(cond=[2], non_cond=list(range(3, 12)))
    memories, tpos, pointers, distances = _chosen(memory_inputs(track, 12, False, 30, SETTINGS))
    assert memories == [2, 6, 7, 8, 9, 10, 11]
    assert tpos == [6, 5, 4, 3, 2, 1, 0]  # the conditioning plane first, then the oldest
    assert pointers == [2, 11, 10, 9, 8, 7, 6, 5, 4, 3]
    assert distances == [10, 1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_in_reverse_the_memories_come_from_later_planes_and_future_prompts_give_no_pointer():
    track = _track(cond=[3, 20], non_cond=[17, 18, 19])
    memories, tpos, pointers, distances = _chosen(memory_inputs(track, 16, True, 30, SETTINGS))
    assert memories == [3, 20, 19, 18, 17]  # both prompted planes, then the planes after 16
    assert tpos == [6, 6, 2, 1, 0]
    assert pointers == [20, 17, 18, 19]  # plane 3 lies behind the tracking direction
    assert distances == [4, 1, 2, 3]  # signed: positive along the direction of tracking


def test_pointers_stop_at_the_stack_and_short_stacks_scale_their_distances():
    track = _track(cond=[0], non_cond=[1, 2])
    inputs = memory_inputs(track, 3, False, 4, SETTINGS)
    assert [int(p[0]) for p in inputs.obj_ptrs] == [0, 2, 1]
    np.testing.assert_allclose(inputs.obj_ptr_tpos, [3 / 3, 1 / 3, 2 / 3])  # max distance: planes - 1


def test_a_plane_takes_the_pointers_of_at_most_15_planes_before_it():
    track = _track(cond=[0], non_cond=list(range(1, 20)))
    memories, _, pointers, distances = _chosen(memory_inputs(track, 20, False, 30, SETTINGS))
    assert memories == [0, 14, 15, 16, 17, 18, 19]
    assert pointers == [0, *range(19, 4, -1)]  # planes 1-4 lie beyond max_obj_ptrs_in_encoder - 1
    assert distances == [20, *range(1, 16)]  # scaled by that limit, not by the stack's 30 planes


def test_a_plane_before_every_prompt_attends_with_no_pointer():
    inputs = memory_inputs(_track(cond=[8], non_cond=[]), 2, False, 10, SETTINGS)
    assert inputs.obj_ptrs.shape == (0, 8) and inputs.obj_ptr_tpos.shape == (0,)
    assert [int(m[0, 0, 0, 0]) for m in inputs.memories] == [8]


def test_at_most_the_closest_prompted_planes_are_selected():
    cond = {t: _output(t) for t in (0, 4, 9, 20)}
    selected, unselected = select_cond_frames(10, cond, 3)
    assert sorted(selected) == [4, 9, 20] and sorted(unselected) == [0]
    assert select_cond_frames(10, cond, -1) == (cond, {})


def test_an_unselected_prompted_plane_still_serves_as_a_recent_memory():
    settings = VideoSettings(**{**SETTINGS.__dict__, "max_cond_frames_in_attn": 2})
    track = _track(cond=[4, 9, 12], non_cond=[8])
    memories, tpos, pointers, _ = _chosen(memory_inputs(track, 10, False, 20, settings))
    assert memories == [9, 12, 4, 8]  # 4 is not among the 2 closest prompts, but 6 planes back
    assert tpos == [6, 6, 5, 1]
    assert pointers == [9, 8, 4]  # 12 lies ahead; 4 as a recent plane


@pytest.mark.parametrize(
    ("value", "rounded"),
    [
        (1.0, 1.0),
        (1 + 2**-8, 1.0),  # halfway: to the even neighbour
        (1 + 3 * 2**-8, 1 + 2**-6),  # halfway: to the even neighbour, upwards
        (1 + 2**-8 + 2**-20, 1 + 2**-7),  # above halfway
        (-3.0000001, -3.0),
    ],
)
def test_memories_are_rounded_to_bfloat16_to_nearest_even(value, rounded):
    assert to_bfloat16(np.array([value], np.float32))[0] == np.float32(rounded)


def test_bfloat16_rounding_equals_torch():
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100
    expected = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(to_bfloat16(values), expected)
