"""Shared fixtures: the synthetic model repository and (for parity tests) a real exported SAM2.1."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from benchmarks.fixtures import release_memory
from synthetic import write_repository
from synthetic_concepts import write_concepts
from triton_sam.registry import get_model
from triton_sam.server.local import loopback_ports

# Load torch's triton (it brings its own LLVM) before a GUI test makes Qt load Mesa's OpenGL: in the
# other order importing it (torchvision does, for MobileSAM) crashed when tests/plugin ran alone.
if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("triton") is not None:
    import torch._dynamo  # noqa: F401

# No time limit on a property test's example: the tests assert behaviour, never speed (hypothesis's
# 200 ms deadline failed a 1 x 1 tiling's example of test_tiles.py on a busy machine).
settings.register_profile("untimed", deadline=None)
settings.load_profile("untimed")

pytest_plugins = ["memory_report"]  # each test's memory peak and growth, in the summary beside --durations

SYNTHETIC_MODEL = "sam2.1_hiera_tiny"
PARITY_SEED = 0
TESTS = Path(__file__).parent
# Run first, before any server of the session starts and while this process holds little: the
# parity tests here hold the suite's largest models (SAM3's official model beside our export of it).
FIRST = TESTS / "export"


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not Path(item.path).is_relative_to(FIRST))  # stable: the rest keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After a module's last test: its fixtures (its models, its servers) are torn down, and pytest
    has let go of the values the test was given (`item.funcargs`, which a module-scoped fixture's
    teardown still sees: SAM3's local sessions, ~3 GB, stayed in this process until the next trim)."""
    result = yield
    if nextitem is None or nextitem.path != item.path:
        release_memory()
    return result


@pytest.fixture(scope="session", autouse=True)
def _mesa_shader_cache(tmp_path_factory):
    """One shader cache folder for the run: Mesa keeps the folder of the process's first GL context,
    and a test's private $XDG_CACHE_HOME (`private_settings`) is deleted as the test passes."""
    os.environ.setdefault("MESA_SHADER_CACHE_DIR", str(tmp_path_factory.mktemp("mesa_shader_cache")))


@pytest.fixture(scope="session")
def synthetic_repository(tmp_path_factory):
    """A model repository holding the synthetic model under the tiny model's names."""
    return write_repository(get_model(SYNTHETIC_MODEL), tmp_path_factory.mktemp("synthetic_repo"))


@pytest.fixture(scope="session")
def concepts_repository(tmp_path_factory):
    """A model repository holding the synthetic model under sam3_tracker's names, with synthetic
    concept graphs (`synthetic_concepts`)."""
    spec = get_model("sam3_tracker")
    repository = write_repository(spec, tmp_path_factory.mktemp("concepts_repo"))
    write_concepts(spec, repository)
    return repository


def require_export_extra():
    """Skip without torch/sam2 on a developer machine; fail in CI, where they must be installed."""
    if os.environ.get("CI"):
        import sam2  # noqa: F401
        import torch  # noqa: F401
    else:
        pytest.importorskip("torch")
        pytest.importorskip("sam2")


@pytest.fixture(scope="session")
def export_stderr():
    """What each export of `exported_repository` wrote to stderr, by model id."""
    return {}


@pytest.fixture(scope="session")
def exported_repository(tmp_path_factory, export_stderr):
    """`exported_repository(model_id)`: a repository holding that model with seeded random weights,
    exported through our own export code (once per model and test run)."""
    repositories = {}

    def export(model_id: str):
        if model_id not in repositories:
            require_export_extra()
            repository = tmp_path_factory.mktemp(f"{model_id}_repo")
            # As a user exports, and in a process of its own: tracing a model takes gigabytes that
            # the test process would otherwise keep (the suite's peak went from ~21 to ~19.5 GB).
            export_stderr[model_id] = cli_export(model_id, repository, "--random-init", "--seed", str(PARITY_SEED))
            repositories[model_id] = repository
        return repositories[model_id]

    return export


def cli_export(model_id: str, repository: Path, *options: str) -> str:
    """Run `triton-sam export model_id ... --output repository` in a process of its own; its stderr."""
    command = ["export", model_id, *options, "--output", str(repository)]
    done = subprocess.run([sys.executable, "-m", "triton_sam.cli", *command], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"triton-sam {' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return done.stderr


def run_reference(script_name: str, *arguments: str) -> str:
    """Run tests/export/`script_name` (an official model's reference, gigabytes that this process
    would otherwise keep) in a process of its own; its stdout."""
    script = FIRST / script_name
    path = os.pathsep.join(filter(None, (str(TESTS.parent), os.environ.get("PYTHONPATH"))))  # the checkout's benchmarks/
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, env=env)
    if done.returncode:
        pytest.fail(f"{script.name} failed:\n{done.stderr[-4000:]}")
    return done.stdout


