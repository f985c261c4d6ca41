"""One image's annotation on disk: its label file, the provenance of its objects, and the journal that
makes each commit all or nothing.

In the series' output folder, for an image whose label stem is STEM:
- STEM.labels.tif: a plane of at most 2048 x 2048 pixels, in the smallest unsigned type its labels fit;
- STEM.labels.zarr: a larger plane or a stack, one zarr array (uint32, chunks of 512 x 512 pixels of one
  plane), so that a commit rewrites the chunks under its object and not the plane (a 4096 x 4096 TIFF
  takes about 90 ms to read and write again, a chunk a few);
- STEM.objects.json: each object's provenance (its prompts, the model and weights that made it);
- STEM.commit.npz: the commit under way, present only while one is.

A commit writes what it changes (the labels of a region, the records of its objects) to the journal,
then to the label file and the objects file, then removes the journal. A crash leaves either no journal
(the commit is whole, or never started) or a whole one, which the next open applies again: applying a
commit twice is applying it once.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import tifffile
import zarr

from ..errors import InvalidInputError, TritonSamError
from .files import read_json, sync_file, sync_folder, temporary_beside, write_atomic, write_json

LARGE_PLANE = 2048 * 2048  # pixels of the largest plane kept as one TIFF
CHUNK = 512  # pixels a side of a zarr chunk
Region = tuple[slice, ...]


def whole(shape: tuple[int, ...]) -> Region:
    return tuple(slice(0, n) for n in shape)


def write_tiff(path: Path, labels: np.ndarray, level: int = 1) -> None:
    """Write `labels` to a TIFF atomically (a stack as pages), zlib-compressed at `level`, in the
    smallest unsigned type its ids fit (uint8, uint16 or uint32)."""
    stored = labels.astype(np.min_scalar_type(int(labels.max(initial=0))))
    options = {"photometric": "minisblack", "compression": "zlib", "compressionargs": {"level": level}}
    write_atomic(path, lambda file: tifffile.imwrite(file, stored, **options))


class TiffLabels:
    """A plane's labels as one TIFF, rewritten whole (atomically) by every write."""

    suffix = ".labels.tif"

    def __init__(self, path: Path, shape: tuple[int, ...]) -> None:
        self.path, self.shape = path, shape

    def stored_shape(self) -> tuple[int, ...]:
        with tifffile.TiffFile(self.path) as tiff:
            return tuple(tiff.series[0].shape)

    def read(self, region: Region) -> np.ndarray:
        if not self.path.exists():
            return np.zeros([s.stop - s.start for s in region], np.uint32)
        return tifffile.imread(self.path)[region].astype(np.uint32)

    def write(self, region: Region, crop: np.ndarray) -> None:
        labels = self.read(whole(self.shape))
        labels[region] = crop
        write_tiff(self.path, labels)


