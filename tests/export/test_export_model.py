"""`export_model` moves each Triton model directory into the repository only once it is complete:
an export that fails midway leaves the models it finished and nothing half-written beside them."""

from __future__ import annotations

import pytest

from conftest import PARITY_SEED, require_export_extra
from triton_sam.errors import ModelNotFoundError
from triton_sam.registry import get_model
from triton_sam.repository import exported_models, locate

MOBILE_SAM = get_model("mobile_sam")


def test_an_export_failing_midway_leaves_only_the_models_it_finished(tmp_path, monkeypatch):
    require_export_extra()
    from triton_sam.export import export_model, sam1_onnx

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sam1_onnx, "export_decoder", disk_full)  # the failure injected; the encoder is really exported
    with pytest.raises(OSError, match="No space left"):
        export_model(MOBILE_SAM, tmp_path, seed=PARITY_SEED, progress=lambda _: None)
    assert sorted(path.name for path in tmp_path.iterdir()) == [MOBILE_SAM.encoder_name]  # no scratch directory left
    assert (tmp_path / MOBILE_SAM.encoder_name / "config.pbtxt").is_file()
    assert exported_models(tmp_path) == []
    with pytest.raises(ModelNotFoundError, match="triton-sam setup"):
        locate(MOBILE_SAM, tmp_path)
