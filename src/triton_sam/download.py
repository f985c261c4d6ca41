"""Download checkpoints: streamed, verified by SHA-256, and written atomically.

The file appears under its final name only after its hash matched; a failed, interrupted or
corrupt download leaves nothing that looks usable.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import platformdirs

from .errors import DownloadError
from .registry import ModelSpec

Progress = Callable[[int, int | None], None]  # (bytes so far, total bytes or None)


class Unreachable(DownloadError):
    """The host did not answer (offline, DNS, firewall)."""


CHUNK = 1 << 20


def default_checkpoint_dir() -> Path:
    return Path(platformdirs.user_cache_dir("triton-sam")) / "checkpoints"


def download(url: str, sha256: str, destination: Path, progress: Progress | None = None, timeout: float = 30.0) -> Path:
    """Fetch `url` to `destination`, verifying `sha256`; an existing verified file is kept."""
    destination = Path(destination)
    if destination.is_file() and file_sha256(destination) == sha256:
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _stream(url, out, progress, timeout)
        if digest != sha256:
            raise DownloadError(
                f"{url} downloaded, but its SHA-256 is {digest}, not the expected {sha256}. "
                "The file was corrupted or changed on the server; nothing was kept. Try again."
            )
        os.replace(partial, destination)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return destination


def _stream(url: str, out, progress: Progress | None, timeout: float) -> str:
    digest = hashlib.sha256()
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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def download_checkpoint(
    spec: ModelSpec, directory: Path | None = None, url: str | None = None, progress: Progress | None = None
) -> Path:
    """Download the official checkpoint of `spec` (or the same file from a mirror `url`)."""
    if spec.sha256 is None:
        raise DownloadError(
            f"{spec.model_id}'s checkpoint is gated: {spec.url} is served only to a logged-in user who "
            f"accepted the model's licence. Download it in a browser, then run: "
            f"triton-sam export {spec.model_id} --checkpoint {spec.checkpoint_filename}"
        )
    directory = Path(directory) if directory is not None else default_checkpoint_dir()
    destination = directory / spec.checkpoint_filename
    try:
        return download(url or spec.url, spec.sha256, destination, progress)
    except Unreachable as error:
        raise DownloadError(
            f"{error} Offline? Download {spec.url} on a machine with internet access, then either put it at "
            f"{destination} (`triton-sam setup {spec.model_id}` uses a verified file there) or run "
            f"`triton-sam export {spec.model_id} --checkpoint PATH`."
        ) from error
