"""A pytest plugin that reports memory as `--durations` reports time: each test's peak and growth.

A background thread samples the machine's used memory (MemTotal - MemAvailable, what CI's OOM
killer is about) every 0.2 s, and this run's own processes (pytest and its children: servers,
exports; the figure that holds on a shared machine) each second: listing them costs ~3 ms. The
terminal summary lists the tests with the highest peaks and the largest growth; with
TRITON_SAM_TEST_MEMORY=path every test's figures are also written there as JSON.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import pytest

ENV_JSON = "TRITON_SAM_TEST_MEMORY"
INTERVAL_S = 0.2
TREE_EVERY = 5  # samples: the process tree once a second
SHOWN = 10
MIB = 1024 * 1024


def used_mib() -> int:
    """The machine's memory in use (MemTotal - MemAvailable), as .ci/run samples it."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])) // 1024


def tree_mib(process: psutil.Process) -> int:
    """Resident memory of this process and all its descendants (Triton servers, exports)."""
    total = 0
    for member in (process, *process.children(recursive=True)):
        try:
            total += member.memory_info().rss
        except psutil.Error:  # ended between listing and reading
            pass
    return total // MIB


@dataclass
class TestMemory:
    """One test's figures in MiB: its peaks (setup and teardown included) and what it left in use."""

    nodeid: str
    peak: int
    growth: int
    tree_peak: int
    tree_growth: int


class MemorySampler:
    """Keeps the highest machine and process-tree memory seen since the last `reset`."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.lock = threading.Lock()
        self.peak = self.tree_peak = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def start(self) -> None:
        self.reset()
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()

    def sample(self, tree: bool = True) -> tuple[int, int]:
        """Take one sample now; (machine used, process tree or 0 without `tree`) in MiB."""
        used, mine = used_mib(), tree_mib(self.process) if tree else 0
        with self.lock:
            self.peak, self.tree_peak = max(self.peak, used), max(self.tree_peak, mine)
        return used, mine

    def reset(self) -> tuple[int, int]:
        """Start a new peak from the present figures, which it returns."""
        with self.lock:
            self.peak = self.tree_peak = 0
        return self.sample()

    def _run(self) -> None:
        ticks = 0
        while not self.stopped.wait(INTERVAL_S):
            ticks += 1
            self.sample(tree=ticks % TREE_EVERY == 0)


class MemoryReport:
    """Registered as a plugin: measures each test's whole protocol and prints the summary."""

    def __init__(self) -> None:
        self.sampler = MemorySampler()
        self.tests: list[TestMemory] = []

    def pytest_sessionstart(self) -> None:
        self.sampler.start()

    def pytest_sessionfinish(self) -> None:
        self.sampler.stop()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        used, tree = self.sampler.reset()
        yield
        used_after, tree_after = self.sampler.sample()
        with self.sampler.lock:
            peak, tree_peak = self.sampler.peak, self.sampler.tree_peak
        self.tests.append(TestMemory(item.nodeid, peak, used_after - used, tree_peak, tree_after - tree))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.tests:
            return
        for title, key in (("highest memory peaks", "peak"), ("largest memory growth", "growth")):
            terminalreporter.write_sep("=", f"{title} (MiB: machine used, this run's processes)")
            for test in sorted(self.tests, key=lambda test: getattr(test, key), reverse=True)[:SHOWN]:
                mine = getattr(test, f"tree_{key}")
                terminalreporter.write_line(f"{getattr(test, key):>7} {mine:>7}  {test.nodeid}")
        if path := os.environ.get(ENV_JSON):
            Path(path).write_text(json.dumps([asdict(test) for test in self.tests], indent=1))
            terminalreporter.write_line(f"memory of each test written to {path}")


def pytest_configure(config) -> None:
    config.pluginmanager.register(MemoryReport(), "memory_report_summary")
