#!/usr/bin/env bash
# The mechanism tests on the keeper paths the main run does not take:
#   python     the Python keeper (TETHER_NATIVE=0), which must behave as the native one;
#   sanitized  the native keeper built with AddressSanitizer and UBSan: any report
#              (they go to files, the keeper's stderr is /dev/null) fails the run.
#   bash scripts/native-tests.sh [python|sanitized|all] [pytest args]   (default: all)
# The main run (scripts/test.sh) takes the native keeper where it is built. CI
# runs `python` here and the sanitized keeper in the unprivileged run
# (scripts/unprivileged-tests.sh with TETHER_UNPRIV_SANITIZED=1).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_sanitized.sh
WORKERS="${TETHER_TEST_WORKERS:-4}"
what="all"
case "${1:-}" in python|sanitized|all) what="$1"; shift ;; esac

if [ "$what" != sanitized ]; then
  echo "--- mechanism tests with the Python keeper (TETHER_NATIVE=0)"
  TETHER_NATIVE=0 python3 -m pytest -q -p no:cacheprovider -n "$WORKERS" -m mechanism "$@"
fi

if [ "$what" != python ]; then
  echo "--- mechanism tests with the native keeper built with ASan and UBSan"
  DIR=$(mktemp -d /tmp/tether-sanitized.XXXXXX)
  trap 'rm -rf "$DIR"' EXIT
  sanitized_build "$DIR"
  mapfile -t senv < <(sanitized_env "$DIR")
  env "${senv[@]}" python3 -m pytest -q -p no:cacheprovider -n "$WORKERS" -m mechanism "$@"
  sanitized_check "$DIR"
fi
