"""How Segment all finds the objects of a plane's region (a `Method`): prompts on a grid of points
(`PointGrid`), or a micro-sam model's instance-segmentation decoder
(`automatic_decoder.InstanceDecoder`). Qt-free: `automatic.AutomaticSegmentation` runs them in
its workers, with its progress bar, stop and layers, the same for each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from ..automatic import AutomaticMaskGenerator, label_image
from ..engines import CancelToken, Engine
from ..errors import DecodeCancelled
from ..features import FeatureCache
from ..image import ContrastLimits

Region = tuple[int, int, int, int]  # rows y0:y1, columns x0:x1 of the plane
Crop = tuple[int, int, int, int]  # x0, y0, x1, y1 of the plane: what is encoded (the region, or a tile of it)
Advance = Callable[[int, int], None]  # (steps done, steps in all) of one plane


class Method(Protocol):
    """How a run finds the objects of a plane's region: `name`, `model` and `parameters` go in
    the layer's metadata, `failure_hint` after an InvalidInputError (the way out), `title` before
    what the status says of the run ("Segment all")."""

    title: str
    name: str
    model: str
    parameters: dict
    failure_hint: str

    def steps(self, plane_hw: tuple[int, int], crops: list[Crop]) -> int:
        """How many steps `labels` reports for one plane."""

    def progress(self, done: int, total: int) -> str:
        """The status while a plane's steps are done."""

    def labels(
        self, plane, contrast: ContrastLimits | None, advance: Advance, cancel: CancelToken, crops: list[Crop], region: Region
    ) -> np.ndarray:
        """The label image (uint32, 0: none) of `region` of `plane` (any array that slices: only
        the `crops` are read), reporting `advance`; raises DecodeCancelled once `cancel` is."""

    def nothing_found(self) -> str:
        """What to change when no object was found (no layer is added for none)."""


class PointGrid:
    """Prompts on a grid of points (`AutomaticMaskGenerator`, with the form's `options`); each
    crop is prompted on its own, at native resolution."""

    title, name, failure_hint = "Segment all", "point grid", ""

    def __init__(self, engine: Engine, cache: FeatureCache, options: dict) -> None:
        self.model, self.parameters = engine.spec.model_id, options
        self._generator = AutomaticMaskGenerator(self.model, engine=engine, cache=cache, **options)

    def steps(self, plane_hw: tuple[int, int], crops: list[Crop]) -> int:
        return self._generator.batches(plane_hw, crops)

    def progress(self, done: int, total: int) -> str:
        return f"Segment all: {done} of {total} batches of points decoded."

    def labels(self, plane, contrast, advance: Advance, cancel: CancelToken, crops: list[Crop], region: Region) -> np.ndarray:
        y0, x0, y1, x1 = region
        found = self._generator.find(plane, contrast, advance, cancel, crops)
        return label_image(found, (y1 - y0, x1 - x0), origin=(x0, y0))

    def nothing_found(self) -> str:
        options = self.parameters
        return (
            "Segment all found no object, so no layer was added: lower 'Predicted IoU >' (now "
            f"{options['pred_iou_thresh']}) or 'Stability >=' (now {options['stability_score_thresh']}), "
            "or raise 'Points per side' to prompt smaller objects, and run it again."
        )


def stop_if_cancelled(cancel: CancelToken, what: str) -> None:
    """Raise DecodeCancelled (`what` was cancelled) once `cancel` is: a method checks between its steps."""
    if cancel.cancelled:
        raise DecodeCancelled(f"{what} cancelled")
