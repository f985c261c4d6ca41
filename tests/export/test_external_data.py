"""Encoders too large for one ONNX file (SAM1 vit_h) keep their weights in `model.onnx.data`:
ONNX Runtime and Triton must find it. Proven on MobileSAM with the external file forced."""

from __future__ import annotations

import numpy as np

from conftest import PARITY_SEED, require_export_extra, start_server
from synthetic import disk_image
from triton_sam import Predictor
from triton_sam.registry import get_model
from triton_sam.repository import locate

MOBILE_SAM = get_model("mobile_sam")


def test_weights_in_an_external_file_load_locally_and_in_triton(tmp_path, exported_repository):
    require_export_extra()
    from triton_sam.export import export_model
    from triton_sam.export.onnx_file import external_data_path

    export_model(MOBILE_SAM, tmp_path, seed=PARITY_SEED, progress=lambda _: None, external_data=True)
    encoder = locate(MOBILE_SAM, tmp_path).encoder
    assert 4 * encoder.stat().st_size < external_data_path(encoder).stat().st_size  # the weights moved out
    image = disk_image(300, 400, [(120, 100, 50), (300, 200, 40)])
    prompts = {"point_coords": np.array([[120.0, 100.0]]), "point_labels": np.array([1])}

    def masks(predictor: Predictor) -> np.ndarray:
        with predictor:
            predictor.set_image(image)
            return predictor.predict(**prompts)[0]

    inline = masks(Predictor("mobile_sam", model_repository=exported_repository("mobile_sam")))
    np.testing.assert_array_equal(masks(Predictor("mobile_sam", model_repository=tmp_path)), inline)
    server = start_server(tmp_path)
    try:
        np.testing.assert_array_equal(masks(Predictor("mobile_sam", backend="triton", url=server.grpc_url)), inline)
    finally:
        server.stop()
