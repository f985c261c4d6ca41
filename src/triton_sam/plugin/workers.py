"""napari thread workers that let go of their work once it is done.

napari's `create_worker` registers each worker with the viewer's window for the window's lifetime
(its task list), and a worker holds its function and arguments: an engine, a plane, a session. A
closed panel's engine (gigabytes of ONNX Runtime sessions) lived as long as napari. The workers
made here hold their function and arguments only until the work ends, and the slots connected to
their signals (closures over a session, a layer) only until those signals have been handled. They
also put back the warnings module's `showwarning` that overlapping workers can leave behind (`_Warnings`).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable
from functools import partial

from napari.qt.threading import create_worker
from qtpy.QtCore import QObject, QTimer, Signal

WORKER_SIGNALS = ("started", "yielded", "returned", "errored", "finished", "aborted")
# What PyQt and PySide say when a slot touches a Qt object that is gone.
DELETED = ("has been deleted", "already deleted")


class WorkerError(Exception):
    """A RuntimeError raised by a generator worker's work, passed on as an error."""


def make_worker(func: Callable, *args, progress: dict | None = None, **kwargs):
    """A napari worker (not started) running `func(*args, **kwargs)`: a generator function gives a
    generator worker; connect its slots before `start`. Errors go to `errored` only (a
    generator's RuntimeError as a `WorkerError`: superqt would end the worker silently, without
    `errored` or `finished`); `progress` is napari's `_progress`."""
    held = [partial(func, *args, **kwargs)]

    if inspect.isgeneratorfunction(func):

        def work():
            held[0] = held[0]()  # the generator; dropped when the worker ends, even if it was stopped mid-way
            while held:
                try:
                    yield next(held[0])
                except StopIteration as stop:
                    return stop.value
                except RuntimeError as error:  # superqt takes it for a deleted worker: no errored, no finished
                    raise WorkerError(f"{type(error).__name__}: {error}") from error
    else:

        def work():
            return held.pop()()

    made = create_worker(work, _progress=progress or False, _ignore_errors=True, _start_thread=False)
    for name in WORKER_SIGNALS:  # (an attribute of the worker comes before its signals' pass-through)
        if hasattr(made.signals, name):  # yielded, aborted: generator workers only
            setattr(made, name, _SlotsMayOutliveQt(getattr(made.signals, name)))
    made.finished.connect(held.clear)
    start = made.start

    def start_then_let_go() -> None:
        # Connected last (the caller connects before `start`), so that it is queued after every
        # other slot of `finished`: the worker thread queues them one by one while the GUI thread
        # may already run the first ones, and a slot disconnected before it is queued never runs.
        _WARNINGS.started()
        made.finished.connect(_WARNINGS.ended)
        made.finished.connect(lambda: QTimer.singleShot(0, partial(_disconnect_all, made.signals)))
        start()

    made.start = start_then_let_go
    return made


class _Warnings:
    """superqt runs each worker inside `warnings.catch_warnings()`, which swaps the module's
    `showwarning` for a function that emits the worker's `warned` signal and puts back what it found
    on exit. Not thread-safe: when A starts, then B, then A ends, then B, B puts back A's function.
    Every warning after that (from any thread, at exit too) went to a finished worker whose Qt object
    may be gone: "wrapped C/C++ object ... has been deleted" raised where the warning was, or a
    segfault at exit (the long-session benchmark's, #40). Once none of these workers runs (their
    `finished` comes after their `catch_warnings` ended), what was there before the first is put back."""

    def __init__(self) -> None:
        self.running = 0
        self.kept = warnings.showwarning

    def started(self) -> None:
        """A worker is about to start (on the GUI thread)."""
        if not self.running:
            self.kept = warnings.showwarning
        self.running += 1

    def ended(self) -> None:
        """A worker's `finished` was handled (on the GUI thread)."""
        self.running -= 1
        if not self.running:
            warnings.showwarning = self.kept


_WARNINGS = _Warnings()


def _disconnect_all(signals: QObject) -> None:
    """Disconnect every public signal a worker's signals class defines (not QObject's own, nor
    superqt's `_finished`, which lets go of the worker when it is handled)."""
    for cls in type(signals).__mro__:
        if cls is QObject:
            return
        for name, attribute in vars(cls).items():
            if isinstance(attribute, Signal) and not name.startswith("_"):
                with contextlib.suppress(TypeError, RuntimeError):  # nothing connected to it
                    getattr(signals, name).disconnect()


class _SlotsMayOutliveQt:
    """A worker's signal whose slots end quietly when the Qt objects they update are gone: napari
    closed while the work ran (its last results still queued). An exception escaping a slot then
    would abort the process, napari's exception hook being gone with its window."""

    def __init__(self, signal) -> None:
        self._signal = signal

    def connect(self, slot: Callable) -> None:
        self._signal.connect(partial(_unless_qt_is_gone, slot))

    def __getattr__(self, name: str):
        return getattr(self._signal, name)  # emit, disconnect: the signal's own


def _unless_qt_is_gone(slot: Callable, *args) -> None:
    try:
        slot(*args)
    except RuntimeError as error:
        if not any(words in str(error) for words in DELETED):
            raise
