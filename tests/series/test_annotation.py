"""An annotation series keeps every commit through a crash (a process killed with SIGKILL between two
commits, or within one), resumes where it was, and refuses bad input without changing anything on disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image
from series_data import LARGE, NAMES, SHAPES, STACK, commit, expected_labels, make_images, planned_commits

import triton_sam
from triton_sam.errors import InvalidInputError
from triton_sam.objects import Committed
from triton_sam.series import DONE, IN_PROGRESS, MANIFEST, REMAINING, AnnotationSeries

HERE = Path(__file__).parent
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(triton_sam.__file__).parents[1]), str(HERE)])}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """The five images, shared by the tests (each writes its labels to an output folder of its own)."""
    folder = tmp_path_factory.mktemp("images")
    make_images(folder)
    return folder


def _child(*code_and_args: str) -> subprocess.Popen:
    code, *args = code_and_args
    return subprocess.Popen(
        [sys.executable, "-c", f"import sys, series_data; {code}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )


def _read_until(child: subprocess.Popen, line: str) -> None:
    while (got := child.stdout.readline()) != line + "\n":
        assert got, f"the child ended before {line!r}: {child.stderr.read()}"


def _assert_saved(series: AnnotationSeries, count: int) -> None:
    """`series` holds exactly the first `count` commits: labels and provenance."""
    expected = expected_labels(count)
    for index in range(len(NAMES)):
        np.testing.assert_array_equal(series.labels(index), expected[index], err_msg=NAMES[index])
        made = {c.object_id: {"plane": list(plane), **c.provenance} for i, c, plane in planned_commits()[:count] if i == index}
        assert series.objects(index) == made


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_series_opens_a_folder_of_images_in_natural_order(images, tmp_path):
    series = AnnotationSeries.open(images, tmp_path / "out")
    assert [p.name for p in series.images] == NAMES  # img2 before img10; notes.txt left out
    assert (series.index, len(series), str(series.progress)) == (0, 5, "0 of 5 done")
    assert series.image(1).shape == (40, 56, 3) and series.image(STACK).shape == SHAPES[STACK]
    assert (tmp_path / "out" / MANIFEST).is_file()
    assert [series.label_file(i).name for i in (0, LARGE, STACK)] == ["img1.labels.tif", "large.labels.zarr", "stack.labels.zarr"]
    assert AnnotationSeries.open(images).output == images / "triton-sam-labels"  # the default
    shutil.rmtree(images / "triton-sam-labels")


def test_killed_between_two_commits_every_commit_is_kept_and_the_series_resumes(images, tmp_path):
    out = tmp_path / "out"
    child = _child("series_data.run_and_hold(sys.argv[1], sys.argv[2], 6)", str(images), str(out))
    try:
        _read_until(child, "holding")  # six commits returned; the child waits for the next
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL

    series = AnnotationSeries.open(images, out)
    _assert_saved(series, 6)
    assert series.index == LARGE  # the image the sixth commit was on
    assert [series.status(i) for i in range(5)] == [DONE, DONE, DONE, IN_PROGRESS, REMAINING]
    assert str(series.progress) == "3 of 5 done, 1 in progress"
    assert series.model == {"model_id": "sam2.1_hiera_tiny", "weights_id": "synthetic-weights"}
    assert not list(out.glob(".*")) and not list(out.glob("*.commit.npz"))

    commit(series, 6, len(planned_commits()))  # the annotator goes on
    series.mark_done()
    _assert_saved(AnnotationSeries.open(out), len(planned_commits()))  # the output folder alone resumes too
    assert str(AnnotationSeries.open(out).progress) == "5 of 5 done"


def test_killed_at_any_moment_the_saved_commits_are_a_whole_prefix(images, tmp_path):
    out = tmp_path / "out"
    child = _child("series_data.run_and_hold(sys.argv[1], sys.argv[2], 9)", str(images), str(out))
    try:
        _read_until(child, "committed 3")
    finally:
        child.send_signal(signal.SIGKILL)  # while commit 4 (or a later one) is being written
        child.wait()
    series = AnnotationSeries.open(images, out)
    saved = [series.labels(i) for i in range(5)]
    counts = [n for n in range(4, 10) if all(np.array_equal(a, b) for a, b in zip(saved, expected_labels(n)))]
    assert counts, "the labels on disk are not those of the first n commits for any n >= 4"
    _assert_saved(series, counts[0])


@pytest.mark.parametrize(
    ("k", "stage", "kept"),
    [
        (5, "writing the journal", False),
        (5, "journal written", True),
        (5, "half the labels written", True),
        (5, "labels written", True),
        (5, "objects written", True),
        (1, "journal written", True),  # a TIFF, rewritten whole
        (1, "labels written", True),
        (8, "half the labels written", True),  # a stack's plane
    ],
)
def test_killed_within_a_commit_the_commit_is_whole_or_absent(images, tmp_path, k, stage, kept):
    """Commit 5 covers 3 x 3 zarr chunks of the large plane, commit 1 is on a TIFF, 8 on the stack's last plane."""
    out = tmp_path / "out"
    commit(AnnotationSeries.open(images, out), 0, k)
    code = "series_data.run_and_crash(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])"
    child = _child(code, str(images), str(out), str(k), stage)
    _, errors = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, errors

    series = AnnotationSeries.open(images, out)
    _assert_saved(series, k + 1 if kept else k)
    assert not list(out.glob("*.commit.npz")) and not list(out.glob(".*"))  # the journal done, leftovers gone


