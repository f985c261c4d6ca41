"""`triton-sam export` prints what it wrote, not the tracer's and the official packages' warnings
about code whose export tests/export/test_parity.py checks (`triton_sam.export.quiet`)."""

from __future__ import annotations

import warnings

import pytest

from conftest import require_export_extra

# Every model the suite exports (tests/export/test_parity.py): their exports are made once and shared.
EXPORTED = ["sam2.1_hiera_tiny", "sam_vit_b", "mobile_sam", "sam3_tracker"]


@pytest.mark.parametrize("model_id", EXPORTED)
def test_an_export_prints_no_warnings(model_id, exported_repository, export_stderr):
    exported_repository(model_id)  # `triton-sam export MODEL --random-init ...` in a process of its own
    assert [line for line in export_stderr[model_id].splitlines() if "Warning" in line] == []


def _warn(message: str, category: type[Warning], module: str) -> None:
    """A warning as if raised in `module`'s code."""
    warnings.warn_explicit(message, category, module.replace(".", "/") + ".py", 1, module)


def test_only_the_known_warnings_are_silenced_and_only_while_exporting():
    require_export_extra()
    from torch.jit import TracerWarning

    from triton_sam.export.quiet import TRACE, ignoring

    tracer = "Converting a tensor to a Python boolean might cause the trace to be incorrect."
    index = "Exporting aten::index operator of advanced indexing in opset 18 is achieved by ..."
    exporter = "torch.onnx._internal.torchscript_exporter.utils"
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with ignoring(TRACE):
            _warn(tracer, TracerWarning, "sam2.modeling.sam.mask_decoder")
            _warn(tracer, TracerWarning, "triton_sam.export.sam2_onnx")
            _warn(index, UserWarning, exporter)
            _warn("Some other exporter warning", UserWarning, exporter)
        _warn(tracer, TracerWarning, "sam2.modeling.sam.mask_decoder")
    assert [(w.category, str(w.message), w.filename) for w in shown] == [
        (TracerWarning, tracer, "triton_sam/export/sam2_onnx.py"),  # our own wrappers' stay shown
        (UserWarning, "Some other exporter warning", exporter.replace(".", "/") + ".py"),
        (TracerWarning, tracer, "sam2/modeling/sam/mask_decoder.py"),  # outside an export
    ]
