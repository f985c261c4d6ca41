"""`python -m benchmarks.series_save`: how long an annotation series takes to save one commit.

A plane of each size given is annotated with objects (disks of 20 to 150 px radius at random places)
and each `AnnotationSeries.save_object` is timed, all of it: the journal, the labels (a TIFF rewritten
whole, or the zarr chunks under the object), the objects file and its fsyncs. Planes up to 2048 x 2048
are TIFFs, larger ones zarr; `--tiff` also times the larger ones as TIFFs, to show why they are not.
Not yet one of `python -m benchmarks`' own (its report and the development page would need a section).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile

from triton_sam.objects import Committed
from triton_sam.series import AnnotationSeries, labels

from . import summarize


def _disk(radius: int) -> np.ndarray:
    yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1]
    return yy**2 + xx**2 <= radius**2


def time_saves(side: int, commits: int, folder: Path, seed: int = 0) -> dict:
    """Timings of `commits` saves on a `side` x `side` uint16 plane, in a series made in `folder`."""
    tifffile.imwrite(folder / "plane.tif", np.zeros((side, side), np.uint16))
    series = AnnotationSeries.open([folder / "plane.tif"], folder / "labels")
    rng = np.random.default_rng(seed)
    provenance = {"points": [[1.0, 2.0]], "labels": [1], "box": None, "model_id": "sam2.1_hiera_tiny", "weights_id": "w"}
    samples = []
    for object_id in range(1, commits + 1):
        mask = _disk(int(rng.integers(20, 151)))
        y, x = rng.integers(0, side - mask.shape[0], 2)
        committed = Committed(None, mask, object_id, provenance, (int(y), int(x)))
        start = time.perf_counter()
        series.save_object(0, committed)
        samples.append(time.perf_counter() - start)
    return {"side": side, "labels": series.label_file(0).suffix[1:], **summarize(samples, (95,)), "max_ms": max(samples) * 1000}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--commits", type=int, default=40)
    parser.add_argument("--tiff", action="store_true", help="time planes over 2048 x 2048 as TIFFs too")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        for n, side in enumerate(args.sides):
            for tiff in (False, True) if args.tiff and side * side > labels.LARGE_PLANE else (False,):
                folder = Path(scratch) / f"{n}-{tiff}"
                folder.mkdir()
                limit, labels.LARGE_PLANE = labels.LARGE_PLANE, (side * side if tiff else labels.LARGE_PLANE)
                try:
                    results.append(time_saves(side, args.commits, folder))
                finally:
                    labels.LARGE_PLANE = limit
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(
            f"{r['side']:5d} x {r['side']:<5d} {r['labels']:4s}  save median {r['median_ms']:6.1f} ms   "
            f"p95 {r['p95_ms']:6.1f} ms   max {r['max_ms']:6.1f} ms   ({r['n']} commits)"
        )


if __name__ == "__main__":
    main()