def test_a_zarr_commit_writes_only_the_chunks_under_its_object(images, tmp_path):
    series = AnnotationSeries.open(images, tmp_path / "out")
    commit(series, 0, 6)  # object 1 of the large plane: rows 500..1100, columns 900..1600
    chunks = {p.relative_to(tmp_path / "out" / "large.labels.zarr").as_posix() for p in (tmp_path / "out").rglob("c/*/*")}
    assert chunks == {f"c/{row}/{column}" for row in (0, 1, 2) for column in (1, 2, 3)}


def test_an_object_is_saved_on_unlabelled_pixels_only_and_labels_can_be_saved_by_region(images, tmp_path):
    series = AnnotationSeries.open(images, tmp_path / "out")
    commit(series, 0, 2)
    labels = series.labels(0)
    assert (labels == 1).sum() == planned_commits()[0][1].mask.sum()  # object 2 did not paint over object 1

    labels[labels == 2] = 0  # erased by hand, and a label painted in the large plane's far corner
    series.save_labels(0, labels, region=(slice(None), slice(10, None)))
    large = np.zeros(SHAPES[LARGE], np.uint32)
    large[4000:4010, 2000:2010] = 7
    series.save_labels(LARGE, large, {7: {"model_id": "by hand"}}, region=(slice(4000, 4010), slice(2000, 2010)))
    resumed = AnnotationSeries.open(tmp_path / "out")
    np.testing.assert_array_equal(resumed.labels(0), labels)
    np.testing.assert_array_equal(resumed.labels(LARGE), large)
    assert resumed.objects(LARGE) == {7: {"model_id": "by hand"}} and resumed.model == {"model_id": "by hand", "weights_id": None}


def test_save_changes_writes_only_the_box_of_what_differs_with_the_provenance_of_new_ids(images, tmp_path):
    """Undo and redo say only that the layer changed: the differences are found, and only their box is written."""
    series = AnnotationSeries.open(images, tmp_path / "out")
    commit(series, 0, 2)
    labels = series.labels(0)
    assert not series.save_changes(0, labels)  # nothing differs: nothing is written
    labels[labels == 2] = 0  # undone
    labels[40:44, 60:64] = 9  # painted by hand
    written = []
    store = series._images[0].labels
    store.commit = lambda region, crop, records, commit=store.commit: written.append(region) or commit(region, crop, records)
    assert series.save_changes(0, labels, {1: {"model_id": "old"}, 9: {"model_id": "by hand"}})
    ((rows, columns),) = written
    assert (rows.start, columns.stop) == (12, 64) and rows.stop == 44  # from object 2's top to the painted square
    assert series.objects(0)[1]["model_id"] != "old" and series.objects(0)[9] == {"model_id": "by hand"}
    np.testing.assert_array_equal(AnnotationSeries.open(tmp_path / "out").labels(0), labels)


def test_navigation_and_status_are_kept(images, tmp_path):
    series = AnnotationSeries.open(images, tmp_path / "out")
    assert (series.previous(), series.next(), series.next()) == (0, 1, 2)
    series.mark_done(4)
    assert series.go_to(4) == 4 and series.next() == 4  # the last stays the last
    series.mark_done(4, done=False)
    resumed = AnnotationSeries.open(images, tmp_path / "out")
    assert resumed.index == 4 and resumed.status(4) == REMAINING
    assert json.loads((tmp_path / "out" / MANIFEST).read_text())["images"][3] == {
        "image": Path(os.path.relpath(images / "large.tif", tmp_path / "out")).as_posix(),
        "status": REMAINING,
        "shape": [5000, 3000],
        "stem": "large",
        "labels": "large.labels.zarr",
        "objects": "large.objects.json",
    }


