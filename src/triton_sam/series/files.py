"""Files that a crash never leaves torn: each is written whole to a temporary file beside it, flushed
to disk, then renamed over the old one (`os.replace` is atomic within a file system), and the folder
is flushed so the rename itself survives a power cut."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ..errors import InvalidInputError

TEMPORARY = ".tmp"  # the suffix of files and folders being written; what a crash leaves is removed at the next open


def temporary_beside(path: Path) -> Path:
    """A free name in `path`'s folder for writing `path` before it is renamed into place."""
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY)
    os.close(handle)
    return Path(name)


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace `path` by what `write` writes to a binary file, all or nothing."""
    temporary = temporary_beside(path)
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    sync_folder(path.parent)


def write_json(path: Path, value: dict) -> None:
    """Replace `path` by `value` as indented JSON, all or nothing."""
    text = json.dumps(value, indent=1, sort_keys=False) + "\n"
    write_atomic(path, lambda file: file.write(text.encode()))


def read_json(path: Path, what: str) -> dict:
    """The JSON object in `path`; a file that is not one is an `InvalidInputError` naming `what` it is."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidInputError(f"The {what} {path} cannot be read ({error}). Nothing was changed.") from error
    if not isinstance(value, dict):
        raise InvalidInputError(f"The {what} {path} is not a JSON object. Nothing was changed.")
    return value


def sync_file(path: Path) -> None:
    """Flush `path`, written by someone else (zarr), to disk."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def sync_folder(folder: Path) -> None:
    """Flush `folder`'s entries (a rename in it) to disk; Windows has no such call and needs none."""
    if os.name == "nt":
        return
    sync_file(folder)


def remove_temporaries(folder: Path) -> None:
    """Remove what writes that a crash interrupted left in `folder` (files and folders named by `temporary_beside`)."""
    for leftover in Path(folder).glob(f".*{TEMPORARY}"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
