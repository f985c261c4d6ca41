"""ONNX Runtime sessions of exported models: made once per process and shared, memory bounded on a CPU.

Engines of one model (Start pressed again, a generator or predictor made beside the panel's) share
the sessions of one file, so its weights and arena are held once. On a CPU, a session's arena keeps
the largest run's intermediates for good (an encode's ~750 MB for SAM2.1 tiny), and a memory
pattern, planned per input shape, claims a second block beside them (+640 MB on the second encode):
so no memory patterns, and runs with a rare large peak (encodes, batched decodes) hand the arena's
unused memory back when they end. GPU sessions keep ONNX Runtime's defaults.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

from ..errors import ModelFileError
from .providers import CPU, provider_options

_SESSIONS: weakref.WeakValueDictionary[tuple, ort.InferenceSession] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def on_cpu(providers: Sequence[str]) -> bool:
    """Whether sessions with `providers` compute on the CPU alone."""
    return list(providers) == [CPU]


def shared_session(
    path: Path, providers: Sequence[str], intra_op_threads: int = 0, trt_cache_dir: str | None = None
) -> ort.InferenceSession:
    """The session of the model file at `path` on `providers`: the one already open in this process
    (while anything holds it) unless the file changed since."""
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except OSError as error:
        raise ModelFileError(f"Cannot read {path}: {error}. Export the model again (`triton-sam setup MODEL`).") from error
    key = (str(path), stat.st_mtime_ns, stat.st_size, tuple(providers), intra_op_threads, trt_cache_dir)
    with _LOCK:  # one load per file even when two threads ask at once
        session = _SESSIONS.get(key)
        if session is None:
            session = _open(path, providers, intra_op_threads, trt_cache_dir)
            _SESSIONS[key] = session
    return session


def release_cpu_arena(options: ort.RunOptions) -> ort.RunOptions:
    """`options`, set to give the CPU arena's unused memory back once the run ends."""
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def _options(providers: Sequence[str], intra_op_threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_mem_pattern = not on_cpu(providers)
    return options


def _open(path: Path, providers: Sequence[str], intra_op_threads: int, trt_cache_dir: str | None) -> ort.InferenceSession:
    provider_list = [(p, provider_options(p, trt_cache_dir)) for p in providers]
    try:
        return ort.InferenceSession(str(path), sess_options=_options(providers, intra_op_threads), providers=provider_list)
    except Exception as error:  # ORT raises several unrelated types for unreadable models
        raise ModelFileError(
            f"Cannot load {path}: {error}. The file may be corrupt or incomplete; export the model again "
            "(`triton-sam setup MODEL` or `triton-sam export MODEL --checkpoint PATH`)."
        ) from error
