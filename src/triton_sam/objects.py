"""What the interactive session builds and shows: the object in progress on a plane (its prompts
and last decoded candidates), a `Preview` of it or of the object under the cursor, and a
`Committed` object. Qt-free values; `session.InteractiveSession` changes an object in progress
under its lock, and decodes it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace

import numpy as np

from .planes import Plane
from .prompts import Box, Point, Prompts
from .registry import ModelSpec
from .tiles import Tile

Offset = tuple[int, int]  # (row, column) of a mask crop's first pixel on its plane
MasksOf = Callable[[np.ndarray, Tile], np.ndarray]  # low-res logits [C, h, w] on a tile to its masks (`ObjectDecoder.masks`)


@dataclass(frozen=True)
class Preview:
    """Masks to show on the plane they belong to: `mask` is what `commit` would store.

    Masks are crops placed at their offsets: the whole plane at (0, 0) unless the plane is tiled.
    """

    plane: Hashable
    mask: np.ndarray  # bool [h, w] at `offset`
    score: float
    hint: np.ndarray | None = None  # bool, at `hint_offset`; with prompts: the object with a point at `point` too
    point: tuple[float, float] | None = None  # the hover point, None for a prompt result
    candidate: int | None = None  # which multimask candidate (prompt results)
    place: tuple[int, int] | None = None  # with `candidate`: its place by score (1: the best) of how many
    seq: int = 0  # the scheduler's sequence number, for a last `is_current` check
    t_event: float = 0.0  # when the event it answers happened (time.perf_counter)
    offset: Offset = (0, 0)
    hint_offset: Offset = (0, 0)
    tile: Tile | None = None  # the tile `mask` was decoded with
    # float32 [h, w]: the logits `mask` comes from (commit upsamples them); they may hold only the
    # part around the object, the rest below the threshold (`DecodeRequest.logits_above`)
    low_res: np.ndarray | None = None

    @property
    def step(self) -> int:
        """Plane pixels a side of one pixel of `mask` and `hint` (1 unless its tile is coarse)."""
        return 1 if self.tile is None else self.tile.step

    def hinted(self, hint: np.ndarray | None, point: Point | None, hint_offset: Offset, step: int) -> Preview:
        """This preview with the cursor's `hint` (at `point`, decoded with tiles of `step`), or as it is
        where there is none or it is of another step (zoomed since: the two would not line up)."""
        if hint is None or step != self.step:
            return self
        return replace(self, hint=hint, point=point, hint_offset=hint_offset)


@dataclass(frozen=True)
class Committed:
    """A finished object: its mask on its plane, the id it was given, and how it was made."""

    plane: Hashable
    mask: np.ndarray  # bool [h, w] at `offset`, full resolution (the whole plane unless it is tiled)
    object_id: int
    provenance: dict = field(default_factory=dict)  # see `object_decoding.ObjectDecoder.provenance`
    offset: Offset = (0, 0)

    def cropped(self) -> Committed:
        """The object with its mask cut to the box around its pixels (its offset moved with it), found
        in one pass over the mask: writing and saving it then read that box, not the whole plane."""
        rows = np.flatnonzero(self.mask.any(1))
        if rows.size == 0:
            return self
        r0, r1 = int(rows[0]), int(rows[-1]) + 1
        columns = np.flatnonzero(self.mask[r0:r1].any(0))  # the rows' band only
        c0, c1 = int(columns[0]), int(columns[-1]) + 1
        y, x = self.offset
        return replace(self, mask=self.mask[r0:r1, c0:c1], offset=(y + r0, x + c0))


@dataclass
class ObjectInProgress:
    """The object being built on one plane: its prompts (image pixels) and its last decoded candidates."""

    prompts: Prompts = Prompts()
    order: list[str] = field(default_factory=list)  # "point" / "box", for undo
    version: int = 0  # bumped on every change; a decode stores results only for its version
    low_res: np.ndarray | None = None  # float32 [C, 256, 256] candidates of the last decode (`logits_above`)
    scores: np.ndarray | None = None  # [C]
    mask: np.ndarray | None = None  # bool, the chosen candidate at full size (its tile's): what commit stores
    tile: Tile | None = None  # the tile `low_res` and `mask` belong to
    chosen: int = 0
    decoded_version: int = -1
    content: Hashable = None  # the plane's `content` when it was last decoded
    pending: int = 0  # prompt decodes submitted and not finished

    @property
    def empty(self) -> bool:
        return self.prompts.empty

    @property
    def points(self) -> list[Point]:
        return list(self.prompts.points)

    @property
    def labels(self) -> list[int]:
        return list(self.prompts.labels)

    @property
    def box(self) -> Box | None:
        return self.prompts.box

    def give(self, prompts: Prompts, kind: str) -> None:
        """Take `prompts`: the object's, with one more prompt of `kind` ("point", or "box": the box replaced)."""
        if kind == "box" and "box" in self.order:
            self.order.remove("box")
        self.prompts = prompts
        self.order.append(kind)

    def take_back(self) -> None:
        """Remove the last prompt given (there is one); the candidates decoded no longer refine."""
        prompts = self.prompts
        if self.order.pop() == "box":
            self.prompts = replace(prompts, box=None)
        else:
            self.prompts = replace(prompts, points=prompts.points[:-1], labels=prompts.labels[:-1])
        self.low_res = self.scores = self.mask = None

    def store(self, version: int, low_res: np.ndarray, scores: np.ndarray, tile: Tile, content: Hashable, masks: MasksOf) -> None:
        """Take the candidates decoded on `tile` for `version` of the prompts (from the plane's
        `content`), the best scored chosen."""
        self.low_res, self.scores, self.tile = low_res, scores, tile
        self.decoded_version, self.content = version, content
        self.choose(int(np.argmax(scores)), masks)

    def ranked(self) -> list[int]:
        """The candidates of the last decode, best score first (the first of equals first)."""
        return [int(c) for c in np.argsort(-np.asarray(self.scores), kind="stable")]

    def choose_next(self, masks: MasksOf) -> None:
        """Make the next candidate by score the object's mask, after the worst the best again."""
        ranked = self.ranked()
        self.choose(ranked[(ranked.index(self.chosen) + 1) % len(ranked)], masks)

    def choose(self, candidate: int, masks: MasksOf) -> None:
        """Make `candidate` the object's mask."""
        self.chosen = candidate
        self.mask = masks(self.low_res[candidate][None], self.tile)[0]

    def mask_input(self, tile: Tile | None, spec: ModelSpec) -> np.ndarray | None:
        """The chosen candidate's logits as a next round's mask input on `tile`, as the official
        predictor hands them back for refinement; None unless the last decode is current and of `tile`."""
        if self.low_res is None or self.decoded_version != self.version or self.tile != tile:
            return None
        return spec.as_mask_input(self.low_res[self.chosen][None])

    def preview(self, plane: Plane) -> Preview:
        """The object as its prompts make it on `plane` (empty, on its first tile, while its first decode runs)."""
        if self.mask is None:
            first = plane.tiles[0]
            return Preview(plane.key, np.zeros(first.reduced_shape, bool), 0.0, offset=first.offset, tile=first)
        score, tile, place = float(self.scores[self.chosen]), self.tile, (self.ranked().index(self.chosen) + 1, len(self.scores))
        return Preview(
            plane.key,
            self.mask,
            score,
            candidate=self.chosen,
            place=place,
            offset=tile.offset,
            tile=tile,
            low_res=self.low_res[self.chosen],
        )
