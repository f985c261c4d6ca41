"""Image features cached by a content signature, so that an image plane is encoded once.

The key is a hash of the encoder input (the plane as sent) and the model id: the same plane
shown with the same contrast hits the cache whatever layer or file it came from. Optionally the
features are also kept on disk (one `.npz` per image, under the weights' id), so that reopening a
dataset is instant; features a server keeps are not written. Exports from random weights are
named by their seed, so they are kept like any checkpoint's; an engine that does not name its
weights keeps nothing on disk, and the log says so once (`backend="auto"` names the local engine's
when it starts on it: its cache keeps them for the session). The disk cache is bounded (a SAM2.1
plane's features are 16 MiB: a long session over stacks would otherwise fill a laptop's disk): past
the bound the files used least recently go, whichever model wrote them. A folder that cannot be
written (or a full disk) leaves the features in memory only, and `disk_error` says why.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from platformdirs import user_cache_dir

from . import contract
from .engines import Engine, ImageFeatures
from .errors import InvalidInputError
from .server.models.triton_sam_arrays import content_signature  # the handle a server gives the same features

logger = logging.getLogger(__name__)

DEFAULT_CACHE_MB = 1024
ENV_DISK_GB = "TRITON_SAM_DISK_CACHE_GB"
DEFAULT_DISK_GB = 10.0


def default_disk_dir() -> Path:
    """Where the napari panel keeps features on disk: the user's cache directory."""
    return Path(user_cache_dir("triton-sam")) / "embeddings"


def default_disk_mb() -> float:
    """`$TRITON_SAM_DISK_CACHE_GB` (else 10) in megabytes: how much the disk cache may hold."""
    text = os.environ.get(ENV_DISK_GB)
    try:
        gigabytes = float(text) if text else DEFAULT_DISK_GB
    except ValueError:
        gigabytes = -1.0
    if not gigabytes >= 0:
        raise InvalidInputError(f"${ENV_DISK_GB} must be a number of gigabytes (0 or more), not {text!r}.")
    return gigabytes * 1024


def disk_files(disk_dir: str | Path) -> list[Path]:
    """The feature files under `disk_dir` (every model's)."""
    return sorted(Path(disk_dir).glob("*/*.npz"))


def prune_disk(disk_dir: str | Path, max_bytes: int) -> int:
    """Delete the feature files under `disk_dir` used least recently (by modification time: a
    load touches its file) until they hold at most `max_bytes`; returns how many went."""
    files = []
    for path in disk_files(disk_dir):
        try:
            stat = path.stat()
        except FileNotFoundError:  # another process pruned it
            continue
        files.append((stat.st_mtime, stat.st_size, path))
    total, removed = sum(size for _, size, _ in files), 0
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total, removed = total - size, removed + 1
    return removed


_UNNAMED_WEIGHTS_SAID: set[str] = set()  # the kinds of engine the log said it of


def _say_not_kept(engine: Engine) -> None:
    """Say, once a process for each kind of engine, that the disk cache keeps nothing of `engine`'s."""
    if type(engine).__name__ not in _UNNAMED_WEIGHTS_SAID:
        _UNNAMED_WEIGHTS_SAID.add(type(engine).__name__)
        logger.warning(
            "Image features are not kept on disk: %s does not say which weights made them, "
            "and features of unknown weights are never reused.",
            engine.describe(),
        )


