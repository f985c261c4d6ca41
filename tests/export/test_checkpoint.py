"""Export from an official-format checkpoint through the real CLI, and refusal of wrong ones."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from conftest import PARITY_SEED, require_export_extra
from triton_sam.errors import CheckpointError
from triton_sam.registry import get_model
from triton_sam.repository import locate, read_metadata

TINY = get_model("sam2.1_hiera_tiny")
SAM3 = get_model("sam3_tracker")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    require_export_extra()
    import torch

    from triton_sam.export.sam2_onnx import build_model

    path = tmp_path_factory.mktemp("ckpt") / "sam2.1_hiera_tiny.pt"
    torch.save({"model": build_model(TINY, seed=PARITY_SEED).state_dict()}, path)
    return path


def _cli_export(checkpoint: Path, output: Path) -> list[str]:
    """`triton-sam export` of the tiny model from `checkpoint` into `output`."""
    command = [sys.executable, "-m", "triton_sam.cli", "export", TINY.model_id]
    return command + ["--checkpoint", str(checkpoint), "--output", str(output)]


def test_cli_export_from_checkpoint_equals_the_seeded_export(checkpoint, sam2_tiny_repository, tmp_path):
    import onnxruntime as ort

    output = tmp_path / "repo"
    subprocess.run(_cli_export(checkpoint, output), check=True, capture_output=True)
    exported = locate(TINY, output)
    assert read_metadata(exported.decoder.parent.parent)["checkpoint_sha256"]
    assert (exported.decoder.parent.parent / "config.pbtxt").is_file()
    feeds = {
        **{
            name: np.random.default_rng(1).standard_normal((1, *shape), dtype=np.float32)
            for name, shape in TINY.feature_shapes.items()
        },
        "point_coords": np.array([[[300.0, 400.0]]], np.float32),
        "point_labels": np.array([[1]], np.int32),
        "mask_input": np.zeros((1, 1, 256, 256), np.float32),
        "has_mask_input": np.zeros((1, 1), np.float32),
    }
    seeded = ort.InferenceSession(str(locate(TINY, sam2_tiny_repository).decoder)).run(None, feeds)
    from_checkpoint = ort.InferenceSession(str(exported.decoder)).run(None, feeds)
    for a, b in zip(seeded, from_checkpoint):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_checkpoint_of_another_model_is_refused(checkpoint, tmp_path):
    import torch

    from triton_sam.export.checkpoint import load_checkpoint
    from triton_sam.export.sam2_onnx import build_model

    state = torch.load(checkpoint, weights_only=True)["model"]
    state["sam_mask_decoder.iou_token.weight"] = torch.zeros(3, 3)
    state.pop("no_mem_embed")
    wrong = tmp_path / "wrong.pt"
    torch.save({"model": state}, wrong)
    model = build_model(TINY, seed=1)
    with pytest.raises(CheckpointError, match="does not match sam2.1_hiera_tiny.*missing: no_mem_embed.*wrong shape"):
        load_checkpoint(model, TINY, wrong)


@pytest.mark.parametrize("content", [b"garbage", None])
def test_unreadable_checkpoints_are_refused(content, checkpoint, tmp_path):
    import torch

    from triton_sam.export.checkpoint import load_checkpoint
    from triton_sam.export.sam2_onnx import build_model

    path = tmp_path / "bad.pt"
    if content is None:
        torch.save({"state_dict": {}}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError):
        load_checkpoint(build_model(TINY, seed=1), TINY, path)


def test_cli_reports_errors_without_a_traceback(tmp_path):
    missing = tmp_path / "missing.pt"
    result = subprocess.run(_cli_export(missing, tmp_path), capture_output=True, text=True)
    assert result.returncode == 2 and "error: Cannot read checkpoint" in result.stderr and "Traceback" not in result.stderr


def test_sam1_family_checkpoints_are_plain_state_dicts(tmp_path):
    require_export_extra()
    import torch

    from triton_sam.export.checkpoint import load_checkpoint
    from triton_sam.export.sam1_onnx import build_model

    spec = get_model("mobile_sam")
    expected = build_model(spec, seed=PARITY_SEED).state_dict()
    torch.save(expected, tmp_path / "mobile_sam.pt")  # how the official files hold it
    model = build_model(spec, seed=PARITY_SEED + 1)
    load_checkpoint(model, spec, tmp_path / "mobile_sam.pt")
    assert all(torch.equal(value, expected[key]) for key, value in model.state_dict().items())
    torch.save({"model": expected}, tmp_path / "wrapped.pt")  # SAM2's layout
    with pytest.raises(CheckpointError, match="does not match mobile_sam.*unexpected: model"):
        load_checkpoint(model, spec, tmp_path / "wrapped.pt")


@pytest.mark.parametrize("layout", ["plain", "model_state", "torch_em"])
def test_micro_sam_checkpoint_layouts_give_the_weights_micro_sam_reads(layout, tmp_path):
    """Each of micro-sam's layouts (test_microsam_parity.py exports one model of each through the CLI
    but model_state's, which vit_b_histopathology's files use): our loader reads what micro-sam's
    `get_sam_model` reads, every weight."""
    require_export_extra()
    pytest.importorskip("micro_sam")
    import torch
    from micro_sam.util import get_sam_model

    from benchmarks.microsam_checkpoints import write_checkpoint
    from triton_sam.export.checkpoint import load_checkpoint
    from triton_sam.export.sam1_onnx import build_model

    spec = get_model("vit_t_lm")
    decoder = None if layout == "plain" else {"w": torch.ones(1)}  # beside the SAM's, as published
    path = write_checkpoint(tmp_path / f"{layout}.pt", "vit_t", PARITY_SEED, layout, decoder)
    expected = get_sam_model(model_type="vit_t", device="cpu", checkpoint_path=path).model.state_dict()
    model = build_model(spec, seed=PARITY_SEED + 1)
    load_checkpoint(model, spec, path)
    assert model.state_dict().keys() == expected.keys()
    assert all(torch.equal(value, expected[key]) for key, value in model.state_dict().items())


@contextmanager
def _shapes_only() -> Iterator[None]:
    """Build sam3's models without their weights' memory or init time (meta tensors: shapes only);
    the few sizes sam3 reads as Python values while building are computed on the CPU."""
    import torch
    from torch.overrides import TorchFunctionMode

    from triton_sam.export.sam3_onnx import cpu_safe_build

    class ScalarsOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.linspace:  # the ViT's drop-path rates, read with .item()
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    with torch.device("meta"), cpu_safe_build(), ScalarsOnCpu():
        yield


@pytest.fixture(scope="module")
def sam3_layouts():
    """(the official `sam3.pt` layout: `build_sam3_video_model`'s state dict, the image model with
    its tracker that the export builds), shapes only."""
    require_export_extra()
    pytest.importorskip("sam3")
    from sam3.model_builder import build_sam3_video_model

    from triton_sam.export.quiet import SAM3_BUILD, ignoring
    from triton_sam.export.sam3_concepts_onnx import vocab_file
    from triton_sam.export.sam3_onnx import official_model

    with _shapes_only(), ignoring(SAM3_BUILD):
        video = build_sam3_video_model(bpe_path=str(vocab_file()), checkpoint_path=None, load_from_HF=False, device="meta")
        return video.state_dict(), official_model(SAM3)


def test_sam3_checkpoint_layout_gives_every_weight_of_the_image_model_and_its_tracker(sam3_layouts):
    """`sam3.pt` is the official video model's state dict: `detector.*` (backbone, text encoder,
    detector) and `tracker.*`, read as sam3's `build_sam3_image_model` reads them."""
    from triton_sam.export.checkpoint import sam3_image_weights

    official, model = sam3_layouts
    mapped = sam3_image_weights({"model": official})
    expected = model.state_dict()
    assert set(mapped) == set(expected)
    assert all(mapped[k].shape == v.shape for k, v in expected.items())


def test_a_sam3_checkpoint_without_the_concept_weights_is_refused(sam3_layouts, tmp_path):
    """A file holding the tracker and its ViT alone (no text encoder) is refused, with what it lacks."""
    import torch

    from triton_sam.export.checkpoint import load_checkpoint

    official, model = sam3_layouts
    kept = {k: torch.zeros(1) for k in official if not k.startswith("detector.backbone.language_backbone.")}
    torch.save({"model": kept}, tmp_path / "tracker_only.pt")
    refusal = r"does not match sam3_tracker \(missing: backbone\.language_backbone\..*wrong shape"
    with pytest.raises(CheckpointError, match=refusal):
        load_checkpoint(model, SAM3, tmp_path / "tracker_only.pt")
