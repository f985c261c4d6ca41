#!/usr/bin/env bash
# The test suite as CI runs it: two pytest runs side by side, one over the tests of the official
# models (parity, export, volumes, instances: CPU-bound), one over the rest (napari, servers,
# benchmarks: much of it waits on a GUI or a server). Side by side they keep both cores busy;
# what takes gigabytes holds a lock file (tests/conftest.py, `memory_heavy`) so that the two runs
# never do at once. Options are passed to both runs (`-x`, `-k WORD`); to run some files, call
# `python -m pytest FILE...` itself. The last line sums both runs.
# Usage: bash scripts/test.sh [PYTEST OPTIONS]    (from the repository root, in the activated .venv)
set -uo pipefail
cd "$(dirname "$0")/.."

MODELS=(tests/export tests/video tests/instance tests/automatic tests/concepts tests/series)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
export TRITON_SAM_TEST_MEMORY_LOCK="$work/memory.lock"

others=()
for path in "${MODELS[@]}"; do others+=("--ignore=$path"); done
python -m pytest --basetemp="$work/others" --junitxml="$work/others.xml" "${others[@]}" "$@" >"$work/others.log" 2>&1 &
others_pid=$!
echo "== models' tests (${MODELS[*]}), the rest beside them (printed when both are done) =="
python -m pytest --basetemp="$work/models" --junitxml="$work/models.xml" "${MODELS[@]}" "$@"
models_status=$?
wait "$others_pid"
others_status=$?
echo "== the other tests (tests/ but ${MODELS[*]}) =="
cat "$work/others.log"

python - "$work/models.xml" "$work/others.xml" <<'EOF'
"""Add up both runs' JUnit reports into one closing line."""
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

totals = dict(tests=0, failures=0, errors=0, skipped=0)
for report in map(Path, sys.argv[1:]):
    if not report.exists():
        print(f"{report.stem}: no report (the run ended before writing it)")
        totals["errors"] += 1
        continue
    for suite in ElementTree.parse(report).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"both: {passed} passed, {failed} failed, {totals['skipped']} skipped")
EOF

# pytest's 5 is "no test collected": a selection (-k) may leave one of the runs nothing to do.
ok() { [[ $1 -eq 0 || $1 -eq 5 ]]; }
if ok "$models_status" && ok "$others_status" && ! [[ $models_status -eq 5 && $others_status -eq 5 ]]; then
    exit 0
fi
echo "failed: the models' tests exited $models_status, the others $others_status"
exit 1