class FeatureCache:
    """Least-recently-used features of encoded images, bounded in megabytes; thread-safe.

    Concurrent requests for the same image encode it once: later callers wait for the first.
    With `disk_dir` they are kept on disk too, all models' files there bounded by `disk_max_mb`
    (default `$TRITON_SAM_DISK_CACHE_GB`, else 10 GB).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_mb: float = DEFAULT_CACHE_MB,
        disk_dir: str | Path | None = None,
        disk_max_mb: float | None = None,
    ) -> None:
        self.engine = engine
        self.max_bytes = int(max_mb * 2**20)
        weights = engine.weights_id
        self.disk_wanted = disk_dir is not None
        self.disk_root = Path(disk_dir) if disk_dir is not None and weights else None
        self.disk_dir = self.disk_root / weights if self.disk_root is not None else None
        if disk_max_mb is None:
            disk_max_mb = default_disk_mb() if self.disk_root is not None else 0.0
        self.disk_max_bytes = int(disk_max_mb * 2**20)
        self.disk_hits = 0
        self.disk_error: str | None = None  # why features are no longer written to disk
        self._items: OrderedDict[str, ImageFeatures] = OrderedDict()
        self._encoding: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(f.nbytes for f in self._items.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def signature(self, encoder_input: np.ndarray) -> str:
        """The key `encoder_input`'s features are cached under."""
        return content_signature(encoder_input, self.engine.spec.model_id)

    def get(self, key: str) -> ImageFeatures | None:
        """Features cached in memory under `key` (see `signature`), or None; encodes nothing."""
        with self._lock:
            features = self._items.get(key)
            if features is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return features

    def features(self, encoder_input: np.ndarray, key: str | None = None) -> ImageFeatures:
        """Features of `encoder_input` (whose `signature` is `key`, if known), encoding it only if no one has yet."""
        key = key or self.signature(encoder_input)
        while True:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    self.hits += 1
                    return self._items[key]
                busy = self._encoding.get(key)
                if busy is None:
                    self._claim([key])
                    break
            busy.wait()
        return self._encode_claimed({key: encoder_input})[key]

    def features_many(self, encoder_inputs: Sequence[np.ndarray], keys: Sequence[str] | None = None) -> list[ImageFeatures]:
        """`features` of several inputs: those no one has encoded yet go to the engine together
        (`Engine.encode_many`: a server may encode them in one run)."""
        keys = list(keys) if keys is not None else [self.signature(m) for m in encoder_inputs]
        with self._lock:
            mine = self._claim([k for k in dict.fromkeys(keys) if k not in self._items and k not in self._encoding])
        made = self._encode_claimed({k: m for k, m in zip(keys, encoder_inputs) if k in mine}) if mine else {}
        return [made[k] if k in made else self.features(m, k) for k, m in zip(keys, encoder_inputs)]

    def _claim(self, keys: list[str]) -> list[str]:
        """Mark `keys` as being encoded by this caller (others wait for them); holds the lock."""
        for key in keys:
            self._encoding[key] = threading.Event()
        self.misses += len(keys)
        return keys

    def _encode_claimed(self, encoder_inputs: dict[str, np.ndarray]) -> dict[str, ImageFeatures]:
        """Features of claimed keys (key -> input): loaded from disk, else encoded; cached, and the
        claims let go of."""
        try:
            made = {key: self._load(key) for key in encoder_inputs}
            new = [key for key, features in made.items() if features is None]
            encoded = self.engine.encode_many([encoder_inputs[key] for key in new]) if new else []
            for key, features in zip(new, encoded, strict=True):
                self._save(key, features)
                made[key] = features
            with self._lock:
                self._items.update(made)
                self._evict()
            return made
        finally:
            with self._lock:
                for key in encoder_inputs:
                    self._encoding.pop(key).set()

    def _load(self, key: str) -> ImageFeatures | None:
        """Features stored for `key`, or None if missing, unreadable, or not what this model makes."""
        if self.disk_dir is None or not (self.disk_dir / f"{key}.npz").is_file():
            return None
        try:
            shapes = self._shapes  # maps this engine does not keep are not read
            with np.load(self.disk_dir / f"{key}.npz", allow_pickle=False) as stored:
                arrays = {name: stored[name] for name in stored.files if name in shapes}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):
            return None  # unreadable: encode again and overwrite
        if not self._expected(arrays):
            return None  # foreign or damaged: never trusted
        self.disk_hits += 1
        try:
            os.utime(self.disk_dir / f"{key}.npz")  # used now: pruned last
        except FileNotFoundError:  # pruned meanwhile by another process
            pass
        return ImageFeatures(arrays)

    @property
    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each array the engine's features hold (SAM3's detector maps where it keeps them)."""
        maps = {name: contract.DETECTOR_MAP_SHAPES[name] for name in self.engine.detector_maps}
        return {name: (1, *shape) for name, shape in {**self.engine.spec.feature_shapes, **maps}.items()}

    def _expected(self, arrays: dict[str, np.ndarray]) -> bool:
        """Names, shapes and dtype of the engine's features, all values finite."""
        return {name: a.shape for name, a in arrays.items()} == self._shapes and all(
            a.dtype == np.float32 and np.isfinite(a).all() for a in arrays.values()
        )

    def _save(self, key: str, features: ImageFeatures) -> None:
        """Write features to disk; server-side features have nothing to write. A write that fails
        turns the disk cache off for this cache (memory only) rather than failing the encode."""
        if features.on_server:
            return
        disk_dir = self.disk_dir  # (another thread's failed write may turn it off meanwhile)
        if disk_dir is None:
            if self.disk_wanted and self.disk_error is None:
                _say_not_kept(self.engine)
            return
        try:
            self._write(disk_dir, key, features)
        except OSError as error:
            self.disk_error = (
                f"Embeddings are kept in memory only: {self.disk_root} cannot be written "
                f'({error.strerror or error}). Free or fix that folder, or untick "Keep embeddings on disk".'
            )
            logger.warning(self.disk_error)
            self.disk_dir = None

    def _write(self, disk_dir: Path, key: str, features: ImageFeatures) -> None:
        """Write features into `disk_dir` atomically (temp file + rename), then keep the disk cache within its bound."""
        disk_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # features describe the user's images
        handle, temp = tempfile.mkstemp(dir=disk_dir, suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                np.savez(file, **features.host_arrays())
            os.replace(temp, disk_dir / f"{key}.npz")
        finally:
            Path(temp).unlink(missing_ok=True)  # (gone once renamed; a partial file if the disk filled)
        prune_disk(self.disk_root, self.disk_max_bytes)

    def _evict(self) -> None:
        total = sum(f.nbytes for f in self._items.values())
        while len(self._items) > 1 and total > self.max_bytes:
            _, features = self._items.popitem(last=False)
            total -= features.nbytes