def test_images_added_to_the_folder_join_a_resumed_series_and_names_never_collide(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(np.zeros((20, 30), np.uint8)).save(folder / "a.png")
    series = AnnotationSeries.open(folder)
    series.save_object(0, Committed(None, np.ones((2, 2), bool), 1, {}), ())
    tifffile.imwrite(folder / "a.tif", np.zeros((20, 30), np.uint16))  # the same stem
    resumed = AnnotationSeries.open(folder)
    assert [p.name for p in resumed.images] == ["a.png", "a.tif"] and resumed.status(0) == IN_PROGRESS
    assert sorted(p.name for p in series.output.iterdir()) == ["a.labels.tif", "a.objects.json", MANIFEST]
    resumed.save_object(1, Committed(None, np.ones((3, 3), bool), 1, {}), ())
    assert (series.output / "a-2.labels.tif").is_file()
    assert resumed.labels(0).sum() == 4 and resumed.labels(1).sum() == 9


def test_label_files_found_without_a_manifest_are_taken_up(images, tmp_path):
    series = AnnotationSeries.open(images, tmp_path / "out")
    commit(series, 0, 2)
    (tmp_path / "out" / MANIFEST).unlink()  # lost: the labels are still there
    resumed = AnnotationSeries.open(images, tmp_path / "out")
    _assert_saved(resumed, 2)
    assert resumed.status(0) == IN_PROGRESS and resumed.index == 0


# --- bad input: a clear error, nothing on disk changed ----------------------------------------------


def test_a_folder_without_images_is_refused_and_nothing_is_made(tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(InvalidInputError, match="holds no images"):
        AnnotationSeries.open(tmp_path)
    with pytest.raises(InvalidInputError, match="is not an image file"):
        AnnotationSeries.open([tmp_path / "notes.txt"])
    with pytest.raises(InvalidInputError, match="is not a folder"):
        AnnotationSeries.open(tmp_path / "missing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda out: (out / MANIFEST).write_text('{"format": "triton-sam annotation series", "version": 1, "im'),
            "cannot be read",
        ),
        (lambda out: (out / MANIFEST).write_text("[1, 2]"), "is not a JSON object"),
        (lambda out: _edit_manifest(out, lambda m: m.update(current=99)), "current image 99"),
        (lambda out: _edit_manifest(out, lambda m: m["images"][0].update(status="half done")), "status 'half done'"),
        (lambda out: _edit_manifest(out, lambda m: m["images"][0].update(stem="../../elsewhere")), "not a file name"),
        (lambda out: _edit_manifest(out, lambda m: m["images"][0].pop("image")), "not valid"),
        (lambda out: (out / "img1.objects.json").write_text("{}"), "no valid 'objects'"),
        (
            lambda out: tifffile.imwrite(out / "img2.labels.tif", np.zeros((41, 56), np.uint8)),
            r"shape \(41, 56\).*needs \(40, 56\)",
        ),
        (lambda out: (out / "img10.labels.tif").write_bytes(b"not a tiff"), "cannot be read"),
    ],
)
def test_a_damaged_output_folder_is_refused_and_left_as_it_is(images, tmp_path, damage, message):
    out = tmp_path / "out"
    commit(AnnotationSeries.open(images, out), 0, 1)
    damage(out)
    before = _files(out)
    with pytest.raises(InvalidInputError, match=message):
        AnnotationSeries.open(images, out)
    assert _files(out) == before


def _edit_manifest(out: Path, edit) -> None:
    manifest = json.loads((out / MANIFEST).read_text())
    edit(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest))


def test_an_image_changed_or_gone_since_is_refused(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(np.zeros((20, 30), np.uint8)).save(folder / "a.png")
    Image.fromarray(np.zeros((20, 30), np.uint8)).save(folder / "b.png")
    AnnotationSeries.open(folder)
    before = _files(folder / "triton-sam-labels")
    Image.fromarray(np.zeros((21, 30), np.uint8)).save(folder / "a.png")
    with pytest.raises(InvalidInputError, match=r"a.png now has labels of shape \(21, 30\)"):
        AnnotationSeries.open(folder)
    (folder / "a.png").unlink()
    with pytest.raises(InvalidInputError, match="is missing"):
        AnnotationSeries.open(folder)
    assert _files(folder / "triton-sam-labels") == before


def test_bad_saves_are_refused_and_change_nothing(images, tmp_path):
    series = AnnotationSeries.open(images, tmp_path / "out")
    before = _files(tmp_path / "out")
    mask = np.ones((4, 4), bool)
    with pytest.raises(InvalidInputError, match="not a plane"):
        series.save_object(STACK, Committed(None, mask, 1, {}), ())  # a stack's plane is needed
    with pytest.raises(InvalidInputError, match="not a plane"):
        series.save_object(0, Committed(None, mask, 1, {}), (0,))
    with pytest.raises(InvalidInputError, match="outside"):
        series.save_object(0, Committed(None, mask, 1, {}, (46, 0)), ())
    with pytest.raises(InvalidInputError, match="empty or not 2D"):
        series.save_object(0, Committed(None, ~mask, 1, {}), ())
    with pytest.raises(InvalidInputError, match="empty or not 2D"):
        series.save_object(0, Committed(None, mask[0], 1, {}), ())
    with pytest.raises(InvalidInputError, match="id 0"):
        series.save_object(0, Committed(None, mask, 0, {}), ())
    with pytest.raises(InvalidInputError, match="index 5"):
        series.save_object(5, Committed(None, mask, 1, {}), ())
    with pytest.raises(InvalidInputError, match=r"Labels of shape \(48, 63\)"):
        series.save_labels(0, np.zeros((48, 63), np.uint32))
    with pytest.raises(InvalidInputError, match="integers"):
        series.save_labels(0, np.full(SHAPES[0], -1, np.int32))
    with pytest.raises(InvalidInputError, match="empty or has a step"):
        series.save_labels(0, np.zeros(SHAPES[0], np.uint32), region=(slice(0, 48, 2), slice(None)))
    assert _files(tmp_path / "out") == before and series.progress.remaining == 5
