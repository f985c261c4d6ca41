"""The product's CLI and the checkout's benchmarks stay apart: `triton-sam` has no benchmark command
and imports none; `python -m benchmarks` runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import build_parser as benchmarks_parser
from benchmarks.suite import RUNNERS
from triton_sam.cli import build_parser


def test_the_cli_imports_no_benchmark_and_has_no_bench_command():
    probe = "import sys, triton_sam.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks'))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "all"])


def test_python_m_benchmarks_runs_every_benchmark_and_the_report():
    parser = benchmarks_parser()
    for kind in (*RUNNERS, "parity"):  # every benchmark of `all`, and the one it leaves out
        assert parser.parse_args([kind]).func
    args = parser.parse_args(["all", "--profile", "smoke", "--only", "click", "hover"])
    assert (args.profile, args.only) == ("smoke", ["click", "hover"])
    args = parser.parse_args(["report", "a.json", "--gpu", "docs/benchmarks/gpu-h200"])
    assert args.func.__name__ == "_cmd_bench_report"
    root = Path(__file__).parents[2]
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=root, capture_output=True, text=True, check=True)
    assert "report" in done.stdout and "all" in done.stdout
