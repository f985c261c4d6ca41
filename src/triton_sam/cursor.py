"""The cursor as the interactive session follows it: where its last hover decoded, the tile it waits
for, the preview of the object under it, and when it last moved (work ahead of need waits for it
to rest). Qt-free; `session.InteractiveSession` changes it under its lock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .object_decoding import decoding_tile
from .objects import Preview
from .planes import Plane
from .prompts import Point, Prompts
from .tiles import Tile


@dataclass
class Cursor:
    """The cursor over the plane shown. A move it decodes nothing for (closer than `min_move_px` to
    the last hover decoded, or onto a tile not encoded yet) is counted by `skipped()`."""

    min_move_px: float = 2.0
    skipped: Callable[[], None] = lambda: None
    decoded: Point | None = None  # where the last hover decoded (None: the next move decodes)
    waiting: Point | None = None  # where it rests on a tile not encoded yet
    preview: Preview | None = None  # the object under it (no prompts) as last delivered: what commit stores then
    moved_at: float = -math.inf  # when it last moved (time.perf_counter)

    def moved(self) -> None:
        self.moved_at = time.perf_counter()

    def rested(self, seconds: float, stopped: Callable[[], bool]) -> bool:
        """Wait until the cursor has rested `seconds` (work ahead of need must not slow the previews
        on a shared CPU); False, at once, when `stopped()` says so."""
        while not stopped() and time.perf_counter() - self.moved_at < seconds:
            time.sleep(0.05)
        return not stopped()

    def moved_enough(self, xy: Point) -> bool:
        """Whether the cursor at `xy` moved `min_move_px` from the last hover decoded (then it decodes at `xy`)."""
        if self.decoded is not None and math.dist(self.decoded, xy) < self.min_move_px:
            self.skipped()
            return False
        self.decoded = xy
        return True

    def hover_tile(self, plane: Plane, prompts: Prompts, xy: Point) -> Tile | None:
        """The encoded tile that decodes a hover's `prompts`; None when no tile holds them or none
        that does is encoded yet: then the cursor at `xy` waits for its tile."""
        tile = decoding_tile(plane, prompts, encoded_only=True)
        self.waiting = xy if tile is None else None
        if tile is None:
            self.decoded = None  # the next move decodes, if its tile is ready by then
            self.skipped()
        return tile

    def waits_on(self, tile: Tile) -> bool:
        """Whether the cursor waits for a preview on `tile` (just encoded: then it asks again)."""
        return self.waiting is not None and tile.holds(np.array([self.waiting]))

    def forget(self) -> None:
        """No hover decoded nor previewed (a new plane, the hover cleared, the object committed)."""
        self.decoded = self.preview = None
