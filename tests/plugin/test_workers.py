"""napari workers that let go of their function and arguments when they end (napari keeps every
worker as long as its window)."""

from __future__ import annotations

import gc
import itertools
import threading
import warnings
import weakref

import pytest

napari = pytest.importorskip("napari")

from triton_sam.plugin.workers import make_worker  # noqa: E402


class Held:
    """Stands for an engine or a plane a worker is given."""


def _run(qtbot, worker) -> None:
    with qtbot.waitSignal(worker.finished, timeout=5000):
        worker.start()


def test_a_function_worker_returns_and_lets_go_of_its_arguments(qtbot, viewer):
    held = Held()
    worker = make_worker(lambda value, scale: (id(value), scale), held, scale=2)
    returned = []
    worker.returned.connect(returned.append)
    reference = weakref.ref(held)
    del held
    _run(qtbot, worker)
    gc.collect()
    assert returned[0][1] == 2 and reference() is None


def test_a_stopped_generator_worker_lets_go_of_its_generator_and_arguments(qtbot, viewer):
    handled = threading.Event()

    def count(value: Held):
        for number in itertools.count():  # never ends on its own
            yield number
            handled.wait(5)  # one number at a time: a flood of signals would swamp the event loop
            handled.clear()

    def stop(number: int) -> None:
        yielded.append(number)
        worker.quit()
        handled.set()

    held = Held()
    worker = make_worker(count, held, progress={"total": 10})
    yielded = []
    worker.yielded.connect(stop)
    reference = weakref.ref(held)
    del held
    _run(qtbot, worker)
    gc.collect()
    assert yielded in ([0], [0, 1]) and reference() is None  # stopped at the next number


def test_the_slots_of_a_worker_are_let_go_of_once_its_signals_are_handled(qtbot, viewer):
    held = Held()
    worker = make_worker(lambda: 1)
    returned, finished = [], []
    worker.returned.connect(lambda value, held=held: returned.append(value))  # a closure over a session, say
    worker.finished.connect(lambda held=held: finished.append(True))
    reference = weakref.ref(held)
    del held
    _run(qtbot, worker)
    qtbot.waitUntil(lambda: gc.collect() is not None and reference() is None, timeout=5000)
    assert returned == [1] and finished == [True]


def _fail():
    raise ValueError("bad plane")


def _fail_after_a_plane():
    yield 1
    raise RuntimeError("dictionary changed size during iteration")


@pytest.mark.parametrize(
    "work, reported",
    [
        (_fail, "bad plane"),
        # superqt ends a generator worker that raises a RuntimeError without a word (it takes it
        # for a deleted worker): a button waiting for `finished` stayed at "Stop ...", no error shown.
        (_fail_after_a_plane, "RuntimeError: dictionary changed size during iteration"),
    ],
)
def test_a_failing_worker_reports_its_error_and_finishes(qtbot, viewer, work, reported):
    worker = make_worker(work)
    errors = []
    worker.errored.connect(errors.append)
    _run(qtbot, worker)
    assert [str(error) for error in errors] == [reported]


def test_every_slot_connected_before_start_is_called(qtbot, viewer):
    """The worker thread queues the slots of `finished` one by one while the GUI thread may run
    the first already: letting go of the slots from one connected before the caller's dropped
    those not queued yet, now and then (Encode all stuck at "Stop encoding" in CI)."""
    for _ in range(30):
        worker = make_worker(lambda: 1)
        called = []
        for number in range(100):
            worker.finished.connect(lambda number=number, called=called: called.append(number))
        worker.start()
        qtbot.waitUntil(lambda called=called: len(called) == 100, timeout=5000)


def test_overlapping_workers_leave_the_warnings_module_as_it_was(qtbot, qapp):
    """superqt swaps `warnings.showwarning` while a worker runs (not thread-safe): A starts, B starts,
    A ends, B ends put A's function back, and a later warning went to A's deleted Qt object (#40: the
    long session's segfault at exit). Once both ended, the function in place before is back."""
    before = warnings.showwarning
    b_started, a_finished = threading.Event(), threading.Event()
    first = make_worker(lambda: b_started.wait(5))
    second = make_worker(lambda: b_started.set() or a_finished.wait(5))
    first.finished.connect(a_finished.set)
    with qtbot.waitSignal(second.finished, timeout=10000):
        first.start()
        second.start()
    assert a_finished.is_set()
    qtbot.waitUntil(lambda: warnings.showwarning is before, timeout=5000)
