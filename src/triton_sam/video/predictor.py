"""`VolumePredictor`: the `SAM2VideoPredictor` API on the planes of a volume or time-lapse."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..engines import BACKENDS, create_engine
from ..errors import InvalidInputError
from ..features import FeatureCache
from ..image import ContrastLimits, ReadAhead, encoder_input
from ..masks import fill_holes
from ..predictor import EngineOwner
from ..prompts import DecodeRequest, model_request
from ..registry import DEFAULT_MODEL, get_model
from ..server.models.triton_sam_video import PADDING
from .memory import FrameOutput, ObjectTrack, memory_inputs

NO_OBJ_SCORE = -1024.0  # the logits of a plane where the object is absent (`sam2_base.NO_OBJ_SCORE`)
HOLE_VALUE = 0.1  # what the video predictor fills small holes with (`misc.fill_holes_in_mask_scores`)


@dataclass
class VolumeState:
    """One volume's planes, objects and tracking results (the official `inference_state`)."""

    volume: Any  # numpy, dask or zarr array; planes along `axis`
    axis: int
    num_frames: int
    video_height: int
    video_width: int
    contrast_limits: ContrastLimits | None
    obj_ids: list = field(default_factory=list)
    tracks: list[ObjectTrack] = field(default_factory=list)  # by object index

    def plane(self, frame: int) -> np.ndarray:
        """Plane `frame`, read alone: indexing reads one plane of a zarr array (`np.take` read it whole)."""
        return np.asarray(self.volume[(slice(None),) * self.axis + (frame,)])

    def obj_index(self, obj_id, create: bool = False) -> int:
        if obj_id in self.obj_ids:
            return self.obj_ids.index(obj_id)
        if not create:
            raise InvalidInputError(f"Unknown object id {obj_id!r}; known ids: {self.obj_ids}.")
        self.obj_ids.append(obj_id)
        self.tracks.append(ObjectTrack())
        return len(self.obj_ids) - 1


