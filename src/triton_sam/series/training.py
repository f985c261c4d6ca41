"""Export an annotation series for training: an instance label image per image, and every object as a
COCO dataset with one COCO image per plane (a stack's planes each have one, with their "plane").

Masks are COCO's uncompressed RLE: {"size": [height, width], "counts": [...]}, the runs of the mask
read in column-major order starting with a run of zeros (pycocotools reads it; `frPyObjects` turns it
into its compressed form). The encoding is done here, from each object's box, so that a large plane
is never compared with each of its labels whole.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from skimage.measure import regionprops

from .files import write_json
from .labels import ImageLabels, write_tiff

COCO_FILE = "coco.json"
LABELS_FOLDER = "labels"
CATEGORY = {"id": 1, "name": "object", "supercategory": "object"}


def rle(mask: np.ndarray, top_left: tuple[int, int] = (0, 0), shape: tuple[int, int] | None = None) -> dict:
    """COCO uncompressed RLE of a plane of `shape` (`mask`'s own by default) whose only set pixels are
    those of `mask`, a bool crop placed at `top_left` (row, column)."""
    (y, x), (height, width) = top_left, shape or mask.shape
    columns = np.zeros((mask.shape[1], mask.shape[0] + 2), np.int8)  # each column of the crop, padded with a 0 each end
    columns[:, 1:-1] = mask.T
    steps = np.diff(columns, axis=1)
    column, row = np.nonzero(steps == 1)  # in column-major order, as the plane's pixels are counted
    starts = (x + column) * height + y + row
    column, row = np.nonzero(steps == -1)
    ends = (x + column) * height + y + row
    joined = np.flatnonzero(ends[:-1] == starts[1:])  # a run down to a column's bottom that goes on at the next one's top
    starts, ends = np.delete(starts, joined + 1), np.delete(ends, joined)
    edges = np.concatenate(([0], np.stack([starts, ends], 1).ravel(), [height * width]))
    return {"size": [int(height), int(width)], "counts": np.diff(edges).tolist()}


def export(images: Sequence[tuple[Path, ImageLabels]], out_dir: Path, progress: Callable[[int, int], None] | None = None) -> Path:
    """Write into `out_dir` each image's labels as `labels/<stem>.tif` (a stack's as a multi-page TIFF)
    and `coco.json`, whose images name their file relative to `out_dir`; returns the COCO file's path.
    `progress(done, total)` is called after each image."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / LABELS_FOLDER).mkdir(exist_ok=True)
    coco = {
        "info": {"description": "triton-sam annotation series", "date_created": datetime.datetime.now().isoformat()},
        "licenses": [],
        "categories": [CATEGORY],
        "images": [],
        "annotations": [],
    }
    for done, (path, labels) in enumerate(images, 1):
        stored = labels.read()
        label_file = f"{LABELS_FOLDER}/{labels.stem}.tif"
        write_tiff(out_dir / label_file, stored, level=6)
        planes = [((), stored)] if stored.ndim == 2 else [((z,), plane) for z, plane in enumerate(stored)]
        for plane_index, plane in planes:
            image_id = len(coco["images"]) + 1
            coco["images"].append(_coco_image(image_id, path, plane_index, plane.shape, label_file, out_dir))
            coco["annotations"].extend(_annotations(plane, image_id, first_id=len(coco["annotations"]) + 1))
        if progress is not None:
            progress(done, len(images))
    write_json(out_dir / COCO_FILE, coco)
    return out_dir / COCO_FILE


def _coco_image(image_id: int, path: Path, plane: tuple[int, ...], shape: tuple, label_file: str, out_dir: Path) -> dict:
    try:
        file_name = Path(os.path.relpath(path, out_dir)).as_posix()
    except ValueError:  # another drive (Windows)
        file_name = str(path)
    image = {"id": image_id, "file_name": file_name, "height": int(shape[0]), "width": int(shape[1]), "labels": label_file}
    if plane:
        image["plane"] = int(plane[0])  # index along the stack's first axis; its labels are that page of `labels`
    return image


def _annotations(plane: np.ndarray, image_id: int, first_id: int) -> list[dict]:
    """One COCO annotation for each label of `plane`."""
    annotations = []
    for region in regionprops(plane):
        y0, x0, y1, x1 = region.bbox
        annotations.append(
            {
                "id": first_id + len(annotations),
                "image_id": image_id,
                "category_id": CATEGORY["id"],
                "segmentation": rle(region.image, (y0, x0), plane.shape),
                "area": int(np.count_nonzero(region.image)),
                "bbox": [int(x0), int(y0), int(x1 - x0), int(y1 - y0)],
                "iscrowd": 0,
                "label": int(region.label),  # the object's id in its label image and objects file
            }
        )
    return annotations
