#!/usr/bin/env bash
# The mechanism tests with the native programs built with AddressSanitizer
# and UBSan: any report (they go to files, the keeper's stderr is /dev/null)
# fails the run.
#   bash scripts/native-tests.sh [pytest args]
# The main run (scripts/test.sh) takes the native programs as installed. CI
# runs the sanitized build in the unprivileged run (scripts/unprivileged-tests.sh
# with TETHER_UNPRIV_SANITIZED=1); this is the same as root, by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_sanitized.sh
WORKERS="${TETHER_TEST_WORKERS:-4}"

echo "--- mechanism tests with the native programs built with ASan and UBSan"
DIR=$(mktemp -d /tmp/tether-sanitized.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
sanitized_build "$DIR"
mapfile -t senv < <(sanitized_env "$DIR")
env "${senv[@]}" python3 -m pytest -q -p no:cacheprovider -n "$WORKERS" -m mechanism "$@"
sanitized_check "$DIR"
