#!/usr/bin/env bash
# The mechanism tests on the keeper paths the main run does not take (CI):
#   1. the Python keeper (TETHER_NATIVE=0), which must behave as the native one;
#   2. the native keeper built with AddressSanitizer and UBSan: any report
#      (they go to files, the keeper's stderr is /dev/null) fails the run.
# The main run (scripts/test.sh) takes the native keeper where it is built.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS="${TETHER_TEST_WORKERS:-2}"

echo "--- mechanism tests with the Python keeper (TETHER_NATIVE=0)"
TETHER_NATIVE=0 python3 -m pytest -q -p no:cacheprovider -n "$WORKERS" -m mechanism "$@"

echo "--- mechanism tests with the native keeper built with ASan and UBSan"
CC="${CC:-cc}"
if ! command -v "$CC" >/dev/null; then
  echo "no C compiler ($CC): the sanitizer run needs one" >&2
  exit 1
fi
DIR=$(mktemp -d /tmp/tether-sanitized.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
"$CC" -std=gnu11 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
  -fno-sanitize-recover=all -Wall -Wextra -Werror -o "$DIR/tether-keeper" src/tether/_native/keeper.c
mkdir "$DIR/reports"
chmod 1777 "$DIR/reports"
_TETHER_NATIVE_HELPER="$DIR/tether-keeper" TETHER_NATIVE=1 \
  ASAN_OPTIONS="log_path=$DIR/reports/asan:detect_leaks=0:abort_on_error=1" \
  UBSAN_OPTIONS="log_path=$DIR/reports/ubsan:print_stacktrace=1:halt_on_error=1" \
  python3 -m pytest -q -p no:cacheprovider -n "$WORKERS" -m mechanism "$@"
if [ -n "$(ls -A "$DIR/reports")" ]; then
  echo "the sanitizers reported:" >&2
  cat "$DIR/reports"/* >&2
  exit 1
fi
echo "no sanitizer reports"
