"""Rendezvous hashing of images over several servers (`engines.server_pool`), without servers."""

from __future__ import annotations

import hashlib
from collections import Counter

from triton_sam.engines import TritonConnection
from triton_sam.engines.server_pool import ServerPool, rendezvous_order
from triton_sam.engines.triton_client import TritonClient

SIGNATURES = [hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest() for i in range(6000)]
THREE = ["gpu0:8001", "gpu1:8001", "gpu2:8001"]


def _homes(urls: list[str]) -> dict[str, str]:
    return {signature: rendezvous_order(signature, urls)[0] for signature in SIGNATURES}


def test_images_spread_evenly_and_a_new_server_takes_about_one_in_n_from_each():
    before, after = _homes(THREE), _homes([*THREE, "gpu3:8001"])
    assert all(abs(count / len(SIGNATURES) - 1 / 3) < 0.03 for count in Counter(before.values()).values())
    moved = [signature for signature in SIGNATURES if before[signature] != after[signature]]
    assert {after[signature] for signature in moved} == {"gpu3:8001"}  # nothing moves between the old servers
    assert abs(len(moved) / len(SIGNATURES) - 1 / 4) < 0.03


def test_a_removed_servers_images_go_to_their_next_choice_and_only_they_move():
    before, after = _homes(THREE), _homes(THREE[:2])
    for signature in SIGNATURES:
        expected = rendezvous_order(signature, THREE)[1] if before[signature] == THREE[2] else before[signature]
        assert after[signature] == expected


def test_a_server_that_stopped_answering_is_skipped_until_none_is_left():
    pool = ServerPool([TritonClient(TritonConnection(url)) for url in THREE])  # (no call is made)
    try:
        signature = SIGNATURES[0]
        first, second, third = (pool.clients[url] for url in rendezvous_order(signature, THREE))
        assert pool.client_for(signature) is first
        assert pool.fail_over(first) and pool.client_for(signature) is second
        assert pool.fail_over(second) and pool.client_for(signature) is third
        assert not pool.fail_over(third)
        single = ServerPool([TritonClient(TritonConnection(THREE[0]))])
        assert not single.fail_over(single.client_for(signature))
        single.close()
    finally:
        pool.close()


def test_a_connection_names_several_servers_comma_separated():
    assert TritonConnection(" gpu0:8001, gpu1:8001 ,").server_urls() == ["gpu0:8001", "gpu1:8001"]
    assert TritonConnection("gpu0:8001").server_urls() == ["gpu0:8001"]
