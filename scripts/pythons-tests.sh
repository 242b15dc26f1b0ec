#!/usr/bin/env bash
# The core mechanism tests on the lowest and the highest CPython that tether
# claims (pyproject.toml: requires-python and the classifiers say no more than
# this runs), besides the default python3 that scripts/test.sh uses:
#   bash scripts/pythons-tests.sh [pytest args]
# Each Python gets a throwaway venv with tether installed from this tree (a
# wheel build: the native programs are compiled for it as a user's pip would)
# and runs tests/test_popen_internals.py (the private CPython internals tether
# relies on) plus the core of the job and kill tests.
# The Pythons come from pyenv (the CI image has 3.10.13 and 3.13.0 there), else
# python3.10 / python3.13 on PATH; TETHER_PYTHONS overrides (a space-separated
# list of interpreters). A missing one fails the run with the command that
# installs it: it is not built here, as compiling CPython takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"
# 3.10: the lowest claimed (requires-python); 3.13: the highest the CI image has.
WANT=(3.10 3.13)
if [ -n "${TETHER_PYTHONS:-}" ]; then
  read -r -a PYTHONS <<<"$TETHER_PYTHONS"
else
  PYTHONS=()
  for v in "${WANT[@]}"; do
    py=$(ls -d "$PYENV_ROOT"/versions/"$v".*/bin/python3 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$py" ] || py=$(command -v "python$v" || true)
    if [ -z "$py" ] || ! [ -x "$py" ]; then
      echo "pythons-tests: no CPython $v (not in $PYENV_ROOT/versions, no python$v on PATH);" \
           "install it with 'pyenv install $v' (https://github.com/pyenv/pyenv), or name" \
           "interpreters in TETHER_PYTHONS" >&2
      exit 1
    fi
    PYTHONS+=("$py")
  done
fi
# The subset (about a minute per Python on 2 cores): the Popen internals, a
# job's whole life (spawn, wait, signals, nesting, close), every kill path.
TESTS=(tests/test_popen_internals.py tests/test_job.py tests/test_kill.py tests/test_ending.py)
WORKERS="${TETHER_TEST_WORKERS:-4}"
DIR=$(mktemp -d /tmp/tether-pythons.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
for py in "${PYTHONS[@]}"; do
  v=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  echo "--- CPython $v ($py)"
  t0=$(date +%s)
  "$py" -m venv "$DIR/$v"
  "$DIR/$v/bin/python" -m pip install -q "$ROOT[test]"
  # the tests import the installed copy and run its programs (the owner scripts
  # they start take src/ through PYTHONPATH: the same code)
  (cd "$ROOT" && "$DIR/$v/bin/python" -c 'import sys, tether
from tether.keeper import native
ok, why = native.status()
print("tether", tether.__file__, "| keeper:", why)
sys.exit(0 if ok else 1)')
  "$DIR/$v/bin/python" -m pytest -q -p no:cacheprovider -n "$WORKERS" "${TESTS[@]}" "$@"
  echo "--- CPython $v: $(( $(date +%s) - t0 )) s"
done