class VolumePredictor(EngineOwner):
    """Segment objects on some planes of a stack and propagate them through the others with
    SAM2.1's memory, as `sam2.sam2_video_predictor.SAM2VideoPredictor` does.

    Planes are encoded by the engine of `backend` (features cached by content); the memory
    attention, memory encoder and tracking decoder are the model's exported video graphs, run
    where the engine says (`Engine.video`): in this process ("local"), by the Triton server's
    session model ("triton", memories kept there), or on the server while it answers ("auto";
    a run the fallback interrupts stops with a message to propagate again). Coordinates
    are (x, y) in plane pixels; masks come back as logits [objects, 1, H, W] (inside: above 0).
    The keyword options are the official predictor's (defaults: its settings at export); `cache`
    lends an engine's `FeatureCache` (an interactive session's, of any backend), which then stays
    open when this predictor closes; other keywords go to `create_engine` (e.g. `connection` for Triton).
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        backend: str = "local",
        model_repository: str | Path | None = None,
        *,
        fill_hole_area: int | None = None,
        non_overlap_masks: bool | None = None,
        clear_non_cond_mem_around_input: bool | None = None,
        add_all_frames_to_correct_as_cond: bool | None = None,
        cache: FeatureCache | None = None,
        cache_mb: float = 512,
        **engine_options,
    ) -> None:
        self.spec = get_model(model)
        if self.spec.family != "sam2":
            raise InvalidInputError(f"Propagation through planes needs a SAM2.1 model, not {model}.")
        if backend not in BACKENDS:
            raise InvalidInputError(f"Volumes run on one of the backends {', '.join(BACKENDS)}, not {backend!r}.")
        shared = cache is not None and cache.engine.spec == self.spec
        self._owns_engine = not shared
        if shared:  # an interactive session's: planes it encoded are not encoded again
            self.engine, self.cache = cache.engine, cache
        else:
            if backend != "triton":
                engine_options.setdefault("feature_device", "cpu")
            self.engine = create_engine(self.spec, backend, model_repository, **engine_options)
            self.cache = FeatureCache(self.engine, max_mb=cache_mb)
        try:
            self.video = self.engine.video(self.cache)
        except Exception:
            self.close()
            raise
        settings = self.video.settings
        self.settings = settings
        self.fill_hole_area = settings.fill_hole_area if fill_hole_area is None else fill_hole_area
        self.non_overlap_masks = settings.non_overlap_masks if non_overlap_masks is None else non_overlap_masks
        self.clear_non_cond_mem_around_input = _given(clear_non_cond_mem_around_input, settings.clear_non_cond_mem_around_input)
        self.add_all_frames_to_correct_as_cond = _given(
            add_all_frames_to_correct_as_cond, settings.add_all_frames_to_correct_as_cond
        )

    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()

    # -- the official API ---------------------------------------------------------------------

    def init_state(self, volume, axis: int = 0, contrast_limits: ContrastLimits | None = None) -> VolumeState:
        """A state for the planes of `volume` along `axis` (grayscale Z x H x W, or RGB with channels
        last). Non-uint8 volumes are scaled to uint8 with one `contrast_limits` for all planes
        (default: the volume's min and max), so that every plane is seen alike."""
        shape = tuple(volume.shape)
        if len(shape) not in (3, 4) or (len(shape) == 4 and shape[-1] not in (3, 4)):
            raise InvalidInputError(f"Expected a stack of planes (Z x H x W or Z x H x W x 3), got shape {shape}.")
        axis = axis % len(shape)
        if len(shape) == 4 and axis == 3:
            raise InvalidInputError("The channel axis cannot be the stacking axis.")
        plane_shape = [s for i, s in enumerate(shape[:3]) if i != axis]
        state = VolumeState(volume, axis, shape[axis], plane_shape[0], plane_shape[1], contrast_limits)
        if contrast_limits is None and volume.dtype != np.uint8:
            state.contrast_limits = _volume_limits(state)
        return state

    def add_new_points_or_box(
        self,
        state: VolumeState,
        frame_idx: int,
        obj_id,
        points=None,
        labels=None,
        clear_old_points: bool = True,
        normalize_coords: bool = True,
        box=None,
    ) -> tuple[int, list, np.ndarray]:
        """Prompt an object on one plane: (frame_idx, obj_ids, mask logits of all objects there)."""
        self._check_frame(state, frame_idx)
        if box is not None and not clear_old_points:
            raise InvalidInputError("A box must come first: add it with clear_old_points=True.")
        request = model_request(
            self.spec,
            (state.video_height, state.video_width),
            point_coords=points,
            point_labels=labels,
            box=box,
            normalize_coords=normalize_coords,
        )
        if request.batch_size != 1:
            raise InvalidInputError("Give one object's prompts at a time (one box, one set of points).")
        track = state.tracks[state.obj_index(obj_id, create=True)]
        coords, point_labels = request.point_coords, request.point_labels
        if not clear_old_points and frame_idx in track.points:
            old_coords, old_labels = track.points[frame_idx]
            coords, point_labels = np.concatenate([old_coords, coords], 1), np.concatenate([old_labels, point_labels], 1)
        track.points[frame_idx] = (coords, point_labels)
        track.masks.pop(frame_idx, None)
        is_init_cond, reverse, is_cond = self._prompt_kind(track, frame_idx)
        previous = track.latest(frame_idx, is_cond)
        prev_logits = None if previous is None else self.spec.as_mask_input(previous.pred_masks)
        plane = self._plane(state, frame_idx)
        out = self._track_plane(plane, state, track, frame_idx, is_init_cond, reverse, (coords, point_labels), prev_logits)
        track.temp(is_cond)[frame_idx] = out
        return frame_idx, list(state.obj_ids), self._plane_masks(state, frame_idx, is_cond)

    add_new_points = add_new_points_or_box

    def add_new_mask(self, state: VolumeState, frame_idx: int, obj_id, mask) -> tuple[int, list, np.ndarray]:
        """Give an object's mask (H x W, bool) on one plane: (frame_idx, obj_ids, mask logits of all
        objects there). The mask is taken as the object's mask on that plane, as the official model does."""
        self._check_frame(state, frame_idx)
        mask = np.asarray(mask)
        if mask.ndim != 2 or mask.size == 0:
            raise InvalidInputError(f"A mask prompt is one non-empty plane (H x W), got shape {mask.shape}.")
        if not self.settings.use_mask_input_as_output_without_sam:
            raise InvalidInputError(f"{self.spec.model_id}'s video settings do not take mask prompts.")
        track = state.tracks[state.obj_index(obj_id, create=True)]
        track.masks[frame_idx] = mask.astype(bool)
        track.points.pop(frame_idx, None)
        _, _, is_cond = self._prompt_kind(track, frame_idx)
        track.temp(is_cond)[frame_idx] = self._mask_as_output(state, frame_idx, track.masks[frame_idx])
        return frame_idx, list(state.obj_ids), self._plane_masks(state, frame_idx, is_cond)

    def propagate_in_video(
        self,
        state: VolumeState,
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[int, list, np.ndarray]]:
        """Track every object plane by plane from `start_frame_idx` (default: the first prompted
        plane); yields (frame_idx, obj_ids, mask logits [objects, 1, H, W]) as each plane is done."""
        self._preflight(state)
        num_frames = state.num_frames
        if start_frame_idx is None:
            start_frame_idx = min(t for track in state.tracks for t in track.cond)
        self._check_frame(state, start_frame_idx)
        if max_frame_num_to_track is None:
            max_frame_num_to_track = num_frames
        if reverse:
            end = max(start_frame_idx - max_frame_num_to_track, 0)
            order = range(start_frame_idx, end - 1, -1) if start_frame_idx > 0 else range(0)
        else:
            end = min(start_frame_idx + max_frame_num_to_track, num_frames - 1)
            order = range(start_frame_idx, end + 1)
        tracked = [frame for frame in order if any(frame not in track.cond for track in state.tracks)]
        position = {frame: i for i, frame in enumerate(tracked)}
        with ReadAhead(lambda frame: self._encoder_input(state, frame)) as reads:
            # Each plane read once for all objects, the next ones read while these are tracked;
            # encoded `encode_batch` at a time (a GPU server encodes several together).
            batches, planes = reads.in_batches(tracked, self.video.encode_batch), {}
            for frame in order:
                if frame in position and frame not in planes:
                    frames, encoder_inputs = next(batches)
                    planes.update(zip(frames, self.video.planes(encoder_inputs)))
                plane = planes.pop(frame, None)
                low_res = []
                for track in state.tracks:
                    if frame in track.cond:
                        out = track.cond[frame]
                        if self.clear_non_cond_mem_around_input:
                            self._clear_non_cond_memories(track, frame)
                    else:
                        out = self._track_plane(plane, state, track, frame, False, reverse, None, None, run_mem_encoder=True)
                        track.non_cond[frame] = out
                    track.tracked[frame] = reverse
                    low_res.append(out.pred_masks)
                yield frame, list(state.obj_ids), self._video_res(state, np.concatenate(low_res))

    def reset_state(self, state: VolumeState) -> None:
        """Forget every object and its prompts and results (the planes' features stay cached)."""
        state.obj_ids.clear()
        state.tracks.clear()

    # -- one plane -----------------------------------------------------------------------------

    def _track_plane(
        self,
        plane,
        state: VolumeState,
        track: ObjectTrack,
        frame: int,
        is_init_cond: bool,
        reverse: bool,
        points: tuple[np.ndarray, np.ndarray] | None,
        prev_logits: np.ndarray | None,
        run_mem_encoder: bool = False,
    ) -> FrameOutput:
        """Decode one object on `plane` (plane `frame`, as `_plane` gives it) with its prompts and memories
        (`SAM2Base.track_step`)."""
        memories = None if is_init_cond else memory_inputs(track, frame, reverse, state.num_frames, self.settings)
        num_points = 0 if points is None else points[1].shape[1]
        coords, labels = points or PADDING  # no clicks: a padding point, as the official model
        request = DecodeRequest(point_coords=coords, point_labels=labels, mask_input=prev_logits)
        decoded = self.video.track(plane, memories, request)
        if self.settings.use_multimask(is_init_cond, num_points):
            best = int(np.argmax(decoded.multi_scores[0]))
            low_res, obj_ptr = decoded.multi_masks[:, best : best + 1], decoded.obj_ptr[0, 1 + best]
        else:
            low_res, obj_ptr = decoded.single_mask, decoded.obj_ptr[0, 0]
        score = decoded.object_score_logits
        low_res = np.where(score.reshape(-1, 1, 1, 1) > 0, low_res, np.float32(NO_OBJ_SCORE)).astype(np.float32)
        memory = self._remember(plane, low_res, score, from_points=points is not None) if run_mem_encoder else None
        return FrameOutput(self._fill_holes(low_res), obj_ptr, score, memory)

    def _mask_as_output(self, state: VolumeState, frame: int, mask: np.ndarray) -> FrameOutput:
        """A mask prompt taken as the object's mask (`SAM2Base._use_mask_as_output`)."""
        low_res, score, obj_ptr = self.video.mask_as_output(self._plane(state, frame), mask)
        return FrameOutput(self._fill_holes(low_res), obj_ptr, score)

    def _remember(self, plane, low_res: np.ndarray, score: np.ndarray, from_points: bool):
        binarize = self.settings.binarize_mask_from_pts_for_mem_enc and from_points
        return self.video.remember(plane, low_res, score, binarize)

    def _fill_holes(self, low_res: np.ndarray) -> np.ndarray:
        if not self.fill_hole_area:
            return low_res
        return fill_holes(low_res, self.fill_hole_area, value=HOLE_VALUE)

    def _plane(self, state: VolumeState, frame: int):
        """Plane `frame` as the backend holds it (encoded on first use, cached by content)."""
        return self.video.plane(self._encoder_input(state, frame))

    def _encoder_input(self, state: VolumeState, frame: int) -> np.ndarray:
        """Plane `frame` read and made the encoder's input."""
        return encoder_input(state.plane(frame), self.spec, state.contrast_limits)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _prompt_kind(self, track: ObjectTrack, frame: int) -> tuple[bool, bool, bool]:
        """(initial conditioning plane, tracked in reverse, kept as conditioning) for a new prompt."""
        is_init_cond = frame not in track.tracked
        reverse = False if is_init_cond else track.tracked[frame]
        return is_init_cond, reverse, is_init_cond or self.add_all_frames_to_correct_as_cond

    def _preflight(self, state: VolumeState) -> None:
        """Encode the memories of newly prompted planes and keep them (`propagate_in_video_preflight`)."""
        if not state.tracks:
            raise InvalidInputError("No object has prompts yet: add points, a box or a mask first.")
        planes = {}  # read once for all objects
        for obj_id, track in zip(state.obj_ids, state.tracks):
            for cond in (False, True):
                for frame, out in track.temp(cond).items():
                    if out.memory is None:
                        if frame not in planes:
                            planes[frame] = self._plane(state, frame)
                        out.memory = self._remember(planes[frame], out.pred_masks, out.object_score_logits, from_points=True)
                    track.outputs(cond)[frame] = out
                    if self.clear_non_cond_mem_around_input:
                        self._clear_non_cond_memories(track, frame)
                track.temp(cond).clear()
            if not track.cond:
                raise InvalidInputError(f"Object {obj_id!r} has no prompts yet: add points, a box or a mask first.")
            for frame in track.cond:
                track.non_cond.pop(frame, None)

    def _clear_non_cond_memories(self, track: ObjectTrack, frame: int) -> None:
        """Drop propagated results near a corrected plane (`clear_non_cond_mem_around_input`)."""
        reach = self.settings.memory_temporal_stride_for_eval * self.settings.num_maskmem
        for t in range(frame - reach, frame + reach + 1):
            track.non_cond.pop(t, None)

    def _plane_masks(self, state: VolumeState, frame: int, is_cond: bool) -> np.ndarray:
        """Every object's newest logits on `frame` at the plane's size (absent objects: NO_OBJ_SCORE)."""
        size = self.spec.low_res_size
        low_res = np.full((len(state.tracks), 1, size, size), NO_OBJ_SCORE, np.float32)
        for i, track in enumerate(state.tracks):
            out = track.latest(frame, is_cond)
            if out is not None:
                low_res[i] = out.pred_masks[0]
        return self._video_res(state, low_res)

    def _video_res(self, state: VolumeState, low_res: np.ndarray) -> np.ndarray:
        logits = self.engine.resizer.logits(low_res, (state.video_height, state.video_width))
        return _non_overlapping(logits) if self.non_overlap_masks else logits

    def _check_frame(self, state: VolumeState, frame: int) -> None:
        if not (isinstance(frame, int | np.integer) and 0 <= frame < state.num_frames):
            raise InvalidInputError(f"Plane {frame!r} is not in this stack of {state.num_frames} planes.")


def _volume_limits(state: VolumeState) -> ContrastLimits:
    """The volume's min and max; of a lazy volume (zarr has no `min`), read a plane at a time, once."""
    if isinstance(state.volume, np.ndarray):
        return float(state.volume.min()), float(state.volume.max())
    lows, highs = zip(*((float(p.min()), float(p.max())) for p in map(state.plane, range(state.num_frames))))
    return min(lows), max(highs)


def _given(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _non_overlapping(logits: np.ndarray) -> np.ndarray:
    """Keep each pixel for the object scoring highest there; the others' logits drop to at most -10."""
    if logits.shape[0] == 1:
        return logits
    keep = np.argmax(logits, axis=0)[None] == np.arange(logits.shape[0])[:, None, None, None]
    return np.where(keep, logits, np.minimum(logits, -10.0))
