#!/usr/bin/env bash
# The test command (README quick start, and .ci/run). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Four workers (pytest-xdist): most tests wait on processes, not on the CPU (with
# two workers the suite used 125 CPU-seconds in 350 s on a 2-core machine), so
# four take half the wall time of two. TETHER_TEST_WORKERS=0 runs everything in
# one process.
exec python3 -m pytest -q -p no:cacheprovider -n "${TETHER_TEST_WORKERS:-4}" "$@"
