"""Download checkpoints: streamed, verified by their published checksum, and written atomically.

A checksum is "<algorithm>:<hex digest>": SHA-256 for the official models, xxh128 as micro-sam
publishes its models. The file appears under its final name only after its checksum matched; a
failed, interrupted or corrupt download leaves nothing that looks usable.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import platformdirs
import xxhash

from .errors import DownloadError
from .registry import ModelSpec

Progress = Callable[[int, int | None], None]  # (bytes so far, total bytes or None)


class Unreachable(DownloadError):
    """The host did not answer (offline, DNS, firewall)."""


CHUNK = 1 << 20
HASHES = {"sha256": hashlib.sha256, "xxh128": xxhash.xxh128}


def algorithm_of(checksum: str) -> str:
    """The algorithm a checksum ("<algorithm>:<hex>") names, refused if unknown."""
    algorithm = checksum.partition(":")[0]
    if algorithm not in HASHES:
        raise DownloadError(f"Unknown checksum algorithm in {checksum!r}; known: {', '.join(HASHES)}.")
    return algorithm


def default_checkpoint_dir() -> Path:
    return Path(platformdirs.user_cache_dir("triton-sam")) / "checkpoints"


def download(url: str, checksum: str, destination: Path, progress: Progress | None = None, timeout: float = 30.0) -> Path:
    """Fetch `url` to `destination`, verifying `checksum` ("sha256:..." or "xxh128:...") while
    streaming; an existing file with that checksum is kept."""
    destination = Path(destination)
    algorithm = algorithm_of(checksum)
    if destination.is_file() and file_checksum(destination, algorithm) == checksum:
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            found = f"{algorithm}:{_stream(url, out, HASHES[algorithm](), progress, timeout)}"
        if found != checksum:
            raise DownloadError(
                f"{url} downloaded, but its checksum is {found}, not the expected {checksum}. "
                "The file was corrupted or changed on the server; nothing was kept. Try again."
            )
        os.replace(partial, destination)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return destination


def _stream(url: str, out, digest, progress: Progress | None, timeout: float) -> str:
    """Write `url`'s body to `out`, hashing it with `digest`; the hex digest."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            done = 0
            while block := response.read(CHUNK):
                out.write(block)
                digest.update(block)
                done += len(block)
                if progress:
                    progress(done, total)
    except urllib.error.HTTPError as error:
        raise DownloadError(f"{url} answered HTTP {error.code} ({error.reason}).") from error
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        raise Unreachable(f"Could not download {url}: {getattr(error, 'reason', error)}.") from error
    return digest.hexdigest()


def file_checksum(path: Path, algorithm: str = "sha256") -> str:
    """The checksum of the file at `path` by `algorithm` (a key of HASHES), as "<algorithm>:<hex>"."""
    digest = HASHES[algorithm]()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return f"{algorithm}:{digest.hexdigest()}"


def file_sha256(path: Path) -> str:
    """The SHA-256 hex digest of the file at `path` (names an exported model's weights)."""
    return file_checksum(path).partition(":")[2]


def download_checkpoint(
    spec: ModelSpec, directory: Path | None = None, url: str | None = None, progress: Progress | None = None
) -> Path:
    """Download the official checkpoint of `spec` (or the same file from a mirror `url`)."""
    if spec.checksum is None:
        raise DownloadError(
            f"{spec.model_id}'s checkpoint is gated: {spec.url} is served only to a logged-in user who "
            f"accepted the model's licence. Download it in a browser, then run: "
            f"triton-sam export {spec.model_id} --checkpoint {spec.checkpoint_filename}"
        )
    export = f"`triton-sam export {spec.model_id} --checkpoint PATH`"
    return _fetch(spec, _Published(spec.url, spec.checksum, spec.checkpoint_filename, export), directory, url, progress)


def download_decoder(spec: ModelSpec, directory: Path | None = None, progress: Progress | None = None) -> Path | None:
    """Download micro-sam's instance-segmentation decoder of `spec` beside its checkpoint (None: it has none)."""
    if spec.decoder_url is None:
        return None
    export = f"`triton-sam export {spec.model_id} --checkpoint PATH --decoder PATH`"
    published = _Published(spec.decoder_url, spec.decoder_checksum, spec.decoder_filename, export)
    return _fetch(spec, published, directory, None, progress)


class _Published(NamedTuple):
    """A file a model's publisher serves: its URL and checksum, the name it is kept under, and the
    `export` command that takes it when the user brings it themselves."""

    url: str
    checksum: str
    filename: str
    export: str


def _fetch(spec: ModelSpec, published: _Published, directory: Path | None, mirror: str | None, progress: Progress | None) -> Path:
    """`published` (or the same file from `mirror`) verified into `directory`; offline, the error
    names the URL, the path `setup` looks at, and the command that takes the file."""
    directory = Path(directory) if directory is not None else default_checkpoint_dir()
    destination = directory / published.filename
    try:
        return download(mirror or published.url, published.checksum, destination, progress)
    except Unreachable as error:
        raise DownloadError(
            f"{error} Offline? Download {published.url} on a machine with internet access, then either put it at "
            f"{destination} (`triton-sam setup {spec.model_id}` uses a verified file there) or run {published.export}."
        ) from error
