"""An annotation series: a folder of images annotated one after another, over days, each commit on disk
at once, ready to resume and to export for training. Qt-free; the panel calls the saves from a worker
thread (one save at a time; navigation does not wait for them).

The output folder (by default `triton-sam-labels/` inside the images' folder) holds the manifest
`triton-sam-series.json` (the images, each one's status, the current image, the model last used) and
each image's files (see `labels`). Opening a folder whose manifest is there resumes the series.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError
from ..objects import Committed
from .files import read_json, remove_temporaries, write_json
from .images import SUFFIXES, find_images, is_image, label_shape, read_image
from .labels import ImageLabels, Region
from .training import export

MANIFEST = "triton-sam-series.json"
OUTPUT = "triton-sam-labels"
FORMAT, VERSION = "triton-sam annotation series", 1
REMAINING, IN_PROGRESS, DONE = "remaining", "in progress", "done"
STATUSES = (REMAINING, IN_PROGRESS, DONE)
_MAX_ID = 2**32 - 1  # labels are uint32
PathOrFiles = str | os.PathLike | Sequence[str | os.PathLike]


@dataclass(frozen=True)
class Progress:
    """How far a series is: images done, in progress (something saved), remaining (nothing saved)."""

    done: int
    in_progress: int
    remaining: int

    @property
    def total(self) -> int:
        return self.done + self.in_progress + self.remaining

    def __str__(self) -> str:
        text = f"{self.done} of {self.total} done"
        return text + (f", {self.in_progress} in progress" if self.in_progress else "")


@dataclass
class _Image:
    path: Path
    labels: ImageLabels
    status: str = REMAINING

    @property
    def shape(self) -> tuple[int, ...]:
        return self.labels.shape


class AnnotationSeries:
    """Images to annotate in order, with their labels saved in `output`; make one with `open`."""

    def __init__(self, output: Path, images: list[_Image], current: int = 0, model: dict | None = None) -> None:
        self.output = output
        self._images = images
        self._current = current
        self._model = model
        self._lock = threading.RLock()  # the manifest and what it holds
        self._saving = threading.Lock()  # one commit at a time

    @classmethod
    def open(cls, images: PathOrFiles, output: str | os.PathLike | None = None) -> AnnotationSeries:
        """The series of `images` (a folder, or a list of image files) with labels in `output`.

        `output` defaults to `triton-sam-labels/` beside the images; a folder holding a manifest, given
        as `images` or `output`, is resumed (images added to the folder since join it as remaining).
        Everything is checked before anything is written: bad input raises `InvalidInputError` and
        changes nothing on disk.
        """
        files, output = _sources(images, output)
        manifest = output / MANIFEST
        series = cls._from_manifest(manifest) if manifest.is_file() else cls(output, [])
        series._add(files)
        if not series._images:
            raise InvalidInputError(f"The series in {output} has no images. Nothing was changed.")
        for image in series._images:
            image.labels.check()
        output.mkdir(parents=True, exist_ok=True)
        remove_temporaries(output)
        for image in series._images:
            image.labels.recover()
            if image.status == REMAINING and image.labels.saved:  # saved just before a crash, or found without a manifest
                image.status = IN_PROGRESS
        series._write_manifest()
        return series

    # --- where the series is --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._images)

    @property
    def images(self) -> list[Path]:
        return [image.path for image in self._images]

    @property
    def index(self) -> int:
        """The current image's index."""
        return self._current

    @property
    def current(self) -> Path:
        return self._images[self._current].path

    @property
    def model(self) -> dict | None:
        """The model last saved with: {"model_id", "weights_id"} (each object's own is in its provenance)."""
        return self._model

    def status(self, index: int | None = None) -> str:
        """ "remaining", "in progress" or "done"."""
        return self._image(index).status

    @property
    def progress(self) -> Progress:
        statuses = [image.status for image in self._images]
        return Progress(statuses.count(DONE), statuses.count(IN_PROGRESS), statuses.count(REMAINING))

    def go_to(self, index: int) -> int:
        """Make image `index` the current one (remembered on disk); returns it."""
        self._image(index)
        with self._lock:
            if index != self._current:
                self._current = index
                self._write_manifest()
        return index

    def next(self) -> int:
        """Go to the next image (the last stays the last); returns its index."""
        return self.go_to(min(self._current + 1, len(self) - 1))

    def previous(self) -> int:
        """Go to the previous image (the first stays the first); returns its index."""
        return self.go_to(max(self._current - 1, 0))

    def mark_done(self, index: int | None = None, done: bool = True) -> None:
        """Mark an image (the current one by default) done, or (`done=False`) not done any more."""
        image = self._image(index)
        with self._lock:
            image.status = DONE if done else IN_PROGRESS if image.labels.saved else REMAINING
            self._write_manifest()

    # --- an image's pixels, labels and objects --------------------------------------------------

    def shape(self, index: int | None = None) -> tuple[int, ...]:
        """The shape of an image's labels (the current one's by default): (Y, X), or (Z, Y, X) for a stack."""
        return self._image(index).shape

    def image(self, index: int | None = None) -> np.ndarray:
        """The pixels of an image (the current one by default)."""
        return read_image(self._image(index).path)

    def labels(self, index: int | None = None) -> np.ndarray:
        """The saved labels (uint32) of an image (the current one by default); zeros before its first save."""
        return self._image(index).labels.read()

    def label_file(self, index: int | None = None) -> Path:
        """Where an image's labels are (the current one's by default): a `.labels.tif`, or a `.labels.zarr` folder."""
        return self._image(index).labels.store.path

    def objects(self, index: int | None = None) -> dict[int, dict]:
        """Each saved object of an image: id -> provenance, with its "plane" (the stack index, [] on a 2D image)."""
        return dict(self._image(index).labels.objects())

    # --- saving ---------------------------------------------------------------------------------

    def save_object(self, index: int, committed: Committed, plane: Sequence[int] = ()) -> None:
        """Save a committed object on image `index` (on `plane`, (z,), of a stack) at once, all or nothing,
        on the pixels no object has yet, as the objects layer takes it; only the object's box is written."""
        image = self._image(index)
        prefix = _plane_prefix(image.shape, plane)
        if not 0 < committed.object_id <= _MAX_ID:
            raise InvalidInputError(f"Object id {committed.object_id} is not in 1..{_MAX_ID}.")
        boxed = replace(committed, mask=np.asarray(committed.mask, bool))
        if boxed.mask.ndim == 2:
            boxed = boxed.cropped()  # its box, in one pass over the mask: what follows reads that box only
        if boxed.mask.ndim != 2 or not boxed.mask.any():
            raise InvalidInputError("The object's mask is empty or not 2D; nothing was saved.")
        mask, (y, x), (h, w) = boxed.mask, boxed.offset, boxed.mask.shape
        if y < 0 or x < 0 or y + h > image.shape[-2] or x + w > image.shape[-1]:
            raise InvalidInputError(f"The object's mask lies outside the image's {image.shape[-2:]} pixels; nothing was saved.")
        region = (*prefix, slice(y, y + h), slice(x, x + w))
        record = {"plane": [int(p) for p in plane], **committed.provenance}
        with self._saving:
            crop = image.labels.read(region)
            crop[(crop == 0) & mask.reshape(crop.shape)] = committed.object_id
            image.labels.commit(region, crop, {committed.object_id: record})
        self._saved(image, record)

    def save_labels(
        self, index: int, labels, provenance: Mapping[int, dict] | None = None, region: Sequence[slice] | None = None
    ) -> None:
        """Save `labels` (image `index`'s whole label array, as the objects layer holds it) in `region`
        (slices, one per axis; all of it by default) at once, all or nothing, with the `provenance`
        (id -> dict) of objects it adds. For what is not a commit: painting by hand, undo, Propagate."""
        image = self._image_of(index, labels)
        region = _whole_slices(region, image.shape)
        crop = np.asarray(labels[region])
        if crop.dtype.kind not in "ui" or (crop.size and (crop.min() < 0 or crop.max() > _MAX_ID)):
            raise InvalidInputError(f"Labels must be integers in 0..{_MAX_ID} (got {crop.dtype}); nothing was saved.")
        records = {int(key): dict(value) for key, value in (provenance or {}).items()}
        with self._saving:
            image.labels.commit(region, crop.astype(np.uint32), records)
        self._saved(image, *records.values())

    def save_changes(
        self, index: int, labels, provenance: Mapping[int, dict] | None = None, region: Sequence[slice] | None = None
    ) -> bool:
        """Save what `labels` (as for `save_labels`) holds in `region` (all of it by default) that differs
        from what is saved: only the box around the differences is written, with the `provenance` of ids not
        saved yet. Returns whether anything was. For edits whose extent is not known (undo, redo)."""
        image = self._image_of(index, labels)
        region = _whole_slices(region, image.shape)
        crop = np.asarray(labels[region])
        with self._saving:
            differ = crop != image.labels.read(region)
        if not differ.any():
            return False
        axes = range(differ.ndim)
        spans = [np.flatnonzero(differ.any(axis=tuple(a for a in axes if a != axis))) for axis in axes]
        box = tuple(slice(s.start + int(span[0]), s.start + int(span[-1]) + 1) for s, span in zip(region, spans))
        saved = image.labels.objects()
        self.save_labels(index, labels, {k: v for k, v in (provenance or {}).items() if int(k) not in saved}, box)
        return True

    def export_training(
        self, out_dir: str | os.PathLike, done_only: bool = False, progress: Callable[[int, int], None] | None = None
    ) -> Path:
        """Write the instance labels of the images annotated (done, and in progress unless `done_only`)
        and a COCO dataset of their objects into `out_dir` (see `training.export`); returns the COCO file."""
        wanted = (DONE,) if done_only else (DONE, IN_PROGRESS)
        chosen = [(image.path, image.labels) for image in self._images if image.status in wanted]
        if not chosen:
            raise InvalidInputError(f"No image of the series is {' or '.join(wanted)}: there is nothing to export.")
        return export(chosen, Path(out_dir), progress)

    # --- internals ------------------------------------------------------------------------------

    def _image(self, index: int | None) -> _Image:
        index = self._current if index is None else index
        if not 0 <= index < len(self._images):
            raise InvalidInputError(f"Image index {index} is not in 0..{len(self._images) - 1}.")
        return self._images[index]

    def _image_of(self, index: int, labels) -> _Image:
        """Image `index`, whose labels `labels` must be the shape of."""
        image = self._image(index)
        if tuple(labels.shape) != image.shape:
            shape = tuple(labels.shape)
            raise InvalidInputError(f"Labels of shape {shape} given for {image.path.name}, whose labels are {image.shape}.")
        return image

    def _saved(self, image: _Image, *records: dict) -> None:
        """What a save changes in the manifest: the image is in progress, and the model used."""
        models = [{"model_id": r["model_id"], "weights_id": r.get("weights_id")} for r in records if r.get("model_id")]
        with self._lock:
            status = IN_PROGRESS if image.status == REMAINING else image.status
            model = models[-1] if models else self._model
            if (status, model) != (image.status, self._model):
                image.status, self._model = status, model
                self._write_manifest()

    def _add(self, files: list[Path]) -> None:
        """Append the images of `files` the series does not have yet, as remaining."""
        known = {image.path.resolve() for image in self._images}
        stems = {image.labels.stem for image in self._images}
        for path in files:
            if path.resolve() in known:
                continue
            stem, n = path.stem, 1
            while stem in stems:  # two images of one name stem (a.png, a.tif; or from two folders)
                n += 1
                stem = f"{path.stem}-{n}"
            stems.add(stem)
            known.add(path.resolve())
            self._images.append(_Image(path.resolve(), ImageLabels(self.output, stem, label_shape(path), path.name)))

    @classmethod
    def _from_manifest(cls, manifest: Path) -> AnnotationSeries:
        value, output = read_json(manifest, "series manifest"), manifest.parent
        try:
            if value.get("format") != FORMAT or value.get("version") != VERSION:
                raise ValueError(f"not a {FORMAT} manifest of version {VERSION}")
            images = [_image_of(entry, output) for entry in value["images"]]
            current, model = value["current"], value.get("model")
            if not isinstance(current, int) or not 0 <= current < max(len(images), 1):
                raise ValueError(f"current image {current!r} is not one of its images")
            if model is not None and not isinstance(model, dict):
                raise ValueError("'model' is not an object")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise InvalidInputError(
                f"The series manifest {manifest} is not valid ({error}). Nothing was changed: restore it, or move it away "
                "to start the series again (its label files are taken up again as images in progress)."
            ) from error
        return cls(output, images, current, model)

    def _write_manifest(self) -> None:
        with self._lock:
            write_json(
                self.output / MANIFEST,
                {
                    "format": FORMAT,
                    "version": VERSION,
                    "current": self._current,
                    "model": self._model,
                    "images": [_entry_of(image, self.output) for image in self._images],
                },
            )


