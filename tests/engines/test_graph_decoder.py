"""Decodes replayed as CUDA graphs (`engines/graph_decoder.py`, #38): on a CPU the same fixed
buffers, per-point-count sessions and feature copies run without capture, against the usual run."""

import logging
import threading

import numpy as np
import pytest

from triton_sam.engines.graph_decoder import DEVICE_WORK, graph_decoder
from triton_sam.engines.local import LocalEngine, graph_decodes_by_default
from triton_sam.prompts import model_request
from triton_sam.registry import get_model
from triton_sam.repository import locate
from triton_sam.server.models.triton_sam_graphs import MAX_POINTS, GraphDecoder

TINY = get_model("sam2.1_hiera_tiny")
SIZE = (600, 800)


def _image(seed: int) -> np.ndarray:
    image = np.random.default_rng(seed).integers(0, 60, (*SIZE, 3), dtype=np.uint8)
    image[200:400, 150 + 100 * seed : 450 + 100 * seed] = 230  # a bright object, elsewhere in each image
    return image


def _prompts(points: int, seed: int, mask: np.ndarray | None = None) -> dict:
    rng = np.random.default_rng(100 + seed)
    coords = rng.uniform([100, 100], [700, 500], (points, 2))
    return {"point_coords": coords, "point_labels": rng.integers(0, 2, points), "mask_input": mask}


def _engines(repository, feature_device: str | None = None):
    exported = locate(TINY, repository)
    replaying = LocalEngine(exported, graph_decodes=True, feature_device=feature_device)
    return replaying, LocalEngine(exported, graph_decodes=False)


@pytest.mark.parametrize(
    ("model", "feature_device"),
    [("synthetic", None), ("synthetic", "cpu"), ("exported", "cpu")],
    ids=["synthetic-numpy-features", "synthetic-buffer-features", "exported-buffer-features"],
)
def test_replayed_decodes_match_the_usual_run_as_images_and_point_counts_change(model, feature_device, request):
    """Features as numpy arrays are copied into the graphs' buffers from the host; as ONNX Runtime
    buffers (on a GPU: device memory) by the copy graph."""
    repository = request.getfixturevalue("synthetic_repository" if model == "synthetic" else "sam2_tiny_repository")
    replaying, usual = _engines(repository, feature_device)
    features = [replaying.encode(_image(i)) for i in range(2)]  # both engines decode the same features
    assert bool(features[0].device) == (feature_device is not None)
    previous, answers, counts = None, {}, set()
    for step, (image, points) in enumerate([(0, 1), (1, 1), (0, 2), (1, 3), (0, 1), (1, MAX_POINTS)]):
        request_ = model_request(TINY, SIZE, **_prompts(points, step, previous), best_of_multimask=True)
        ours = replaying.decode(features[image], request_, multimask_output=True)
        theirs = usual.decode(features[image], request_, multimask_output=True)
        np.testing.assert_allclose(ours.low_res_logits, theirs.low_res_logits, atol=1e-4)
        np.testing.assert_allclose(ours.scores, theirs.scores, atol=1e-5)
        answers[step] = ours.low_res_logits
        counts.add(request_.point_coords.shape[1])
        previous = ours.low_res_logits[:, :1]  # the next step refines with a mask input
    assert replaying.graph_decoder is not None  # nothing turned it off
    assert replaying.graph_decoder.point_counts == set(range(1, MAX_POINTS + 1)) and len(counts) >= 3  # all made at once
    assert not np.allclose(answers[0], answers[1])  # same prompt count, other image: a stale copy would show


def test_more_points_or_prompt_sets_than_a_graph_takes_run_as_usual(synthetic_repository):
    replaying, usual = _engines(synthetic_repository)
    features = replaying.encode(_image(0))
    many = model_request(TINY, SIZE, **_prompts(MAX_POINTS + 2, 0))
    np.testing.assert_allclose(
        replaying.decode(features, many).low_res_logits, usual.decode(usual.encode(_image(0)), many).low_res_logits, atol=1e-5
    )
    assert not GraphDecoder.handles(2, 1) and not GraphDecoder.handles(1, MAX_POINTS + 1)


