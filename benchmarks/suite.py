"""`python -m benchmarks all`: every benchmark in one command, results in one JSON file.

Each benchmark runs with the settings of the chosen profile ("full" for published figures,
"smoke" to check in seconds that they all run) in a process of its own, so that none inherits
another's memory, threads or warm caches, and its result is written to the file as soon as it is
done: an interrupted run keeps what it measured. The smoke profile starts two Triton servers for the
benchmarks that would each start their own: one on the default settings, one with the session
model's batching switched the other way. The napari benchmarks need a display (they run under
`xvfb-run` where there is none).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path

import psutil

from triton_sam.gpu import cuda_device_count
from triton_sam.registry import DEFAULT_MODEL

from .fixtures import exported_repository
from .wire import loopback_server, shared_servers

PROFILES: dict[str, dict[str, dict]] = {
    "full": {
        "predictor": {"encodes": 2, "decodes": 20},
        "triton": {"encodes": 2, "decodes": 30, "clients": (1, 4, 16), "duration_s": 2.0, "tiles": 8},
        "hover": {"duration_s": 60.0},  # ~54 previews per backend: enough for a p95
        "click": {"clicks": 20},
        "annotators": {"counts": (1, 4, 16, 32), "duration_s": 6.0},
        "servers": {"counts": (16, 32), "duration_s": 6.0},
        "memory": {"client_counts": (1, 10, 100), "soak_s": 150.0, "sample_s": 10.0},
        "gui": {"hover_s": 20.0},
        "series_gui": {"commits": 20},
        "large": {"hover_s": 10.0},
        "volume": {"planes": 20, "repeats": 2},
        "automatic": {"repeats": 2},
        "microsam": {"repeats": {"encode": 2, "predict": 10}},
        "instance": {"repeats": {"encode": 1, "predict": 5, "instance": 2}},
        "concepts": {"images": 2, "prompts": 2},  # SAM3: its export alone takes ~12 GB
    },
    "smoke": {
        # No warm-up where a benchmark has one: a smoke run checks that it runs, not its figures.
        "predictor": {"encodes": 1, "decodes": 2, "warm_up": False},
        "triton": {"encodes": 1, "decodes": 2, "clients": (2,), "duration_s": 0.5, "lock_calls": 1, "tiles": 1, "warm_up": False},
        "hover": {"duration_s": 1.0, "yardstick": 1},
        "click": {"clicks": 2},
        "annotators": {"counts": (1, 2), "duration_s": 1.0},
        "memory": {"client_counts": (1, 3), "server_counts": (1,), "soak_s": 4.0, "sample_s": 1.0, "segment_all": ()},
        "gui": {"hover_s": 1.0, "objects": 3, "planes": 2},  # encode all: one plane more
        "series_gui": {"commits": 2},
        # One row of tiles, the view narrower than a tile's own part: one tile to encode at Start and
        # one more after the pan (the encodes are its time; a 4096 x 4096 plane's view met three).
        # The multiscale plane alone, in the suite's child: the numpy plane's own child took ~40 s of CI.
        "large": {
            "hover_s": 1.0,
            "planes": ("multiscale",),
            "backends": ("local",),
            "shape": (1024, 4096),
            "timed_tiles": 1,
            "window": (1000, 700),
        },
        "volume": {"planes": 2, "repeats": 1, "shape": (128, 128), "backends": ("local",)},
        "automatic": {"repeats": 1, "shape": (128, 128), "backends": ("local",), "points_per_side": 4},
        # MobileSAM-sized vit_t_lm alone, no warm-up: it checks that micro-sam's path and ours run and agree.
        "microsam": {
            "models": ("vit_t_lm",),
            "shapes": ((512, 512),),
            "repeats": {"encode": 1, "predict": 1},
            "backends": ("local",),
            "warm_up": False,
        },
    },
}


def machine() -> dict:
    """What the figures were measured on."""
    cpu = platform.processor()
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    versions = {}
    for package in ("triton-sam", "onnxruntime-gpu", "onnxruntime", "torch", "napari", "tritonclient"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cuda_devices": cuda_device_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


# Where one server may serve several benchmarks: the smoke profile only checks that each runs (a
# server start is seconds of it); the full profile gives each its own server, so that none
# measures another's cache, memory or warm-up.
SHARED_SERVER_PROFILES = ("smoke",)
SHARE_THE_SERVER = ("triton", "hover", "click", "gui", "memory", "annotators")  # each starts one on the default settings
SHARE_THE_OTHER_SERVER = ("triton", "annotators")  # and one with the session model's batching switched the other way

RUNNERS = {
    "predictor": "benchmarks.predictor",
    "triton": "benchmarks.triton",
    "hover": "benchmarks.hover",
    "click": "benchmarks.click",
    "annotators": "benchmarks.annotators",
    "servers": "benchmarks.servers",
    "memory": "benchmarks.memory",
    "gui": "benchmarks.gui",
    "series_gui": "benchmarks.series_gui",
    "large": "benchmarks.large",
    "volume": "benchmarks.volume",
    "automatic": "benchmarks.automatic",
    "microsam": "benchmarks.microsam",
    "instance": "benchmarks.instance",
    "concepts": "benchmarks.concepts",
}
IN_NAPARI = ("gui", "series_gui", "large")  # benchmarks that need a display


def run_in_child(name: str, options: dict, model_id: str, seed: int, workdir: Path, env: dict[str, str] | None = None) -> dict:
    """Run benchmark `name` in a child process (this module's `__main__`), with `env` added to its
    environment; its result, or why not."""
    command = [sys.executable, "-m", "benchmarks.suite", name, json.dumps(options), model_id, str(seed), str(workdir)]
    if name in IN_NAPARI and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        if shutil.which("xvfb-run") is None:
            return {"skipped": "no display and no xvfb-run"}
        command = ["xvfb-run", "-a", *command]
    path = os.pathsep.join(p for p in (str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"failed": done.returncode, "stderr_tail": done.stderr[-3000:]}
    return json.loads(lines[-1])


def run_all(
    output: Path,
    profile: str = "full",
    model_id: str = DEFAULT_MODEL,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    only: tuple[str, ...] | None = None,
    soak_s: float | None = None,
    progress: Callable[[str], None] = print,
) -> dict:
    """Run the benchmarks of `profile` (or `only` those) and write their results to `output`.
    On a machine with a GPU the official predictor runs there.

    `soak_s` overrides the profile's memory soak (the full profile keeps it short to stay within
    15 minutes; `--soak-minutes 10` for the long one).
    """
    settings = {name: dict(options) for name, options in PROFILES[profile].items()}
    if cuda_device_count() > 0:  # the official predictor on the GPU too
        settings["predictor"]["device"] = settings["click"]["device"] = settings["volume"]["device"] = "cuda"
        settings["automatic"]["device"] = settings["microsam"]["device"] = "cuda"
        for name in ("instance", "concepts"):  # the full profile's only: too heavy for a smoke run
            if name in settings:
                settings[name]["device"] = "cuda"
    if soak_s is not None:
        settings["memory"]["soak_s"] = soak_s
    results = {"profile": profile, "model": model_id, "machine": machine(), "seconds": {}, "results": {}}
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    names = [name for name in settings if not only or name in only]
    with ExitStack() as stack:
        env = {}
        if profile in SHARED_SERVER_PROFILES and set(names) & set(SHARE_THE_SERVER):
            progress("Triton servers for the benchmarks that would each start their own ...")
            repository = exported_repository(model_id, seed, workdir)
            servers = [stack.enter_context(loopback_server(repository, model_id))]
            if set(names) & set(SHARE_THE_OTHER_SERVER):
                batching = not servers[0].session_batching
                servers.append(stack.enter_context(loopback_server(repository, model_id, session_batching=batching)))
            env = shared_servers(model_id, *servers)
        for name in names:
            progress(f"bench {name} ...")
            started = time.perf_counter()
            results["results"][name] = run_in_child(name, settings[name], model_id, seed, workdir, env)
            results["seconds"][name] = round(time.perf_counter() - started, 1)
            output.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":  # one benchmark, for `run_in_child`: name, options (JSON), model, seed, workdir
    from importlib import import_module

    name, options, model_id, seed, workdir = sys.argv[1:]
    run = import_module(RUNNERS[name]).run
    print(json.dumps(run(model_id, seed=int(seed), workdir=Path(workdir), **json.loads(options))))