@pytest.fixture(scope="session")
def sam3_export(exported_repository):
    """sam3_tracker exported with its concept graphs by `triton-sam export` (random weights of the
    parity seed): the graphs the sam3 parity tests compare with `sam3_reference`."""
    from triton_sam.repository import locate

    return locate(get_model("sam3_tracker"), exported_repository("sam3_tracker"))


@pytest.fixture(scope="session")
def sam3_reference(tmp_path_factory, sam3_export) -> Path:
    """The folder tests/export/sam3_reference.py fills: what sam3 computes with its image model,
    built once from the parity seed as the export builds it (`sam3_export`, exported first: the
    two never hold sam3 at once; minutes on 2 cores)."""
    require_export_extra()
    pytest.importorskip("sam3")
    directory = tmp_path_factory.mktemp("sam3_reference")
    print(run_reference("sam3_reference.py", str(directory), str(PARITY_SEED)))
    return directory


@pytest.fixture(scope="session")
def vit_b_lm_export(tmp_path_factory):
    """(checkpoint, decoder file, repository): random vit_b_lm files as micro-sam publishes them (plain
    weights and a separate `*_decoder.pt`), exported through `triton-sam export` (~35 s: shared)."""
    require_export_extra()
    pytest.importorskip("micro_sam")
    from benchmarks.microsam_checkpoints import PLAIN, write_checkpoint, write_decoder

    folder = tmp_path_factory.mktemp("vit_b_lm")
    checkpoint = write_checkpoint(folder / "vit_b_lm.pt", "vit_b", PARITY_SEED, PLAIN)
    decoder = write_decoder(folder / "vit_b_lm_decoder.pt", "vit_b", PARITY_SEED)
    cli_export("vit_b_lm", folder / "repo", "--checkpoint", str(checkpoint), "--decoder", str(decoder))
    return checkpoint, decoder, folder / "repo"


@pytest.fixture(scope="session")
def sam2_tiny_repository(exported_repository):
    """SAM2.1 hiera tiny with seeded random weights, exported through our own export code."""
    return exported_repository("sam2.1_hiera_tiny")


def require_server_env():
    """The server environment's python; skipped on a developer machine without one, required in CI."""
    from triton_sam.errors import TritonSamError
    from triton_sam.server.local import find_server_python

    try:
        return find_server_python()
    except TritonSamError:
        if os.environ.get("CI"):
            raise
        pytest.skip("no server environment (triton-sam server-env --path .venv-server)")


def require_haproxy() -> None:
    """Skip where HAProxy is not installed on a developer machine; fail in CI, where it must be."""
    from benchmarks.balancer import haproxy_binary

    if haproxy_binary() is None:
        if os.environ.get("CI"):
            raise RuntimeError("haproxy is not installed: scripts/install-system-packages.sh installs it")
        pytest.skip("haproxy is not installed (scripts/install-system-packages.sh installs it)")


def start_server(repository, timeout_s: float = 120.0, **options):
    """A real Triton server (`triton-sam serve` machinery) on free loopback ports, ready within `timeout_s`."""
    from triton_sam.server.local import LocalTritonServer

    require_server_env()
    server = LocalTritonServer(repository, **loopback_ports(), **options)
    return server.start(timeout_s)


# The shared servers are module-scoped: session-scoped, they stayed up from the first module that
# used them to the end of the run (~0.4 GB synthetic, ~3 GB the served models), to save a start of
# a few seconds in each module that uses them.
@pytest.fixture(scope="module")
def synthetic_server(synthetic_repository):
    server = start_server(synthetic_repository)
    yield server
    server.stop()


SERVED_MODELS = ("sam2.1_hiera_tiny", "mobile_sam")


@pytest.fixture(scope="module")
def models_server(exported_repository, tmp_path_factory):
    """One server for SAM2.1 tiny and MobileSAM side by side (seeded random weights)."""
    repository = tmp_path_factory.mktemp("served_repo")
    for model_id in SERVED_MODELS:
        for model_dir in exported_repository(model_id).iterdir():
            (repository / model_dir.name).symlink_to(model_dir, target_is_directory=True)
    server = start_server(repository)
    yield server
    server.stop()


@pytest.fixture
def private_settings(tmp_path, monkeypatch):
    """Keep the dock widget's saved settings away from the user's own, its default model
    repository away from the models the user exported (an empty folder), and its disk cache of
    embeddings (`$XDG_CACHE_HOME`) away from the user's and from other tests' (the test's own)."""
    from qtpy.QtCore import QSettings

    from triton_sam.repository import ENV_MODEL_REPOSITORY

    QSettings.setPath(QSettings.Format.NativeFormat, QSettings.Scope.UserScope, str(tmp_path))
    monkeypatch.setenv(ENV_MODEL_REPOSITORY, str(tmp_path / "no_models"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def viewer(make_napari_viewer, private_settings):
    """A shown napari viewer (a hidden canvas gets no mouse events), its settings private."""
    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(1000, 700)
    return viewer