def test_a_replay_off_the_usual_run_turns_the_graphs_off_and_the_usual_run_answers(synthetic_repository, monkeypatch, caplog):
    replaying, usual = _engines(synthetic_repository)
    features = replaying.encode(_image(0))
    real = GraphDecoder.decode
    monkeypatch.setattr(
        GraphDecoder, "decode", lambda self, *a: {n: o + 1.0 if n == "masks" else o for n, o in real(self, *a).items()}
    )
    request_ = model_request(TINY, SIZE, **_prompts(1, 0))
    with caplog.at_level(logging.WARNING):
        answer = replaying.decode(features, request_)
    np.testing.assert_allclose(answer.low_res_logits, usual.decode(usual.encode(_image(0)), request_).low_res_logits, atol=1e-5)
    assert replaying.graph_decoder is None
    assert "replayed as CUDA graphs are off" in caplog.text and "off the usual run" in caplog.text


def test_a_replay_giving_nan_turns_the_graphs_off(synthetic_repository, monkeypatch):
    replaying, usual = _engines(synthetic_repository)
    features = replaying.encode(_image(0))
    real = GraphDecoder.decode
    monkeypatch.setattr(
        GraphDecoder,
        "decode",
        lambda self, *a: {n: np.full_like(o, np.nan) if n == "iou_predictions" else o for n, o in real(self, *a).items()},
    )
    request_ = model_request(TINY, SIZE, **_prompts(1, 0))
    np.testing.assert_allclose(
        replaying.decode(features, request_).scores, usual.decode(usual.encode(_image(0)), request_).scores, atol=1e-5
    )
    assert replaying.graph_decoder is None


def test_the_graphs_are_the_default_on_cuda_only_and_the_variable_turns_them_off(monkeypatch):
    monkeypatch.delenv("TRITON_SAM_CUDA_GRAPHS", raising=False)
    assert graph_decodes_by_default(on_cuda=True) and not graph_decodes_by_default(on_cuda=False)
    for off in ("0", "false", "Off", "no"):
        monkeypatch.setenv("TRITON_SAM_CUDA_GRAPHS", off)
        assert not graph_decodes_by_default(on_cuda=True)
    monkeypatch.setenv("TRITON_SAM_CUDA_GRAPHS", "1")
    assert graph_decodes_by_default(on_cuda=True) and not graph_decodes_by_default(on_cuda=False)


def test_graphs_that_cannot_be_made_by_default_leave_the_engine_on_its_usual_decodes(synthetic_repository, monkeypatch, caplog):
    """On a GPU the graphs are made when the engine is; a failure there (here forced on the CPU
    path) must not keep the engine from starting, and the same failure asked for is raised."""
    from triton_sam.engines import local

    def broken(*args, **kwargs):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(local, "graph_decoder", broken)
    monkeypatch.setattr(local, "graph_decodes_by_default", lambda on_cuda: True)
    exported = locate(TINY, synthetic_repository)
    with caplog.at_level(logging.WARNING, logger=local.__name__):
        engine = LocalEngine(exported)
    assert engine.graph_decoder is None and "could not be made (capture failed)" in caplog.text
    request_ = model_request(TINY, SIZE, **_prompts(1, 0), best_of_multimask=True)
    assert engine.decode(engine.encode(_image(0)), request_, multimask_output=True).low_res_logits.shape[0] == 1
    with pytest.raises(RuntimeError, match="capture failed"):
        LocalEngine(exported, graph_decodes=True)


def test_graphs_are_made_only_while_no_other_thread_works_on_the_device(synthetic_repository):
    """CUDA captures in global mode: device work on another thread would fail and break the capture,
    so a capture waits for `DEVICE_WORK`, which the local engines' CUDA runs hold."""
    exported = locate(TINY, synthetic_repository)
    made = threading.Event()

    def make() -> None:
        graph_decoder(LocalEngine(exported, graph_decodes=False)._decoder, exported.decoder, TINY, capture=False).close()
        made.set()

    with DEVICE_WORK:  # another engine's run on the device
        maker = threading.Thread(target=make)
        maker.start()
        assert not made.wait(1.0)
    assert made.wait(60)
    maker.join()
