"""The latest-wins scheduler with fake jobs of controllable latency: the guarantees hold."""

from __future__ import annotations

import random
import threading
import time

import pytest

from triton_sam.errors import DecodeCancelled
from triton_sam.speculative import HOVER, PROMPT, DecodeScheduler


class FakeEngine:
    """Decodes that take `latency_s`, honour (or ignore) cancellation, and record what happened."""

    def __init__(self, latency_s: float = 0.01, cancellable: bool = True) -> None:
        self.latency_s = latency_s
        self.cancellable = cancellable
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0
        self.started: list[str] = []
        self.cancelled_in_engine: list[str] = []
        self.completed: list[str] = []

    def job(self, name: str):
        def run(token):
            with self.lock:
                self.running += 1
                self.max_running = max(self.max_running, self.running)
                self.started.append(name)
            try:
                deadline = time.monotonic() + self.latency_s
                while time.monotonic() < deadline:
                    if self.cancellable and token.cancelled:
                        with self.lock:
                            self.cancelled_in_engine.append(name)
                        raise DecodeCancelled(name)
                    time.sleep(0.0005)
                with self.lock:
                    self.completed.append(name)
                return name
            finally:
                with self.lock:
                    self.running -= 1

        return run


class Recorder:
    def __init__(self) -> None:
        self.deliveries = []
        self.lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, delivery) -> None:
        with self.lock:
            self.deliveries.append(delivery)
        self.done.set()


