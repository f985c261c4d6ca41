"""Every request kind fails over between real servers without a balancer: instance maps and volume
propagation continue on the next server when theirs is killed (features encoded again there, a
volume's memories remembered again), and the survivor counts the requests about features it did
not hold as their own outcome (`unknown_handle`) on its metrics endpoint."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require_export_extra, start_server
from synthetic import disk_image, write_instance_decoder, write_repository
from triton_sam.engines import TritonConnection
from triton_sam.engines.server_pool import rendezvous_order
from triton_sam.engines.triton import TritonEngine
from triton_sam.image import encoder_input
from triton_sam.registry import get_model
from triton_sam.video import VolumePredictor

VIT_T = get_model("vit_t_lm")
VIDEO_MODEL = "sam2.1_hiera_tiny"
PLANES = 3  # the next server tracks plane 2, attending to planes 0 and 1 it encodes again


@pytest.fixture(scope="module")
def instance_servers(tmp_path_factory):
    """Two servers of the synthetic vit_t_lm with its synthetic instance decoder."""
    repository = write_repository(VIT_T, tmp_path_factory.mktemp("vit_t_lm_failover"))
    write_instance_decoder(VIT_T, repository)
    servers = [start_server(repository) for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def test_instance_maps_continue_on_the_next_server_and_it_counts_the_unknown_handle(instance_servers):
    first, second = instance_servers
    engine = TritonEngine(VIT_T, TritonConnection(f"{first.grpc_url},{second.grpc_url}"))
    try:
        images = [encoder_input(disk_image(160, 200, [(60 + 20 * i, 80, 30)]), VIT_T) for i in range(6)]
        features = [engine.encode(image) for image in images]
        ours = next(f for f in features if engine.servers.client_for(f.handle).url == first.grpc_url)
        before = engine.instance_maps(ours, (160, 200))
        counts_before = second.session_requests(VIT_T.session_name)

        first.stop()  # the server that answered the engine first, and the image's
        after = engine.instance_maps(ours, (160, 200))  # no error: the second server takes over

        np.testing.assert_array_equal(after, before)
        assert engine.reencodes == 1 and engine.servers.client_for(ours.handle).url == second.grpc_url
        counts = second.session_requests(VIT_T.session_name)
        assert counts.get("unknown_handle", 0) - counts_before.get("unknown_handle", 0) == 1
        assert counts.get("failed", 0) == counts_before.get("failed", 0)  # no request failed
        assert counts["instance_maps"] - counts_before.get("instance_maps", 0) == 1
    finally:
        engine.close()


def _volume() -> np.ndarray:
    rng = np.random.default_rng(1)
    volume = rng.integers(0, 60, (PLANES, 64, 80), dtype=np.uint8)
    for z in range(PLANES):
        volume[z, 20 : 36 + z, 25 : 41 + z] = 200
    return volume


def _propagate(predictor: VolumePredictor, on_plane=lambda plane: None) -> dict[int, np.ndarray]:
    """An object clicked on plane 0 and tracked through the volume; `on_plane` after each plane."""
    state = predictor.init_state(_volume())
    predictor.add_new_points_or_box(state, 0, 1, points=[[30, 28]], labels=[1])
    masks = {}
    for plane, _, logits in predictor.propagate_in_video(state):
        masks[plane] = logits > 0
        on_plane(plane)
    return masks


def test_a_volume_tracks_on_one_server_and_continues_on_the_next_when_it_is_killed_mid_propagation(exported_repository):
    """All of a volume's requests go to one server (its planes attend to each other's memories
    there); killed after the second plane, the other server takes over: its planes encoded there,
    the memories they attend to remembered there, the masks those of a run on the first alone."""
    require_export_extra()
    repository = exported_repository(VIDEO_MODEL)
    doomed, survivor = servers = [start_server(repository) for _ in range(2)]
    urls = [server.grpc_url for server in servers]
    try:
        with VolumePredictor(VIDEO_MODEL, backend="triton", url=doomed.grpc_url) as alone:
            expected = _propagate(alone)
        with VolumePredictor(VIDEO_MODEL, backend="triton", connection=TritonConnection(",".join(urls))) as ours:
            # A volume whose server is the doomed one (the survivor has seen none of its planes).
            ours.video.route = next(key for key in map(str, range(100)) if rendezvous_order(key, urls)[0] == doomed.grpc_url)
            masks = _propagate(ours, lambda plane: doomed.stop() if plane == 1 else None)
            assert ours.engine.servers.client_for(ours.video.route).url == survivor.grpc_url
            assert ours.engine.reencodes == 2  # the planes the next one attends to: 0 (prompted) and 1
            assert ours.engine.servers.encodes[survivor.grpc_url] == 2 + PLANES - 2  # and the rest, once
    finally:
        for server in servers:
            server.stop()
    assert sorted(masks) == sorted(expected) == list(range(PLANES))
    for plane, mask in expected.items():
        np.testing.assert_array_equal(masks[plane], mask)
