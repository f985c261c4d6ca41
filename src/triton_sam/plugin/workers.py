"""napari thread workers that let go of their work once it is done.

napari's `create_worker` registers each worker with the viewer's window for the window's lifetime
(its task list), and a worker holds its function and arguments: an engine, a plane, a session. A
closed panel's engine (gigabytes of ONNX Runtime sessions) lived as long as napari. The workers
made here hold their function and arguments only until the work ends.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial

from napari.qt.threading import create_worker


def make_worker(func: Callable, *args, progress: dict | None = None, **kwargs):
    """A napari worker (not started) running `func(*args, **kwargs)`: a generator function gives a
    generator worker. Errors go to `errored` only; `progress` is napari's `_progress`."""
    held = [partial(func, *args, **kwargs)]

    if inspect.isgeneratorfunction(func):

        def work():
            held[0] = held[0]()  # the generator; dropped when the worker ends, even if it was stopped mid-way
            while held:
                try:
                    yield next(held[0])
                except StopIteration as stop:
                    return stop.value
    else:

        def work():
            return held.pop()()

    made = create_worker(work, _progress=progress or False, _ignore_errors=True, _start_thread=False)
    made.finished.connect(held.clear)
    return made
