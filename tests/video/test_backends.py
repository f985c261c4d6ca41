"""Each engine says where volumes run (`Engine.video`): `video/` never asks which engine it has,
and with backend "auto" objects are tracked on the server while it answers, through the features
the interactive session already holds (no second, local engine)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from conftest import require_export_extra
from triton_sam import video
from triton_sam.engines import create_engine
from triton_sam.engines.local_video import LocalVideo
from triton_sam.engines.triton_video import TritonVideo
from triton_sam.features import FeatureCache
from triton_sam.video import VolumePredictor

MODEL = "sam2.1_hiera_tiny"
CONCRETE_ENGINE_MODULES = ("local", "local_video", "triton", "triton_video", "fallback", "connection", "providers")


def _imported_modules(path: Path) -> set[str]:
    """Modules a file of `triton_sam.video` imports, as absolute names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "triton_sam.video".rsplit(".", node.level - 1)[0] if node.level else ""
            module = f"{base}.{node.module}" if base and node.module else base or node.module
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_video_imports_no_concrete_engine_and_checks_no_engine_type():
    files = sorted(Path(video.__file__).parent.glob("*.py"))
    assert files
    for path in files:
        imported = _imported_modules(path)
        concrete = {f"triton_sam.engines.{name}" for name in CONCRETE_ENGINE_MODULES}
        assert not imported & concrete, f"{path.name} imports {sorted(imported & concrete)}"
        assert not any(name.rsplit(".", 1)[-1] in ("LocalEngine", "TritonEngine", "FallbackEngine") for name in imported)
        assert "LocalEngine" not in path.read_text() and "TritonEngine" not in path.read_text(), path.name


def _volume() -> np.ndarray:
    """Three planes: a prompted one, then one tracked from its memory and one from both."""
    rng = np.random.default_rng(0)
    volume = rng.integers(0, 60, (3, 64, 80), dtype=np.uint8)
    for z in range(3):
        volume[z, 20 : 40 + z, 25 : 45 + z] = 200
    return volume


def _masks(predictor: VolumePredictor) -> dict[int, np.ndarray]:
    state = predictor.init_state(_volume())
    predictor.add_new_points_or_box(state, 0, 1, points=[[30, 30]], labels=[1])
    return {frame: logits > 0 for frame, _, logits in predictor.propagate_in_video(state)}


def test_auto_tracks_on_the_server_through_the_sessions_features(request, exported_repository):
    """With backend "auto" and a server that answers, a lent cache's engine tracks there: the
    predictor makes no engine of its own and the masks are those of backend "triton"."""
    require_export_extra()
    url = request.getfixturevalue("models_server").grpc_url
    with VolumePredictor(MODEL, backend="triton", url=url) as on_server:
        expected = _masks(on_server)
    engine = create_engine(on_server.spec, "auto", exported_repository(MODEL), url=url)
    try:
        cache = FeatureCache(engine)
        with VolumePredictor(MODEL, cache=cache) as ours:
            assert ours.engine is engine and isinstance(ours.video, TritonVideo)
            masks = _masks(ours)
    finally:
        engine.close()
    assert sorted(masks) == sorted(expected) == [0, 1, 2]
    for frame, mask in expected.items():
        np.testing.assert_array_equal(masks[frame], mask)


def test_auto_without_a_server_tracks_locally(exported_repository):
    require_export_extra()
    with VolumePredictor(MODEL, backend="auto", model_repository=exported_repository(MODEL), url="127.0.0.1:9") as ours:
        assert ours.engine.fallback_reason is not None and isinstance(ours.video, LocalVideo)
        assert sorted(_masks(ours)) == [0, 1, 2]


def test_an_engine_that_cannot_track_says_so(exported_repository):
    from triton_sam.engines.base import Engine
    from triton_sam.errors import InvalidInputError
    from triton_sam.registry import get_model

    class Plain(Engine):
        def __init__(self, spec):
            self.spec = spec

        def encode(self, image):
            raise AssertionError

        def decode(self, features, request, multimask_output=True, cancel=None):
            raise AssertionError

    with pytest.raises(InvalidInputError, match="cannot track objects through volumes"):
        VolumePredictor(MODEL, cache=FeatureCache(Plain(get_model(MODEL))))
