#!/usr/bin/env bash
# The test command (README quick start, and .ci/run). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Two workers (pytest-xdist): most tests wait on processes, not on the CPU, so
# this halves the wall time on a 2-core machine. TETHER_TEST_WORKERS=0 runs
# everything in one process.
exec python3 -m pytest -q -p no:cacheprovider -n "${TETHER_TEST_WORKERS:-2}" "$@"
