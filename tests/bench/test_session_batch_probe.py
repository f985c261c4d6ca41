"""`benchmarks.session_batch_probe` runs on the CPU (the GPU session's one run must not be its first):
the session model's feature store decodes batches stage by stage with every kind of decoder session."""

from __future__ import annotations

from benchmarks import session_batch_probe
from triton_sam.engines.providers import CPU


def test_the_session_batch_probe_times_each_stage_of_every_variant_order_and_size(synthetic_repository, monkeypatch):
    monkeypatch.setattr(session_batch_probe, "SIZES", (1, 2))
    probe = session_batch_probe.main("sam2.1_hiera_tiny", synthetic_repository, CPU, runs=1)

    assert probe["buffers"] == "cpu" and probe["sizes"] == [1, 2]
    assert set(probe["encode_ms"]) == {"default", "product"}
    assert set(probe["variants"]) == {"default", "product", "per_size"}
    stages = {"bind", "run", "copy", "answer", "total"}
    for orders in probe["variants"].values():
        for by_size in orders["steady"].values():
            assert set(by_size) == {"1", "2"} and all(set(s) == stages for s in by_size.values())
        assert set(orders["alternating"]) == {"2"}
        assert {name: set(s) for name, s in orders["alternating"]["2"].items()} == {"batch": stages, "single": stages}
        assert orders["steady"]["one_slot"]["2"]["total"] > 0
