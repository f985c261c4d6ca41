"""Faults with annotators in the loop: a few simulated annotators (an `InteractiveSession` each, as
in `benchmarks/annotators.py`, tiny here) hover over their images spread on three real servers;
one server is killed mid-session, and later a server is added."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest

from conftest import start_server
from synthetic import disk_image
from triton_sam.engines import TritonConnection
from triton_sam.engines.server_pool import rendezvous_order
from triton_sam.engines.triton import TritonEngine
from triton_sam.image import encoder_input
from triton_sam.prompts import model_request
from triton_sam.registry import get_model
from triton_sam.session import InteractiveSession

TINY = get_model("sam2.1_hiera_tiny")
ANNOTATORS = 4
CENTERS = [(120 + 40 * i, 150) for i in range(ANNOTATORS)]  # (x, y) of each annotator's disk


@pytest.fixture(scope="module")
def three_servers(synthetic_server, synthetic_repository):
    spares = [start_server(synthetic_repository) for _ in range(2)]
    yield [synthetic_server, *spares]
    for server in spares:
        server.stop()


def _hover_around(session: InteractiveSession, center: tuple[float, float], moves: int) -> None:
    """The cursor circling the annotator's disk, an event every 10 ms."""
    for step in range(moves):
        angle = 2 * np.pi * step / moves
        session.hover(center[0] + 25 * np.cos(angle), center[1] + 25 * np.sin(angle))
        time.sleep(0.01)


def _hover_all(sessions: list[InteractiveSession], moves: int, meanwhile=lambda: None) -> None:
    threads = [threading.Thread(target=_hover_around, args=(s, c, moves)) for s, c in zip(sessions, CENTERS, strict=True)]
    for thread in threads:
        thread.start()
    meanwhile()
    for thread in threads:
        thread.join()
    _settle(sessions)


def _settle(sessions: list[InteractiveSession]) -> None:
    deadline = time.monotonic() + 30
    while not all(s.idle for s in sessions) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(s.idle for s in sessions)


def test_a_server_killed_under_annotators_costs_only_its_images_a_reencode_and_a_new_one_takes_one_in_n(
    three_servers, synthetic_repository
):
    urls = ",".join(server.grpc_url for server in three_servers)
    errors: list[Exception] = []
    images = [disk_image(300, 400, [(x, y, 45)]) for x, y in CENTERS]
    sessions = [
        InteractiveSession(TritonEngine(TINY, TritonConnection(urls)), lambda preview: None, on_error=errors.append)
        for _ in images
    ]
    twins = [InteractiveSession(s.engine, lambda preview: None, cache=s.cache, owns_engine=False) for s in sessions]
    try:
        for session, twin, image, (x, y) in zip(sessions, twins, images, CENTERS, strict=True):
            session.set_plane("plane", image)
            session.add_point(x, y)
            twin.set_plane("plane", image)  # a twin refines the same object before the fault: the reference
            twin.add_point(x, y)
        _settle(sessions + twins)
        for twin, (x, y) in zip(twins, CENTERS, strict=True):  # (once the first click's logits are in)
            twin.add_point(x + 20, y)
        _settle(twins)
        handles = [s.cache.signature(encoder_input(image, TINY)) for s, image in zip(sessions, images, strict=True)]
        assert all(handle in s.cache for s, handle in zip(sessions, handles, strict=True))
        homes = [s.engine.servers.client_for(handle).url for s, handle in zip(sessions, handles, strict=True)]
        doomed = next(server for server in three_servers if server.grpc_url == homes[0])
        before = [(s.prompts, s.object.low_res.copy()) for s in sessions]

        # Everyone hovers; the server of the first annotator's image is killed meanwhile.
        _hover_all(sessions, 40, meanwhile=lambda: (time.sleep(0.15), doomed.stop()))
        delivered = [s.stats.hovers_delivered for s in sessions]
        _hover_all(sessions, 20)  # after the fault too, every annotator's hovers answer

        assert errors == [] and sum(s.stats.failed for s in sessions) == 0
        assert all(s.stats.hovers_delivered > d for s, d in zip(sessions, delivered, strict=True))
        for session, (prompts, low_res) in zip(sessions, before, strict=True):  # each object in progress survives
            assert session.prompts.prompts == prompts.prompts
            np.testing.assert_array_equal(session.object.low_res, low_res)
        for session, (x, y) in zip(sessions, CENTERS, strict=True):  # and refines as before the fault
            session.add_point(x + 20, y)
        _settle(sessions)
        for session, twin in zip(sessions, twins, strict=True):
            np.testing.assert_array_equal(session.object.low_res, twin.object.low_res)
        for session, home in zip(sessions, homes, strict=True):  # only the killed server's images moved
            moved = home == doomed.grpc_url
            assert (session.engine.reencodes > 0) == moved
            assert session.engine.servers.encodes[home] == 1
    finally:
        for session in twins + sessions:
            session.close()

    # A server added to the two left: only the images whose first choice it becomes move there.
    survivors = [server.grpc_url for server in three_servers if server is not doomed]
    added = start_server(synthetic_repository)
    pictures = [encoder_input(disk_image(120, 160, [(30 + 4 * i, 60, 25)]), TINY) for i in range(24)]
    before_engine = TritonEngine(TINY, TritonConnection(",".join(survivors)))
    after_engine = TritonEngine(TINY, TritonConnection(",".join([*survivors, added.grpc_url])))
    try:
        features = before_engine.encode_many(pictures)
        for f in features:
            after_engine.decode(f, _click())
        moved = [f for f in features if rendezvous_order(f.handle, [*survivors, added.grpc_url])[0] == added.grpc_url]
        assert after_engine.reencodes == len(moved) and after_engine.servers.encodes == Counter({added.grpc_url: len(moved)})
        assert 2 <= len(moved) <= 14  # about 1/3 of 24
    finally:
        before_engine.close()
        after_engine.close()
        added.stop()


def _click():
    point = {"point_coords": np.array([[40.0, 60.0]], np.float32), "point_labels": np.array([1])}
    return model_request(TINY, (120, 160), **point)