def _wait_idle(decoder: DecodeScheduler, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = decoder.stats
        settled = stats.cancelled + stats.executed + stats.failed
        if settled == stats.sent and decoder.in_flight == 0 and decoder._pending_hover is None and not decoder._prompts:
            return
        time.sleep(0.005)
    raise AssertionError("decoder did not go idle")


@pytest.mark.parametrize("max_in_flight", [1, 2, 3])
def test_never_more_than_n_in_flight_and_the_last_event_gets_its_result(max_in_flight):
    engine = FakeEngine(latency_s=0.004)
    recorder = Recorder()
    with DecodeScheduler(recorder, max_in_flight=max_in_flight) as decoder:
        rng = random.Random(max_in_flight)
        for i in range(300):
            decoder.hover(engine.job(f"h{i}"))
            time.sleep(rng.choice([0, 0.0005, 0.002, 0.008]))  # bursts and pauses
        last = decoder.hover(engine.job("last"))
        _wait_idle(decoder)
    assert engine.max_running <= max_in_flight
    assert recorder.deliveries[-1].seq == last and recorder.deliveries[-1].value == "last"
    stats = decoder.stats
    assert stats.events == 301 and stats.sent + stats.superseded == 301
    assert stats.sent < 301  # latest-wins dropped work


def test_a_sweep_starts_no_decodes_until_the_cursor_rests_and_then_the_last_one_is_shown():
    engine = FakeEngine(latency_s=0.02)
    recorder = Recorder()
    clock = FakeClock()  # the strokes' timing is the test's, not the (busy) machine's
    with DecodeScheduler(recorder, clock=clock) as decoder:
        for stroke in range(3):
            for i in range(40):  # a stroke at 200 Hz
                decoder.hover(engine.job(f"s{stroke}-{i}"))
                clock.advance(0.005)
                time.sleep(0.001)  # real time for the worker, which must go on waiting
            assert decoder.settle_s > 0.005  # learnt from the gaps
            recorder.done.clear()
            clock.advance(0.1)  # the cursor rests
            assert recorder.done.wait(2), "the rest after a stroke got no preview"
        _wait_idle(decoder)
    # The very first move starts at once (no gap learnt yet); after it, only each stroke's last move.
    assert engine.started == ["s0-0", "s0-39", "s1-39", "s2-39"]
    assert [d.value for d in recorder.deliveries] == ["s0-39", "s1-39", "s2-39"]


def test_without_settling_every_rested_event_starts_at_once():
    engine = FakeEngine(latency_s=0.001)
    recorder = Recorder()
    with DecodeScheduler(recorder, settle=False) as decoder:
        for i in range(20):
            decoder.hover(engine.job(f"h{i}"))
            time.sleep(0.01)
        _wait_idle(decoder)
    assert decoder.settle_s == 0.0 and len(engine.started) == 20


class FakeClock:
    """The scheduler's clock, moved by the test (its waits still pass in real time)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("gaps_s", "low_s", "high_s"),
    [([0.008] * 30, 0.008, 0.0095), ([0.004, 0.012] * 15, 0.02, 0.03)],
    ids=["steady", "jittery"],
)
def test_the_settle_wait_is_the_usual_gap_plus_a_margin_that_grows_with_jitter(gaps_s, low_s, high_s):
    clock = FakeClock()
    with DecodeScheduler(Recorder(), clock=clock) as decoder:
        for gap_s in gaps_s:
            decoder.hover(lambda token: None)
            clock.advance(gap_s)
        assert low_s < decoder.settle_s <= high_s


def test_moves_too_small_to_send_keep_a_pending_hover_waiting_until_the_cursor_rests():
    engine = FakeEngine(latency_s=0.001)
    recorder = Recorder()
    clock = FakeClock()
    with DecodeScheduler(recorder, clock=clock) as decoder:
        for i in range(20):
            decoder.hover(engine.job(f"h{i}"))
            clock.advance(0.008)
        last = decoder.hover(engine.job("last"))
        for _ in range(10):  # the cursor creeps on by moves below the caller's threshold
            clock.advance(0.008)
            decoder.count_skipped_event()
            time.sleep(0.02)  # real time for the worker, which must go on waiting
        assert "last" not in engine.started
        clock.advance(0.05)  # the cursor rests
        _wait_idle(decoder)
    assert engine.started[-1] == "last" and recorder.deliveries[-1].seq == last
    assert decoder.stats.skipped == 10


def test_a_superseded_running_job_is_cancelled_in_the_engine_and_never_delivered():
    engine = FakeEngine(latency_s=0.5)
    recorder = Recorder()
    with DecodeScheduler(recorder) as decoder:
        decoder.hover(engine.job("old"))
        while "old" not in engine.started:
            time.sleep(0.001)
        newest = decoder.hover(engine.job("new"))
        _wait_idle(decoder)
    assert engine.cancelled_in_engine == ["old"]
    assert [d.value for d in recorder.deliveries] == ["new"] and recorder.deliveries[0].seq == newest
    assert decoder.stats.cancelled == 1


def test_a_result_that_finished_after_being_superseded_is_not_delivered():
    engine = FakeEngine(latency_s=0.2, cancellable=False)  # like an ORT backend run: cannot stop
    recorder = Recorder()
    with DecodeScheduler(recorder, max_in_flight=2) as decoder:
        decoder.hover(engine.job("old"))
        while "old" not in engine.started:
            time.sleep(0.001)
        engine.latency_s = 0.3
        decoder.hover(engine.job("new"))
        _wait_idle(decoder)
    assert sorted(engine.completed) == ["new", "old"]
    assert [d.value for d in recorder.deliveries] == ["new"]


def test_delivered_results_are_always_the_newest_under_random_load():
    engine = FakeEngine(latency_s=0.003, cancellable=False)
    delivered = []
    submitted = []
    lock = threading.Lock()

    def deliver(delivery) -> None:
        with lock:
            # Every hover submitted before this delivery's job must not be newer than it, except
            # those submitted after the job finished (they are delivered later or dropped).
            delivered.append((delivery.seq, max(submitted)))

    # No settling: every hover starts at once, so decodes overlap and finish out of order (with the
    # settle wait a burst can leave only a couple of decodes, and nothing to order).
    with DecodeScheduler(deliver, max_in_flight=3, settle=False) as decoder:
        for i in range(400):
            with lock:
                submitted.append(decoder.hover(engine.job(f"h{i}")))
            time.sleep(random.choice([0, 0.001, 0.004]))
        _wait_idle(decoder)
    seqs = [seq for seq, _ in delivered]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # never an older result after a newer one
    assert delivered[-1][0] == submitted[-1]
    assert decoder.stats.stale_dropped + decoder.stats.cancelled > 0


def test_clicks_are_never_dropped_and_run_in_order_before_pending_hovers():
    engine = FakeEngine(latency_s=0.01)
    recorder = Recorder()
    with DecodeScheduler(recorder) as decoder:
        for i in range(30):
            decoder.hover(engine.job(f"h{i}"))
            if i % 3 == 0:
                decoder.prompt(engine.job(f"p{i}"))
        _wait_idle(decoder)
    prompts_run = [name for name in engine.completed if name.startswith("p")]
    assert prompts_run == [f"p{i}" for i in range(0, 30, 3)]
    assert not [n for n in engine.cancelled_in_engine if n.startswith("p")]
    kinds = [d.kind for d in recorder.deliveries]
    assert PROMPT in kinds and kinds[-1] in (PROMPT, HOVER)


def test_a_click_makes_earlier_hover_work_stale():
    engine = FakeEngine(latency_s=0.2)
    recorder = Recorder()
    with DecodeScheduler(recorder) as decoder:
        decoder.hover(engine.job("before-click"))
        while "before-click" not in engine.started:
            time.sleep(0.001)
        decoder.prompt(engine.job("click"))
        _wait_idle(decoder)
    assert [d.value for d in recorder.deliveries] == ["click"]
    assert engine.cancelled_in_engine == ["before-click"]


def test_clear_cancels_hovers_and_optionally_prompts():
    engine = FakeEngine(latency_s=0.3)
    recorder = Recorder()
    with DecodeScheduler(recorder) as decoder:
        decoder.prompt(engine.job("p"))
        while "p" not in engine.started:
            time.sleep(0.001)
        decoder.clear()  # cursor left: the click's decode continues
        _wait_idle(decoder)
        assert [d.value for d in recorder.deliveries] == ["p"]
        decoder.prompt(engine.job("p2"))
        while "p2" not in engine.started:
            time.sleep(0.001)
        decoder.clear(prompts=True)  # object discarded
        _wait_idle(decoder)
    assert [d.value for d in recorder.deliveries] == ["p"] and "p2" in engine.cancelled_in_engine


def test_waiting_for_the_newest_hover_ends_once_its_preview_is_delivered():
    delivered = []

    def slow_delivery(delivery) -> None:  # the session shows it under its lock: not instant
        time.sleep(0.05)
        delivered.append(delivery.value)

    engine = FakeEngine(latency_s=0.1)
    with DecodeScheduler(slow_delivery) as decoder:
        decoder.hover(engine.job("old"))
        decoder.hover(engine.job("newest"))
        assert decoder.wait_for_hover(5.0)
        assert delivered == ["newest"]


@pytest.mark.parametrize("ending", ["cleared", "failed", "timeout"])
def test_waiting_for_a_hover_that_will_not_be_delivered_ends_without_it(ending):
    engine = FakeEngine(latency_s=0.3 if ending != "timeout" else 5.0)
    recorder = Recorder()

    def broken(token):
        raise RuntimeError("server away")

    with DecodeScheduler(recorder, on_error=lambda error: None) as decoder:
        decoder.hover(broken if ending == "failed" else engine.job("h"))
        if ending == "cleared":
            threading.Timer(0.05, decoder.clear).start()  # the cursor left the image meanwhile
        started = time.monotonic()
        answered = decoder.wait_for_hover(0.5)
        waited = time.monotonic() - started
    assert recorder.deliveries == []
    assert answered == (ending != "timeout") and waited < (0.45 if ending != "timeout" else 1.0)


def test_an_engine_error_is_reported_and_the_worker_keeps_going():
    errors = []
    recorder = Recorder()

    def broken(token):
        raise RuntimeError("server exploded")

    with DecodeScheduler(recorder, on_error=errors.append) as decoder:
        decoder.hover(broken)
        _wait_idle(decoder)
        decoder.hover(FakeEngine(0.001).job("fine"))
        _wait_idle(decoder)
    assert [str(e) for e in errors] == ["server exploded"]
    assert [d.value for d in recorder.deliveries] == ["fine"]


def test_close_cancels_running_work_and_leaves_no_threads():
    before = set(threading.enumerate())
    engine = FakeEngine(latency_s=5.0)
    decoder = DecodeScheduler(Recorder(), max_in_flight=3)
    decoder.prompt(engine.job("slow-click"))
    decoder.prompt(engine.job("slow-click-2"))
    decoder.hover(engine.job("slow"))
    while len(engine.started) < 3:
        time.sleep(0.001)
    started = time.monotonic()
    decoder.close()
    assert time.monotonic() - started < 1.0
    assert set(threading.enumerate()) <= before
    assert sorted(engine.cancelled_in_engine) == ["slow", "slow-click", "slow-click-2"]
    with pytest.raises(RuntimeError, match="closed"):
        decoder.hover(engine.job("late"))


def test_latency_is_measured_from_the_event():
    recorder = Recorder()
    with DecodeScheduler(recorder) as decoder:
        t_event = time.perf_counter() - 0.05  # the event happened 50 ms ago
        decoder.hover(FakeEngine(0.01).job("h"), t_event=t_event)
        _wait_idle(decoder)
    (delivery,) = recorder.deliveries
    assert delivery.latency_s >= 0.06
    snapshot = decoder.stats.snapshot()
    assert snapshot["latency_ms"]["p50"] >= 60 and snapshot["delivered"] == 1
    assert 10 <= snapshot["run_ms"]["p50"] < snapshot["latency_ms"]["p50"] - 45  # the run alone: not the wait


def test_hover_previews_are_counted_apart_from_prompt_results():
    """The status tooltip's "N of M mouse moves previewed": clicks are results but no mouse moves."""
    engine, recorder = FakeEngine(0.005), Recorder()
    with DecodeScheduler(recorder) as decoder:
        for name in ("h1", "click", "h2", "click-2"):
            (decoder.prompt if name.startswith("click") else decoder.hover)(engine.job(name))
            _wait_idle(decoder)
    stats = decoder.stats
    assert (stats.delivered, stats.hovers_delivered, stats.events) == (4, 2, 2)


def test_overdue_policy_lets_a_short_running_job_finish_and_cancels_a_stuck_one():
    engine = FakeEngine(latency_s=0.1)
    recorder = Recorder()
    with DecodeScheduler(recorder, cancel_running="overdue") as decoder:
        decoder.hover(engine.job("warm"))  # teaches the scheduler a typical run (~0.1 s)
        _wait_idle(decoder)
        decoder.hover(engine.job("young"))
        while "young" not in engine.started:
            time.sleep(0.001)
        decoder.hover(engine.job("next"))  # supersedes "young" early: it is left to finish
        _wait_idle(decoder)
        assert "young" in engine.completed and "young" not in engine.cancelled_in_engine
        engine.latency_s = 5.0
        decoder.hover(engine.job("stuck"))
        while "stuck" not in engine.started:
            time.sleep(0.001)
        time.sleep(0.3)  # now running for more than 2x the typical 0.1 s
        engine.latency_s = 0.05
        decoder.hover(engine.job("last"))
        _wait_idle(decoder)
    assert "stuck" in engine.cancelled_in_engine
    assert [d.value for d in recorder.deliveries] == ["warm", "next", "last"]
