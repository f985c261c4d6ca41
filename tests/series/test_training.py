"""The training export reads back as what was saved: each label image, and each COCO annotation's RLE
decoded here independently of the encoder (column-major runs, starting with zeros)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tifffile
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from series_data import NAMES, STACK, commit, make_images, planned_commits

from triton_sam.errors import InvalidInputError
from triton_sam.series import AnnotationSeries, rle


def decode(segmentation: dict) -> np.ndarray:
    """A COCO uncompressed RLE as a bool mask: counts alternate 0s and 1s over the pixels in column-major order."""
    height, width = segmentation["size"]
    flat = np.zeros(height * width, bool)
    position, value = 0, False
    for count in segmentation["counts"]:
        flat[position : position + count] = value
        position, value = position + count, not value
    assert position == height * width
    return flat.reshape(width, height).T


@given(arrays(bool, st.tuples(st.integers(1, 12), st.integers(1, 12))))
@settings(max_examples=200, deadline=None)
def test_rle_decodes_to_the_mask(mask):
    encoded = rle(mask)
    assert encoded["size"] == list(mask.shape) and all(c >= 0 for c in encoded["counts"])
    assert all(c > 0 for c in encoded["counts"][1:-1])  # runs are maximal: no empty run inside
    np.testing.assert_array_equal(decode(encoded), mask)


@given(arrays(bool, st.tuples(st.integers(1, 6), st.integers(1, 6))), st.integers(0, 6), st.integers(0, 6))
@settings(max_examples=200, deadline=None)
def test_rle_of_a_crop_is_that_of_the_crop_placed_on_its_plane(crop, y, x):
    plane = np.zeros((crop.shape[0] + y + 2 * (y % 2), crop.shape[1] + x + 1), bool)
    plane[y : y + crop.shape[0], x : x + crop.shape[1]] = crop
    assert rle(crop, (y, x), plane.shape) == rle(plane)


def test_a_run_down_a_column_goes_on_at_the_top_of_the_next():
    mask = np.zeros((3, 4), bool)
    mask[1:, 0] = mask[:, 1] = mask[0, 2] = True  # pixels 1..7 of 12 in column-major order
    assert rle(mask) == {"size": [3, 4], "counts": [1, 6, 5]}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[AnnotationSeries, Path]:
    folder = tmp_path_factory.mktemp("images")
    make_images(folder)
    series = AnnotationSeries.open(folder)
    commit(series, 0, len(planned_commits()) - 1)  # the stack's last object is left out: the stack is in progress
    series.mark_done(0)
    calls = []
    coco_file = series.export_training(folder / "export", progress=lambda done, total: calls.append((done, total)))
    assert calls == [(n, 5) for n in range(1, 6)]
    return series, coco_file


def test_the_exported_label_images_are_the_saved_labels(exported):
    series, coco_file = exported
    for index, name in enumerate(NAMES):
        stem = name.rsplit(".", 1)[0]
        written = tifffile.imread(coco_file.parent / "labels" / f"{stem}.tif")
        assert written.dtype == np.uint8  # the smallest type the ids fit
        np.testing.assert_array_equal(written, series.labels(index))


def test_the_coco_dataset_decodes_to_the_saved_labels(exported):
    series, coco_file = exported
    coco = json.loads(coco_file.read_text())
    assert coco["categories"] == [{"id": 1, "name": "object", "supercategory": "object"}]
    assert len(coco["images"]) == 4 + 3  # one per plane of the stack
    by_image = {}
    for annotation in coco["annotations"]:
        mask = decode(annotation["segmentation"])
        rows, columns = np.nonzero(mask)
        x0, y0 = columns.min(), rows.min()
        assert annotation["bbox"] == [x0, y0, columns.max() + 1 - x0, rows.max() + 1 - y0]
        assert annotation["area"] == mask.sum() and annotation["category_id"] == 1 and annotation["iscrowd"] == 0
        by_image.setdefault(annotation["image_id"], []).append((annotation["label"], mask))
    assert sorted(a["id"] for a in coco["annotations"]) == list(range(1, len(coco["annotations"]) + 1))

    planes = []
    for index, name in enumerate(NAMES):
        labels = series.labels(index)
        planes += [(name, (), labels)] if labels.ndim == 2 else [(name, (z,), plane) for z, plane in enumerate(labels)]
    for image, (name, plane, labels) in zip(coco["images"], planes, strict=True):
        assert (image["file_name"], image.get("plane")) == (f"../{name}", plane[0] if plane else None)
        assert (image["height"], image["width"]) == labels.shape
        assert (coco_file.parent / image["file_name"]).is_file()
        rebuilt = np.zeros(labels.shape, np.uint32)
        for label, mask in by_image.get(image["id"], []):
            assert not rebuilt[mask].any()  # objects never overlap
            rebuilt[mask] = label
        np.testing.assert_array_equal(rebuilt, labels, err_msg=f"{name} {plane}")


def test_only_what_was_annotated_is_exported(exported, tmp_path):
    series, _ = exported
    assert [series.status(i) for i in range(5)] == ["done"] * 4 + ["in progress"]
    coco = json.loads(series.export_training(tmp_path, done_only=True).read_text())
    assert [image["file_name"].rsplit("/", 1)[1] for image in coco["images"]] == NAMES[:STACK]
    fresh = AnnotationSeries.open(series.images[:1], tmp_path / "fresh")
    with pytest.raises(InvalidInputError, match="nothing to export"):
        fresh.export_training(tmp_path / "none")
