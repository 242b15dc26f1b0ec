#!/usr/bin/env bash
# Run the mechanism tests as a throwaway unprivileged user (CI is root; users
# mostly are not). Needs root to create the user; the user is removed after.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
if [ "$(id -u)" != 0 ]; then
  echo "already unprivileged: running the mechanism tests directly"
  exec python3 -m pytest -q -p no:cacheprovider -n "${TETHER_TEST_WORKERS:-4}" -m mechanism
fi
USER_NAME=tether-ci-$$
WORK=$(mktemp -d /tmp/tether-unpriv.XXXXXX)
cleanup() {
  userdel -r "$USER_NAME" >/dev/null 2>&1 || userdel "$USER_NAME" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
useradd -M -d "$WORK/home" -s /bin/bash "$USER_NAME"
mkdir -p "$WORK/home"
# A copy of the tree the user can read, and a venv from the system Python
# (the root-only pyenv under /root is not readable by other users).
cp -r "$ROOT/src" "$ROOT/tests" "$ROOT/bin" "$ROOT/examples" "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/README.md" "$WORK/"
rm -f "$WORK/src/tether/_native/tether-keeper"  # built again by the install below, as a user gets it
/usr/bin/python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "$WORK[test]"
# The tests import the copied source tree: give it the keeper the install built.
built=$(cd / && "$WORK/venv/bin/python" -c 'import tether.keeper.native as n; print(n.HELPER)')
if [ ! -x "$built" ]; then
  echo "the install built no native keeper ($built)" >&2
  exit 1
fi
cp "$built" "$WORK/src/tether/_native/tether-keeper"
chown -R "$USER_NAME" "$WORK/home" "$WORK/tests"
chmod -R a+rX "$WORK"
# TETHER_UNPRIV_SANITIZED=1 (CI): the user's jobs run the native keeper, and the
# native tether-shell, built with ASan and UBSan (scripts/_sanitized.sh); any
# report fails the run.
extra=()
if [ "${TETHER_UNPRIV_SANITIZED:-0}" = 1 ]; then
  . "$ROOT/scripts/_sanitized.sh"
  mkdir "$WORK/sanitized"
  (cd "$ROOT" && sanitized_build "$WORK/sanitized" "$WORK/venv/bin/python")
  mapfile -t extra < <(sanitized_env "$WORK/sanitized")
  echo "the user's jobs run the sanitized native keeper"
fi
cd "$WORK"
rc=0
runuser -u "$USER_NAME" -- env -i HOME="$WORK/home" PATH="$WORK/venv/bin:/usr/bin:/bin" \
  LANG=C.UTF-8 TMPDIR=/tmp "${extra[@]}" \
  "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider -n "${TETHER_TEST_WORKERS:-4}" -m mechanism tests \
  || rc=$?
if [ "${TETHER_UNPRIV_SANITIZED:-0}" = 1 ]; then
  sanitized_check "$WORK/sanitized" || rc=1
fi
exit "$rc"
