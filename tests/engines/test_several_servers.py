"""One engine over two real servers without a balancer: images spread by rendezvous hashing, and a
server killed mid-object costs its images a re-encode on the other server, nothing else."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from conftest import start_server
from synthetic import disk_image
from triton_sam.engines import TritonConnection
from triton_sam.engines.triton import TritonEngine
from triton_sam.image import encoder_input
from triton_sam.prompts import model_request
from triton_sam.registry import get_model

TINY = get_model("sam2.1_hiera_tiny")
IMAGES = [disk_image(300, 400, [(80 + 30 * i, 150, 45)]) for i in range(8)]


def _click(x: float, y: float, mask_input: np.ndarray | None = None):
    point = {"point_coords": np.array([[x, y]], np.float32), "point_labels": np.array([1])}
    return model_request(TINY, IMAGES[0].shape[:2], **point, mask_input=mask_input)


def test_images_spread_over_two_servers_and_a_killed_one_loses_no_object(synthetic_server, synthetic_repository):
    spare = start_server(synthetic_repository)
    engine = TritonEngine(TINY, TritonConnection(f"{synthetic_server.grpc_url},{spare.grpc_url}"))
    try:
        features = [engine.encode(encoder_input(image, TINY)) for image in IMAGES]
        home = {f.handle: engine.servers.client_for(f.handle).url for f in features}
        assert engine.servers.encodes == Counter(home.values())  # each image encoded once, on its own server
        assert set(home.values()) == {synthetic_server.grpc_url, spare.grpc_url}
        for f in features:
            engine.decode(f, _click(100, 150))
        assert engine.reencodes == 0  # every decode found its image's features

        # An object in progress on an image of the spare server: a click, refined with its logits
        # (which the server keeps and the refinement names by key), previewed under the cursor.
        ours = next(f for f in features if home[f.handle] == spare.grpc_url)
        first = engine.decode(ours, _click(100, 150), multimask_output=False)
        refine = _click(120, 150, mask_input=first.low_res_logits[:, :1])
        before = engine.decode(ours, refine, multimask_output=False)
        hover = engine.decode(ours, replace(refine, logits_above=0.0), multimask_output=False)

        spare.stop()
        after = engine.decode(ours, refine, multimask_output=False)  # no error: the other server takes over
        np.testing.assert_array_equal(after.low_res_logits, before.low_res_logits)
        np.testing.assert_array_equal(after.scores, before.scores)
        hover_after = engine.decode(ours, replace(refine, logits_above=0.0), multimask_output=False)
        np.testing.assert_array_equal(hover_after.low_res_logits > 0, hover.low_res_logits > 0)
        assert engine.reencodes == 1

        for f in features:
            engine.decode(f, _click(100, 150))
        moved = sum(url == spare.grpc_url for url in home.values())
        assert engine.reencodes == moved  # only the killed server's images were encoded again
        assert engine.servers.encodes[synthetic_server.grpc_url] == len(IMAGES)
    finally:
        engine.close()
        spare.stop()
