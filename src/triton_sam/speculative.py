"""Latest-wins scheduling of decoder calls for a preview that follows the cursor.

The mouse moves 60-120 times a second; a decode takes 5-100 ms. Sending every move floods the
engine with work nobody will see. `DecodeScheduler` keeps at most `max_in_flight` jobs running,
lets the newest hover job replace an older pending one, cancels a running hover job as soon as a
newer one exists (through the engine: gRPC cancel, ONNX Runtime terminate), and delivers a result
only while it is the newest: a stale mask is never shown. Prompt jobs (clicks) are never dropped or
cancelled by hovers; they run before pending hovers, in order.

With `settle`, a hover job starts only once the cursor has rested a little longer than its usual
gap between moves (the mean gap plus four mean deviations, as TCP times its retransmissions):
while it sweeps, a decode would be superseded before it could be shown, so starting it only burns
time that other annotators of the same server need. Moves too small to send count as moves here.
(Sessions settle on a Triton engine, not on the local one, where a superseded decode stops at once.)

Plain Python threads, no Qt: results go to the `deliver` callback on a worker thread, and the
caller moves them where it needs them (the napari widget marshals them to the GUI thread).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .engines.base import CANCEL_ALWAYS, CANCEL_OVERDUE, CancelToken
from .errors import DecodeCancelled

logger = logging.getLogger(__name__)

HOVER = "hover"
PROMPT = "prompt"
# With CANCEL_OVERDUE, a superseded running hover job is cancelled once it has run longer than
# OVERDUE_FACTOR x a typical run (most likely stuck in a busy server's queue).
OVERDUE_FACTOR = 2.0
# A pending hover job starts once the cursor has not moved for its typical gap between events plus
# SETTLE_DEVIATIONS x the gaps' mean deviation plus SETTLE_MARGIN_S (moving averages of gaps shorter
# than MAX_MOVE_GAP_S), at most MAX_SETTLE_S.
SETTLE_DEVIATIONS = 4.0
SETTLE_MARGIN_S = 0.001
MAX_MOVE_GAP_S = 0.05
MAX_SETTLE_S = 0.03


@dataclass(eq=False)  # identity: jobs live in a set
class Job:
    """One decoder call: `run(token)` computes the result and raises DecodeCancelled if cancelled."""

    kind: str
    run: Callable[[CancelToken], Any]
    seq: int
    generation: int
    t_event: float
    t_submitted: float
    token: CancelToken = field(default_factory=CancelToken)
    t_started: float = 0.0


@dataclass(frozen=True)
class Delivery:
    """A result that was the newest when delivered."""

    kind: str
    seq: int
    value: Any
    latency_s: float  # from the event that asked for it to delivery
    t_event: float  # when that event happened (the scheduler's clock)


@dataclass
class SchedulerStats:
    """What happened to the events a scheduler was given (for status lines and benchmarks)."""

    events: int = 0  # hover events offered, including those skipped as too small a move
    skipped: int = 0  # events not turned into a job (moved less than the threshold)
    superseded: int = 0  # jobs replaced while pending: never sent
    sent: int = 0  # jobs handed to the engine
    cancelled: int = 0  # sent, then cancelled before they finished
    executed: int = 0  # sent and finished
    failed: int = 0  # sent and raised an error
    delivered: int = 0  # hover and prompt results shown
    hovers_delivered: int = 0  # of those, hover results: the previews of `events`
    stale_dropped: int = 0  # finished but no longer the newest: not delivered
    latencies_s: list[float] = field(default_factory=list)
    run_s: list[float] = field(default_factory=list)  # how long each executed job ran (the decode)

    def snapshot(self) -> dict:
        """Counts, and event-to-result latency and run time percentiles in milliseconds."""
        counts = {k: v for k, v in self.__dict__.items() if k not in ("latencies_s", "run_s")}
        latency, run = np.asarray(self.latencies_s) * 1000.0, np.asarray(self.run_s) * 1000.0
        return {**counts, "latency_ms": latency_percentiles(latency), "run_ms": latency_percentiles(run)}


class DecodeScheduler:
    """Runs hover and prompt jobs on worker threads; see the module docstring for the rules."""

    def __init__(
        self,
        deliver: Callable[[Delivery], None],
        max_in_flight: int = 1,
        on_error: Callable[[Exception], None] | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        cancel_running: str = CANCEL_ALWAYS,
        settle: bool = True,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if cancel_running not in (CANCEL_ALWAYS, CANCEL_OVERDUE):
            raise ValueError(f"cancel_running must be {CANCEL_ALWAYS!r} or {CANCEL_OVERDUE!r}")
        self.cancel_running = cancel_running
        self._typical_run_s: float | None = None  # moving average of finished runs
        self.settle = settle
        self._typical_gap_s: float | None = None  # moving average of gaps between hover events
        self._gap_deviation_s = 0.0  # moving average of their distance from that average
        self._deliver = deliver
        self._on_error = on_error or (lambda error: logger.error("decode failed: %s", error))
        self._clock = clock
        self._cond = threading.Condition()
        self._pending_hover: Job | None = None
        self._prompts: collections.deque[Job] = collections.deque()
        self._in_flight: set[Job] = set()
        self._seq = 0
        self._latest_hover = 0
        self._generation = 0
        self._last_delivered = 0
        self._last_move_at: float | None = None
        self._closed = False
        self.stats = SchedulerStats()
        self._workers = [
            threading.Thread(target=self._work, name=f"triton-sam-decode-{i}", daemon=True) for i in range(max_in_flight)
        ]
        for worker in self._workers:
            worker.start()

    @property
    def latest_hover_seq(self) -> int:
        """Sequence number of the newest hover job submitted."""
        with self._cond:
            return self._latest_hover

    @property
    def idle(self) -> bool:
        """Nothing pending and nothing running."""
        with self._cond:
            return not self._in_flight and self._pending_hover is None and not self._prompts

    @property
    def in_flight(self) -> int:
        with self._cond:
            return len(self._in_flight)

    def hover(self, run: Callable[[CancelToken], Any], t_event: float | None = None) -> int:
        """Ask for the preview at a new cursor position; older hover work is superseded."""
        with self._cond:
            job = self._new_job(HOVER, run, t_event)
            self._latest_hover = job.seq
            if self._pending_hover is not None:
                self.stats.superseded += 1
            self._moved(job.t_submitted)
            self._pending_hover = job
            self._cancel_running(self._supersede_now)
            self._cond.notify_all()  # the workers, and a `wait_for_hover`
        return job.seq

    def _moved(self, now: float) -> None:
        """The cursor moved at `now`: learn the gap since its last move (pauses excluded)."""
        if self._last_move_at is not None and (gap_s := now - self._last_move_at) < MAX_MOVE_GAP_S:
            if self._typical_gap_s is None:
                self._typical_gap_s, self._gap_deviation_s = gap_s, gap_s / 2
            else:
                self._gap_deviation_s = _moving_average(self._gap_deviation_s, abs(gap_s - self._typical_gap_s))
                self._typical_gap_s = _moving_average(self._typical_gap_s, gap_s)
        self._last_move_at = now

    @property
    def settle_s(self) -> float:
        """How long a pending hover job waits for a newer one before it starts."""
        with self._cond:
            return self._settle_s()

    def _settle_s(self) -> float:
        if not self.settle or self._typical_gap_s is None:
            return 0.0
        return min(MAX_SETTLE_S, self._typical_gap_s + SETTLE_DEVIATIONS * self._gap_deviation_s + SETTLE_MARGIN_S)

    def _supersede_now(self, job: Job) -> bool:
        """Whether a running job that a newer hover supersedes should be cancelled now.

        Cancelling is free locally (ONNX Runtime stops at once), but through a server every
        cancel-and-resend costs more than letting a short decode finish, so there only overdue
        jobs are cancelled.
        """
        if job.kind != HOVER:
            return False
        if self.cancel_running == CANCEL_ALWAYS or self._typical_run_s is None:
            return True
        return self._clock() - job.t_started > OVERDUE_FACTOR * self._typical_run_s

    def prompt(self, run: Callable[[CancelToken], Any], t_event: float | None = None) -> int:
        """Queue a job that changes the object (a click); it is never dropped.

        Hover work from before the click is stale: it did not see the new prompt.
        """
        with self._cond:
            self._drop_hovers()
            job = self._new_job(PROMPT, run, t_event)
            self._prompts.append(job)
            self._cond.notify()
        return job.seq

    def count_skipped_event(self) -> None:
        """Record a hover event the caller chose not to send (a move below its threshold).

        The cursor still moves, so a pending hover job waits on as for any move.
        """
        with self._cond:
            self.stats.events += 1
            self.stats.skipped += 1
            self._moved(self._clock())

    def clear(self, prompts: bool = False) -> None:
        """Forget hover work (cursor left the image); with `prompts`, prompt work too (discard, commit)."""
        with self._cond:
            self._drop_hovers()
            if prompts:
                self.stats.superseded += len(self._prompts)
                self._prompts.clear()
                self._cancel_running(lambda j: j.kind == PROMPT)

    def _drop_hovers(self) -> None:
        """Make every hover job so far stale: drop the pending one, cancel the running ones."""
        self._generation += 1
        if self._pending_hover is not None:
            self.stats.superseded += 1
            self._pending_hover = None
            self._cond.notify_all()  # a `wait_for_hover`: it will not be answered
        self._cancel_running(lambda j: j.kind == HOVER)

    def wait_for_hover(self, timeout_s: float) -> bool:
        """Wait until the newest hover job has been answered (delivered or failed) or will not be
        (dropped, cancelled); False on timeout. A key pressed just after a move means that move."""
        with self._cond:
            seq = self._latest_hover
            return self._cond.wait_for(
                lambda: (
                    (self._pending_hover is None or self._pending_hover.seq != seq)
                    and not any(job.seq == seq for job in self._in_flight)
                ),
                timeout_s,
            )

    def is_current(self, seq: int) -> bool:
        """Whether a delivered result is still the newest (for a final check on the GUI thread)."""
        with self._cond:
            return seq == self._last_delivered and seq >= self._latest_hover

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel everything and stop the workers; no thread outlives this call."""
        with self._cond:
            self._closed = True
            self._pending_hover = None
            self._prompts.clear()
            self._cancel_running(lambda j: True)
            self._cond.notify_all()
        for worker in self._workers:
            worker.join(timeout_s)

    def __enter__(self) -> DecodeScheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _new_job(self, kind: str, run, t_event: float | None) -> Job:
        if self._closed:
            raise RuntimeError("the decoder is closed")
        self._seq += 1
        if kind == HOVER:
            self.stats.events += 1
        now = self._clock()
        return Job(kind, run, self._seq, self._generation, now if t_event is None else t_event, now)

    def _cancel_running(self, which: Callable[[Job], bool]) -> None:
        for job in self._in_flight:
            if which(job):
                job.token.cancel()

    def _next_job(self) -> Job | None:
        """Wait for work; prompts go first, a hover once it has settled. None when closed."""
        with self._cond:
            while not self._closed and not self._prompts:
                if self._pending_hover is None:
                    self._cond.wait()
                    continue
                wait_s = self._last_move_at + self._settle_s() - self._clock()
                if wait_s <= 0:
                    break
                self._cond.wait(wait_s)
            if self._closed:
                return None
            if self._prompts:
                job = self._prompts.popleft()
            else:
                job, self._pending_hover = self._pending_hover, None
            self._in_flight.add(job)
            self.stats.sent += 1
            job.t_started = self._clock()
            return job

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            try:
                self._run(job)
            finally:  # in flight until delivered: `wait_for_hover` returns once the preview is out
                with self._cond:
                    self._in_flight.discard(job)
                    self._cond.notify_all()

    def _run(self, job: Job) -> None:
        try:
            value, error = job.run(job.token), None
        except DecodeCancelled:
            with self._cond:
                self.stats.cancelled += 1
            return
        except Exception as exc:  # an engine error must not kill the worker; report it
            value, error = None, exc
        self._finish(job, value, error)

    def _finish(self, job: Job, value: Any, error: Exception | None) -> None:
        with self._cond:
            if job.token.cancelled:  # finished anyway (the engine could not stop it): not shown
                self.stats.cancelled += 1
                return
            if error is not None:
                self.stats.failed += 1
            else:
                self.stats.executed += 1
                self.stats.run_s.append(self._clock() - job.t_started)
                self._typical_run_s = _moving_average(self._typical_run_s, self.stats.run_s[-1])
            hover_current = job.generation == self._generation and job.seq == self._latest_hover
            current = job.seq > self._last_delivered and (job.kind == PROMPT or hover_current)
            if error is None and not current:
                self.stats.stale_dropped += 1
                return
            if error is None:
                self._last_delivered = job.seq
                latency = self._clock() - job.t_event
                self.stats.delivered += 1
                self.stats.hovers_delivered += job.kind == HOVER
                self.stats.latencies_s.append(latency)
        if error is not None:
            self._on_error(error)
            return
        self._deliver(Delivery(job.kind, job.seq, value, latency, job.t_event))


def latency_percentiles(latency_ms) -> dict[str, float | None]:
    """p50, p95 and p99 of latencies in milliseconds (None for none): the one format of latency figures."""
    latency = np.asarray(latency_ms, dtype=float)
    return {f"p{p}": float(np.percentile(latency, p)) if latency.size else None for p in (50, 95, 99)}


def _moving_average(average: float | None, sample: float) -> float:
    """Exponential moving average that follows recent samples (weight 0.2 for the newest)."""
    return sample if average is None else 0.8 * average + 0.2 * sample
