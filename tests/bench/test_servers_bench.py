"""`python -m benchmarks servers`: a short run of it through real HAProxy and three real servers, and
the report's "Several servers" section from the committed run."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import report, servers
from conftest import require_haproxy, require_server_env

RESULTS = Path(__file__).parents[2] / "docs" / "benchmarks" / "cpu"


def test_a_short_run_keeps_each_image_on_its_server_and_loses_nothing_when_one_is_killed(tmp_path):
    """Four annotators hovering 2 s a round: no error and no re-encode with the header hash, some
    re-encodes round-robin; with a server killed halfway, no error, nothing lost and only its images
    encoded again. (Round-robin's errors are the benchmark's to count: a refinement's kept logits
    or an image's features lost on the next server.)"""
    require_server_env()
    require_haproxy()
    r = servers.run(counts=(4,), duration_s=2.0, workdir=tmp_path)
    (affinity,), (round_robin,), kill = r["affinity"], r["round_robin"], r["kill"]
    assert [affinity["errors"], kill["errors"]] == [0, 0], (affinity, kill)
    assert affinity["reencodes"] == 0 < round_robin["reencodes"]
    assert affinity["decodes"] > 0 and round_robin["decodes"] > 0
    assert kill["objects_lost"] == 0
    assert kill["images_on_killed_server"], kill["images_per_server"]  # these images put one on it
    assert kill["images_reencoded"] == kill["images_on_killed_server"]


def test_the_several_servers_section_comes_from_the_committed_servers_run(tmp_path):
    committed = json.loads((RESULTS / "results.json").read_text())
    run = json.loads((RESULTS / "servers.json").read_text())
    report.write(report.merge([committed, run]), tmp_path / "plots", tmp_path / "BENCHMARKS.md")
    section = (tmp_path / "BENCHMARKS.md").read_text().split("## Several servers\n\n")[1].split("\n## ")[0]

    s = run["results"]["servers"]
    for config, balancing in (("affinity", "header hash (shipped)"), ("round_robin", "round-robin")):
        for row in s[config]:
            cells = f"| {balancing} | {row['annotators']} | " + ", ".join(map(str, row["images_per_server"].values()))
            line = next(line for line in section.splitlines() if line.startswith(cells))
            assert f" | {row['reencodes_per_1000_decodes']:.1f} | {row['decodes_per_s']:.1f} | " in line
            assert line.endswith(f" | {row['errors']} |")
    kill = s["kill"]
    assert f"errors shown to annotators {kill['errors']} (goal 0: " in section
    assert f"objects in progress lost {kill['objects_lost']} (goal 0: " in section
    assert f"{len(kill['images_on_killed_server'])} images lived on the killed server" in section
