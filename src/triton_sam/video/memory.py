"""A tracked object's memory bank and the memories a plane attends to, chosen as SAM2's video
predictor chooses them (`SAM2Base._prepare_memory_conditioned_features`).

Conditioning planes are those the user prompted; the others were reached by propagation. A plane
attends to every conditioning plane's mask memory, to the mask memories of the last
`num_maskmem - 1` planes before it (after it when tracking in reverse), and to the object
pointers of those planes and up to `max_obj_ptrs_in_encoder - 1` planes before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np


@dataclass(frozen=True)
class VideoSettings:
    """The official video predictor's settings, as the export wrote them (`video.json`)."""

    image_size: int
    num_maskmem: int
    memory_temporal_stride_for_eval: int
    max_cond_frames_in_attn: int
    max_obj_ptrs_in_encoder: int
    only_obj_ptrs_in_the_past_for_eval: bool
    use_signed_tpos_enc_to_obj_ptrs: bool
    multimask_output_in_sam: bool
    multimask_output_for_tracking: bool
    multimask_min_pt_num: int
    multimask_max_pt_num: int
    binarize_mask_from_pts_for_mem_enc: bool
    use_mask_input_as_output_without_sam: bool
    fill_hole_area: int
    non_overlap_masks: bool
    clear_non_cond_mem_around_input: bool
    add_all_frames_to_correct_as_cond: bool

    @classmethod
    def from_dict(cls, values: dict) -> VideoSettings:
        return cls(**{f.name: values[f.name] for f in fields(cls)})

    def use_multimask(self, is_init_cond_frame: bool, num_points: int) -> bool:
        """Whether the decoder's best of three masks is taken (`SAM2Base._use_multimask`)."""
        return (
            self.multimask_output_in_sam
            and (is_init_cond_frame or self.multimask_output_for_tracking)
            and self.multimask_min_pt_num <= num_points <= self.multimask_max_pt_num
        )


@dataclass
class FrameOutput:
    """What tracking an object on one plane left: its mask, pointer, score and mask memory."""

    pred_masks: np.ndarray  # float32 [1, 1, 256, 256] low-res logits (holes filled)
    obj_ptr: np.ndarray  # float32 [C]
    object_score_logits: np.ndarray  # float32 [1, 1]
    memory: Any = None  # its mask memory (an array, or a server's handle of one); None until encoded


@dataclass
class ObjectTrack:
    """One object's prompts and outputs per plane (the official `*_per_obj` entries)."""

    points: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # plane -> coords [1, P, 2], labels [1, P]
    masks: dict[int, np.ndarray] = field(default_factory=dict)  # plane -> mask prompt
    cond: dict[int, FrameOutput] = field(default_factory=dict)
    non_cond: dict[int, FrameOutput] = field(default_factory=dict)
    temp_cond: dict[int, FrameOutput] = field(default_factory=dict)  # prompted since the last propagation
    temp_non_cond: dict[int, FrameOutput] = field(default_factory=dict)
    tracked: dict[int, bool] = field(default_factory=dict)  # plane -> tracked in reverse

    def outputs(self, cond: bool) -> dict[int, FrameOutput]:
        return self.cond if cond else self.non_cond

    def temp(self, cond: bool) -> dict[int, FrameOutput]:
        return self.temp_cond if cond else self.temp_non_cond

    def latest(self, frame: int, cond: bool) -> FrameOutput | None:
        """The newest output on `frame`: a prompt's not yet propagated, else a conditioning, else any."""
        for outputs in (self.temp(cond), self.cond, self.non_cond):
            if frame in outputs:
                return outputs[frame]
        return None


@dataclass(frozen=True)
class MemoryInputs:
    """The memory attention graph's inputs for one plane."""

    memories: list  # T mask memories (arrays [1, M, H, W], or a server's handles)
    memory_tpos: np.ndarray  # int64 [T]: index into the temporal encodings
    obj_ptrs: np.ndarray  # float32 [P, C]
    obj_ptr_tpos: np.ndarray  # float32 [P]: signed plane distance / max distance


def select_cond_frames(frame: int, cond: dict[int, FrameOutput], max_frames: int) -> tuple[dict, dict]:
    """(selected, unselected) conditioning outputs: all, or the `max_frames` closest to `frame`
    (the closest before and after first), as `sam2_utils.select_closest_cond_frames`."""
    if max_frames == -1 or len(cond) <= max_frames:
        return cond, {}
    chosen = []
    before = [t for t in cond if t < frame]
    after = [t for t in cond if t >= frame]
    if before:
        chosen.append(max(before))
    if after:
        chosen.append(min(after))
    rest = sorted((t for t in cond if t not in chosen), key=lambda t: abs(t - frame))
    chosen += rest[: max_frames - len(chosen)]
    selected = {t: v for t, v in cond.items() if t in chosen}
    return selected, {t: v for t, v in cond.items() if t not in selected}


def _memory_plane(frame: int, steps_back: int, stride: int, reverse: bool) -> int:
    """The plane whose mask memory sits `steps_back` places before `frame` (after it in reverse)."""
    if steps_back == 1:
        return frame + 1 if reverse else frame - 1
    if reverse:
        return -(-(frame + 2) // stride) * stride + (steps_back - 2) * stride
    return ((frame - 2) // stride) * stride - (steps_back - 2) * stride


def memory_inputs(track: ObjectTrack, frame: int, reverse: bool, num_frames: int, settings: VideoSettings) -> MemoryInputs:
    """The memories and pointers `frame` attends to when it is not an initial conditioning plane."""
    selected, unselected = select_cond_frames(frame, track.cond, settings.max_cond_frames_in_attn)
    num_maskmem = settings.num_maskmem
    memories = [(0, out) for out in selected.values()]
    for t_pos in range(1, num_maskmem):
        plane = _memory_plane(frame, num_maskmem - t_pos, settings.memory_temporal_stride_for_eval, reverse)
        out = track.non_cond.get(plane, unselected.get(plane))
        if out is not None:
            memories.append((t_pos, out))

    max_ptrs = min(num_frames, settings.max_obj_ptrs_in_encoder)
    sign = -1 if reverse else 1
    if settings.only_obj_ptrs_in_the_past_for_eval:
        ptr_cond = {t: out for t, out in selected.items() if (t >= frame if reverse else t <= frame)}
    else:
        ptr_cond = selected
    pointers = [
        ((frame - t) * sign if settings.use_signed_tpos_enc_to_obj_ptrs else abs(frame - t), out) for t, out in ptr_cond.items()
    ]
    for t_diff in range(1, max_ptrs):
        t = frame - t_diff * sign
        if t < 0 or t >= num_frames:
            break
        out = track.non_cond.get(t, unselected.get(t))
        if out is not None:
            pointers.append((t_diff, out))

    ptr_size = memories[0][1].obj_ptr.shape[-1]  # there is always a conditioning plane
    return MemoryInputs(
        memories=[out.memory for _, out in memories],
        memory_tpos=np.array([num_maskmem - t_pos - 1 for t_pos, _ in memories], np.int64),
        obj_ptrs=np.array([out.obj_ptr for _, out in pointers], np.float32).reshape(-1, ptr_size),
        obj_ptr_tpos=np.array([pos / max(max_ptrs - 1, 1) for pos, _ in pointers], np.float32),
    )