def _sources(images, output) -> tuple[list[Path], Path]:
    """The image files given and the output folder: `images` may be the output folder itself."""
    if isinstance(images, str | os.PathLike):
        folder = Path(images)
        if output is None and (folder / MANIFEST).is_file():
            return [], folder.absolute()
        files = find_images(folder)
    else:
        files = [Path(f) for f in images]
        for path in files:
            if not path.is_file() or not is_image(path):
                raise InvalidInputError(f"{path} is not an image file ({', '.join(SUFFIXES)}). Nothing was changed.")
        if not files:
            raise InvalidInputError("No image files were given. Nothing was changed.")
    output = Path(output) if output is not None else files[0].parent / OUTPUT
    return files, output.absolute()


def _entry_of(image: _Image, output: Path) -> dict:
    try:
        path = Path(os.path.relpath(image.path, output)).as_posix()  # the images and their labels move together
    except ValueError:  # another drive (Windows)
        path = str(image.path)
    return {
        "image": path,
        "status": image.status,
        "shape": list(image.shape),
        "stem": image.labels.stem,
        "labels": image.labels.store.path.name,
        "objects": image.labels.objects_path.name,
    }


def _image_of(entry: dict, output: Path) -> _Image:
    """An image of a manifest (`ValueError` and the like where the manifest is wrong)."""
    path, stem, status = output / entry["image"], entry["stem"], entry["status"]
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    if not isinstance(stem, str) or Path(stem).name != stem or stem in ("", ".", ".."):
        raise ValueError(f"label stem {stem!r} is not a file name")
    if not path.is_file():
        raise ValueError(f"its image {path} is missing: put it back, or open the series with the images it has")
    shape = label_shape(path)
    if list(shape) != entry["shape"]:
        raise ValueError(f"{path.name} now has labels of shape {shape}, the manifest says {entry['shape']}")
    return _Image(path.resolve(), ImageLabels(output, stem, shape, path.name), status)


def _plane_prefix(shape: tuple[int, ...], plane: Sequence[int]) -> Region:
    """The index of `plane` in labels of `shape`: () on a 2D image, (z,) on a stack."""
    plane = tuple(plane)
    if len(plane) != len(shape) - 2 or not all(0 <= p < n for p, n in zip(plane, shape)):
        raise InvalidInputError(f"Plane {plane} is not a plane of labels of shape {shape} (a stack's is (z,), a 2D image's ()).")
    return tuple(slice(p, p + 1) for p in plane)


def _whole_slices(region: Sequence[slice] | None, shape: tuple[int, ...]) -> Region:
    """`region` with each slice's start and stop given (the whole of `shape` for None); not empty, step 1."""
    if region is None:
        return tuple(slice(0, n) for n in shape)
    if len(region) != len(shape):
        raise InvalidInputError(f"A region of {len(region)} slices given for labels of {len(shape)} axes.")
    slices = tuple(slice(*s.indices(n)) for s, n in zip(region, shape))
    if any(s.step != 1 or s.stop <= s.start for s in slices):
        raise InvalidInputError(f"The region {region} is empty or has a step; give contiguous slices.")
    return slices
