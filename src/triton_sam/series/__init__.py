"""Annotation series: many images annotated one after another, every commit saved at once and all or
nothing, resumed where it was left, exported for training (docs/series.md). Qt-free."""

from .annotation import DONE, IN_PROGRESS, MANIFEST, OUTPUT, REMAINING, AnnotationSeries, Progress
from .training import rle

__all__ = ["DONE", "IN_PROGRESS", "MANIFEST", "OUTPUT", "REMAINING", "AnnotationSeries", "Progress", "rle"]
