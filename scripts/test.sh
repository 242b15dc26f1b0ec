#!/usr/bin/env bash
# The test command (README quick start, and .ci/run). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m pytest -q -p no:cacheprovider "$@"
