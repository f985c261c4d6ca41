"""Every request about an image carries its content signature as gRPC metadata
(`contract.AFFINITY_HEADER`), seen on the wire by a real gRPC proxy in front of a real server."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from grpc_recording_proxy import RecordingProxy

from synthetic import disk_image
from triton_sam import contract
from triton_sam.automatic import AutomaticMaskGenerator
from triton_sam.engines import TritonConnection
from triton_sam.engines.triton import TritonEngine
from triton_sam.engines.triton_requests import prompt_arrays
from triton_sam.features import content_signature
from triton_sam.image import encoder_input
from triton_sam.prompts import model_request
from triton_sam.registry import get_model

TINY = get_model("sam2.1_hiera_tiny")
IMAGES = [disk_image(300, 400, [(100 + 40 * i, 100, 50)]) for i in range(3)]


@pytest.fixture
def proxy(synthetic_server):
    proxy = RecordingProxy(synthetic_server.grpc_url)
    yield proxy
    proxy.close()


def _signatures_sent(proxy: RecordingProxy) -> list[str | None]:
    return [metadata.get(contract.AFFINITY_HEADER) for metadata in proxy.infer_calls()]


def test_encodes_decodes_and_handle_calls_carry_the_images_signature(proxy):
    engine = TritonEngine(TINY, TritonConnection(proxy.url))
    try:
        inputs = [encoder_input(image, TINY) for image in IMAGES]
        signatures = [content_signature(image, TINY.model_id) for image in inputs]
        features = engine.encode(inputs[0])
        assert _signatures_sent(proxy) == [signatures[0]] == [features.handle]

        size = IMAGES[0].shape[:2]
        click = model_request(TINY, size, point_coords=np.array([[100, 100]], np.float32), point_labels=np.array([1]))
        many = model_request(
            TINY, size, point_coords=np.full((40, 1, 2), 100, np.float32), point_labels=np.ones((40, 1), np.int32)
        )
        assert engine.max_batch is not None and engine.max_batch < 40  # the batched decode goes as several requests
        clicked = engine.decode(features, click, multimask_output=False)  # a click; the server keeps its logits
        engine.decode(features, replace(click, logits_above=0.0))  # a hover
        engine.decode(features, replace(click, mask_input=clicked.low_res_logits[:, :1]), multimask_output=False)  # by key
        engine.decode(features, many)
        engine.call(features, prompt_arrays(click), contract.decoder_output_names(True))  # as volumes and maps call
        assert len(proxy.infer_calls()) > 5
        assert set(_signatures_sent(proxy)) == {signatures[0]}

        proxy.calls.clear()
        engine.encode_many(inputs[1:])  # a large plane's tiles
        assert sorted(_signatures_sent(proxy)) == sorted(signatures[1:])
    finally:
        engine.close()


def test_segment_all_requests_carry_the_signature_of_the_image_or_crop_they_are_about(proxy):
    with AutomaticMaskGenerator(TINY.model_id, backend="triton", url=proxy.url, points_per_side=4, crop_n_layers=1) as auto:
        auto.generate(IMAGES[0])
    sent = _signatures_sent(proxy)
    assert len(sent) > 5 and None not in sent
    assert len(set(sent)) == 5  # the image and its four crops, each encoded once and decoded where it was encoded