class ZarrLabels:
    """A large plane's or a stack's labels as one chunked zarr array: a write rewrites the chunks it touches."""

    suffix = ".labels.zarr"

    def __init__(self, path: Path, shape: tuple[int, ...]) -> None:
        self.path, self.shape = path, shape
        self._array: zarr.Array | None = None

    def stored_shape(self) -> tuple[int, ...]:
        return tuple(zarr.open_array(self.path, mode="r").shape)

    def read(self, region: Region) -> np.ndarray:
        if not self.path.exists():
            return np.zeros([s.stop - s.start for s in region], np.uint32)
        return np.asarray(self._opened()[region], np.uint32)

    def write(self, region: Region, crop: np.ndarray) -> None:
        array = self._opened()
        array[region] = crop  # zarr (>= 3.1.3) writes each chunk to a temporary file and renames it into place
        chunks = [self.path / key for key in self._chunk_keys(array, region)]
        for chunk in chunks:  # on disk before the journal goes
            if chunk.exists():  # (a chunk that became all zeros is deleted instead)
                sync_file(chunk)
        for folder in {chunk.parent for chunk in chunks if chunk.parent.exists()}:
            sync_folder(folder)

    def _opened(self) -> zarr.Array:
        if self._array is None:
            if not self.path.exists():
                self._create()
            self._array = zarr.open_array(self.path, mode="r+")
        return self._array

    def _create(self) -> None:
        """An empty array, made beside its place and renamed into it whole."""
        temporary = temporary_beside(self.path)
        temporary.unlink()
        chunks = (1,) * (len(self.shape) - 2) + tuple(min(CHUNK, n) for n in self.shape[-2:])
        zarr.create_array(store=str(temporary), shape=self.shape, chunks=chunks, dtype="uint32", fill_value=0)
        sync_file(temporary / "zarr.json")
        os.replace(temporary, self.path)
        sync_folder(self.path.parent)

    @staticmethod
    def _chunk_keys(array: zarr.Array, region: Region) -> list[str]:
        ranges = [range(s.start // c, (s.stop - 1) // c + 1) for s, c in zip(region, array.chunks)]
        return [array.metadata.encode_chunk_key(coords) for coords in itertools.product(*ranges)]


class ImageLabels:
    """What is saved of one image: labels, objects' provenance, a commit under way (see the module)."""

    def __init__(self, folder: Path, stem: str, shape: tuple[int, ...], image_name: str) -> None:
        kind = ZarrLabels if len(shape) == 3 or shape[0] * shape[1] > LARGE_PLANE else TiffLabels
        self.store = kind(folder / f"{stem}{kind.suffix}", shape)
        self.stem, self.shape, self.image_name = stem, shape, image_name
        self.objects_path = folder / f"{stem}.objects.json"
        self.journal_path = folder / f"{stem}.commit.npz"
        self._objects: dict[int, dict] | None = None

    @property
    def saved(self) -> bool:
        """Whether anything was saved for this image."""
        return self.store.path.exists() or self.objects_path.exists()

    def check(self) -> None:
        """Raise `InvalidInputError` unless the files on disk (if any) are readable and of the image's shape."""
        if self.store.path.exists():
            try:
                stored = self.store.stored_shape()
            except Exception as error:  # tifffile and zarr raise many kinds
                problem = f"The label file {self.store.path} cannot be read ({error})."
                raise InvalidInputError(f"{problem} Nothing was changed.") from None
            if stored != self.shape:
                raise InvalidInputError(
                    f"The label file {self.store.path} has shape {stored}, but its image {self.image_name} needs {self.shape}: "
                    "it belongs to another image. Move it away (or choose another output folder). Nothing was changed."
                )
        self.objects()
        if self.journal_path.exists():
            self._read_journal()

    def objects(self) -> dict[int, dict]:
        """Each saved object's record: its provenance, and its plane in a stack."""
        if self._objects is None:
            self._objects = {}
            if self.objects_path.exists():
                objects = read_json(self.objects_path, "objects file").get("objects")
                if not isinstance(objects, dict) or not all(key.isdigit() for key in objects):
                    raise InvalidInputError(f"The objects file {self.objects_path} has no valid 'objects'. Nothing was changed.")
                self._objects = {int(key): record for key, record in objects.items()}
        return self._objects

    def read(self, region: Region | None = None) -> np.ndarray:
        """The labels (uint32) of `region` (all of them by default); zeros where nothing was saved."""
        return self.store.read(whole(self.shape) if region is None else region)

    def commit(self, region: Region, crop: np.ndarray, records: dict[int, dict]) -> None:
        """Write `crop` (uint32) into `region` and add `records` to the objects, all or nothing."""
        self.recover()  # a commit that failed before this one in this process
        bounds = np.array([[s.start, s.stop] for s in region], np.int64)
        text = np.array(json.dumps({str(k): v for k, v in records.items()}))
        write_atomic(self.journal_path, lambda file: np.savez(file, region=bounds, labels=crop, records=text))
        self._apply(region, crop, records)

    def recover(self) -> bool:
        """Finish the commit a crash interrupted, if any; whether there was one."""
        if not self.journal_path.exists():
            return False
        self._apply(*self._read_journal())
        return True

    def _apply(self, region: Region, crop: np.ndarray, records: dict[int, dict]) -> None:
        try:
            self.store.write(region, crop)
            if records:
                objects = {**self.objects(), **records}
                write_json(self.objects_path, self._objects_file(objects))
                self._objects = objects
        except OSError as error:
            raise TritonSamError(
                f"Saving the labels of {self.image_name} failed ({error}); the commit is kept in {self.journal_path} "
                "and is completed when the series is next opened or saved to."
            ) from error
        self.journal_path.unlink()

    def _objects_file(self, objects: dict[int, dict]) -> dict:
        return {
            "image": self.image_name,
            "labels": self.store.path.name,
            "objects": {str(key): objects[key] for key in sorted(objects)},
        }

    def _read_journal(self) -> tuple[Region, np.ndarray, dict[int, dict]]:
        try:
            with np.load(self.journal_path, allow_pickle=False) as journal:
                region = tuple(slice(int(a), int(b)) for a, b in journal["region"])
                crop, records = journal["labels"], json.loads(str(journal["records"]))
        except (OSError, ValueError, KeyError) as error:
            problem = f"The commit journal {self.journal_path} cannot be read ({error})."
            raise InvalidInputError(f"{problem} Nothing was changed.") from None
        return region, crop, {int(key): record for key, record in records.items()}
