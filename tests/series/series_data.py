"""A series of five images and the objects committed on them, for the tests and for the processes they kill.

Images, in natural order: two small planes (PNG, RGB JPEG), a small uint16 TIFF, a 5000 x 3000 uint16
plane (kept as zarr) and a stack of 3 planes. The commits go image by image, marking each image done when
the next one starts, and include an object overlapping an earlier one, one across zarr chunk borders, one
touching a plane's edges, one spanning a plane's whole height (its RLE runs join across columns).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

from triton_sam.objects import Committed
from triton_sam.series import AnnotationSeries

NAMES = ["img1.png", "img2.jpg", "img10.tif", "large.tif", "stack.tif"]
SHAPES = [(48, 64), (40, 56), (50, 70), (5000, 3000), (3, 64, 48)]  # of their labels
LARGE, STACK = 3, 4


def make_images(folder: Path) -> None:
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, SHAPES[0], np.uint8)).save(folder / NAMES[0])
    Image.fromarray(rng.integers(0, 255, (*SHAPES[1], 3), np.uint8)).save(folder / NAMES[1])
    tifffile.imwrite(folder / NAMES[2], rng.integers(0, 4000, SHAPES[2], np.uint16))
    large = np.zeros(SHAPES[LARGE], np.uint16)
    large[::7, ::5] = 1000  # something to see, cheap to compress
    tifffile.imwrite(folder / NAMES[LARGE], large, compression="zlib")
    tifffile.imwrite(folder / NAMES[STACK], rng.integers(0, 255, SHAPES[STACK], np.uint8), photometric="minisblack")
    (folder / "notes.txt").write_text("not an image")


def _disk(radius: int) -> np.ndarray:
    yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1]
    return yy**2 + xx**2 <= radius**2


def _box(h: int, w: int) -> np.ndarray:
    return np.ones((h, w), bool)


def _provenance(object_id: int) -> dict:
    return {
        "points": [[float(object_id), 2.0]],
        "labels": [1],
        "box": None,
        "candidate": 0,
        "model_id": "sam2.1_hiera_tiny",
        "weights_id": "synthetic-weights",
        "mask_threshold": 0.0,
    }


def planned_commits() -> list[tuple[int, Committed, tuple[int, ...]]]:
    """(image index, the committed object, its plane) in the order they are committed."""
    plan = [
        (0, _disk(8), 1, (5, 5), ()),
        (0, _disk(10), 2, (12, 14), ()),  # overlaps object 1: only its unlabelled pixels are saved
        (1, _box(40, 3), 1, (0, 50), ()),  # the whole height, ending at the right edge
        (2, _box(50, 2), 1, (0, 10), ()),  # the whole height of two columns: one RLE run
        (2, _disk(6), 2, (30, 40), ()),
        (LARGE, _box(600, 700), 1, (500, 900), ()),  # across 3 x 3 chunks of 512
        (LARGE, _disk(5)[:10, :10], 2, (4990, 2990), ()),  # the bottom-right corner
        (STACK, _disk(7), 1, (10, 10), (0,)),
        (STACK, _disk(9), 2, (40, 20), (2,)),
    ]
    return [(index, Committed(None, mask, oid, _provenance(oid), offset), plane) for index, mask, oid, offset, plane in plan]


def expected_labels(count: int) -> list[np.ndarray]:
    """Each image's labels after the first `count` commits, painted as the objects layer does."""
    labels = [np.zeros(shape, np.uint32) for shape in SHAPES]
    for index, committed, plane in planned_commits()[:count]:
        (y, x), (h, w) = committed.offset, committed.mask.shape
        region = labels[index][(*plane, slice(y, y + h), slice(x, x + w))]
        region[(region == 0) & committed.mask] = committed.object_id
    return labels


def commit(series: AnnotationSeries, start: int, stop: int, report=None) -> None:
    """Make commits `start` to `stop` as an annotator would: on a new image, mark the last one done and go on."""
    plan = planned_commits()
    for k in range(start, stop):
        index, committed, plane = plan[k]
        if index != series.index:
            series.mark_done()
            series.go_to(index)
        series.save_object(index, committed, plane)
        if report is not None:
            report(k)


def run_and_hold(folder: str, output: str, stop: int) -> None:
    """In a process to be killed: make the first `stop` commits, saying each, then wait to be killed."""
    series = AnnotationSeries.open(Path(folder), Path(output))
    commit(series, 0, stop, report=lambda k: print(f"committed {k}", flush=True))
    print("holding", flush=True)
    time.sleep(600)


def run_and_crash(folder: str, output: str, k: int, stage: str) -> None:
    """In a process that kills itself: make commit `k` (the ones before it are on disk), and die at `stage` of it."""
    import os
    import signal

    from triton_sam.series import files, labels

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def after(function):
        def wrapped(*args, **kwargs):
            function(*args, **kwargs)
            die()

        return wrapped

    series = AnnotationSeries.open(Path(folder), Path(output))
    store = labels.ZarrLabels if series.label_file(planned_commits()[k][0]).suffix == ".zarr" else labels.TiffLabels
    if stage == "writing the journal":  # its temporary file written, not renamed into place
        replace = os.replace
        files.os.replace = lambda a, b: die() if str(b).endswith(".commit.npz") else replace(a, b)
    elif stage == "journal written":
        labels.ImageLabels._apply = lambda *args: die()
    elif stage == "half the labels written":  # a multi-chunk write cut short: the first rows of chunks only

        def half(self, region, crop):
            rows = (region[-2].stop - region[-2].start) // 2
            write(self, (*region[:-2], slice(region[-2].start, region[-2].start + rows), region[-1]), crop[..., :rows, :])
            die()

        write, store.write = store.write, half
    elif stage == "labels written":
        store.write = after(store.write)
    elif stage == "objects written":
        labels.write_json = after(labels.write_json)
    commit(series, k, k + 1)
    print("not killed", flush=True)
