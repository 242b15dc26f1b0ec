#!/usr/bin/env bash
# Runs the wheels scripts/build-wheels.sh made, where this machine can:
#
#   bash scripts/check-wheels.sh OUTDIR [x86_64] [aarch64] [windows]   (default: all three)
#
# x86_64   the Linux x86-64 wheel, installed into a fresh venv by pip with no
#          index, then run with no C compiler on PATH: `tether --version` is
#          the wheel's version, doctor names the wheel's static native keeper
#          and front ends, `tether demo` leaves nothing alive (for every mechanism
#          this machine has), `tether run -- CMD` runs.
# aarch64  the Linux arm64 wheel's programs under qemu-aarch64 (Debian's
#          qemu-user-static, installed if missing): scripts/qemu-aarch64-smoke.py.
# windows  the Windows wheel, installed by Windows pip under Wine, with the
#          Wine lane run against it (scripts/windows-lane.sh, WINE_LANE_WHEEL).
# Prints one closing line "check-wheels: N passed, N failed"; exits non-zero on a failure.
set -uo pipefail

[ $# -ge 1 ] || { echo "usage: bash scripts/check-wheels.sh OUTDIR [x86_64] [aarch64] [windows]" >&2; exit 2; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(cd "$1" && pwd)" || exit 2
shift
WHAT=("$@"); [ ${#WHAT[@]} -gt 0 ] || WHAT=(x86_64 aarch64 windows)
PY="${PYTHON:-python3}"
VERSION="$(cd "$REPO/src" && "$PY" -c 'import ast
for n in ast.parse(open("tether/__init__.py").read()).body:
    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__version__":
        print(n.value.value)')"
TAG='manylinux_2_17_{A}.manylinux2014_{A}.musllinux_1_1_{A}'
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0
say() { echo "check-wheels: $*"; }
ok() { say "ok: $*"; passed=$((passed + 1)); }
bad() { say "FAILED: $*"; failed=$((failed + 1)); }

# A PATH with every program of /usr/bin and /bin but the C compilers.
nocc_path() {
  local d="$WORK/nocc-bin" f n
  mkdir -p "$d"
  for f in /usr/local/bin/* /usr/bin/* /bin/*; do
    n="${f##*/}"
    case "$n" in
      cc|c89|c99|gcc|gcc-[0-9]*|*-gcc|*-gcc-[0-9]*|clang|clang-*|musl-gcc|tcc|zig|cpp|cpp-[0-9]*) continue ;;
    esac
    [ -e "$d/$n" ] || ln -s "$f" "$d/$n"
  done
  echo "$d"
}

check_x86_64() {
  local whl="$OUT/tether-$VERSION-py3-none-${TAG//\{A\}/x86_64}.whl" venv="$WORK/venv-x86_64"
  [ -f "$whl" ] || { bad "x86_64: no $whl"; return; }
  "$PY" -m venv "$venv" || { bad "x86_64: venv"; return; }
  "$venv/bin/python" -m pip install -q --no-index --no-deps --disable-pip-version-check "$whl" \
    || { bad "x86_64: pip install $whl"; return; }
  local path; path="$venv/bin:$(nocc_path)"
  if PATH="$path" command -v cc gcc musl-gcc clang >/dev/null 2>&1; then
    bad "x86_64: a compiler is still on PATH"; return
  fi
  ok "x86_64: installed into a fresh venv; no C compiler on its PATH"
  run() { env -i HOME="$WORK" PATH="$path" "$@"; }
  local got
  got="$(run tether --version 2>&1)"
  [ "$got" = "tether $VERSION" ] && [ "$(head -c4 "$venv/bin/tether" | od -An -c | tr -d ' ')" = '177ELF' ] \
    && ok "x86_64: the native tether says '$got'" || bad "x86_64: tether --version: $got"
  got="$(run tether doctor 2>&1)"
  if grep -q "the native keeper ($venv/lib/python[0-9.]*/site-packages/tether/_native/tether-keeper, linked statically)" <<<"$got" \
     && grep -q "^  tether: native (linked statically)" <<<"$got" \
     && grep -q "^  tether-shell: native (linked statically)" <<<"$got"; then
    ok "x86_64: doctor: the wheel's native keeper, tether and tether-shell, linked statically"
  else
    echo "$got"; bad "x86_64: doctor does not name the wheel's static native programs"
  fi
  got="$(run timeout 120 tether run -- sh -c 'echo ran $((6 * 7))' 2>&1)"
  [ "$got" = "ran 42" ] && ok "x86_64: tether run -- sh -c ..." || bad "x86_64: tether run: $got"
  check_doctor_nobody "$whl"
  local mech
  for mech in $(run tether doctor 2>/dev/null | sed -n 's/^  \[yes\] \([a-z]*\) .*/\1/p'); do
    got="$(run timeout 120 tether demo -m "$mech" 2>&1)"
    if grep -q "^nothing survived\.$" <<<"$got"; then
      ok "x86_64: tether demo -m $mech: nothing survived"
    else
      echo "$got"; bad "x86_64: tether demo -m $mech"
    fi
  done
}

# docs/guarantees.md shows `runuser -u nobody -- tether doctor` with the wheel
# installed into a venv uid 65534 can read (the system Python's: root's pyenv
# is not readable): compared with a real run, as tests/test_docs.py compares
# the examples it can run itself.
check_doctor_nobody() {
  local whl="$1" nv="$WORK/nobody-venv"
  if [ "$(id -u)" != 0 ] || ! [ -x /usr/bin/python3 ] || ! command -v runuser >/dev/null \
     || ! id nobody >/dev/null 2>&1; then
    say "x86_64: docs/guarantees.md's doctor sample as nobody: not checked (needs root, runuser, /usr/bin/python3)"
    return
  fi
  chmod 755 "$WORK"
  /usr/bin/python3 -m venv "$nv" && "$nv/bin/python" -m pip install -q --no-index --no-deps \
    --disable-pip-version-check "$whl" || { bad "x86_64: a venv nobody can read"; return; }
  chmod -R a+rX "$nv"
  local out
  if out="$("$PY" "$REPO/scripts/doc-doctor-nobody.py" "$nv" 2>&1)"; then
    ok "x86_64: docs/guarantees.md's doctor sample is what nobody's doctor prints"
  else
    echo "$out"; bad "x86_64: docs/guarantees.md's doctor sample (runuser -u nobody -- tether doctor)"
  fi
}

check_aarch64() {
  local whl="$OUT/tether-$VERSION-py3-none-${TAG//\{A\}/aarch64}.whl"
  [ -f "$whl" ] || { bad "aarch64: no $whl"; return; }
  if ! command -v qemu-aarch64-static >/dev/null; then
    say "installing qemu-user-static from Debian"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends qemu-user-static; } >"$WORK/apt.log" 2>&1 \
      || { cat "$WORK/apt.log"; bad "aarch64: apt-get install qemu-user-static"; return; }
  fi
  local out rc
  out="$("$PY" "$REPO/scripts/qemu-aarch64-smoke.py" "$whl" "$VERSION" 2>&1)"; rc=$?
  echo "$out" | sed 's/^/  /'
  passed=$((passed + $(grep -c '^ok: ' <<<"$out")))
  failed=$((failed + $(grep -c '^FAILED: ' <<<"$out")))
  [ $rc -eq 0 ] || [ "$(grep -c '^FAILED: ' <<<"$out")" -gt 0 ] || bad "aarch64: the smoke test exited $rc"
}

check_windows() {
  local whl="$OUT/tether-$VERSION-py3-none-win_amd64.whl" out rc
  [ -f "$whl" ] || { bad "windows: no $whl"; return; }
  out="$(WINE_LANE_WHEEL="$whl" bash "$REPO/scripts/windows-lane.sh" 2>&1)"; rc=$?
  echo "$out" | tail -5 | sed 's/^/  /'
  [ $rc -eq 0 ] && ok "windows: the Wine lane with the built wheel: $(grep '^lane: ' <<<"$out" | tail -1)" \
    || bad "windows: the Wine lane (exit $rc)"
}

for w in "${WHAT[@]}"; do
  case "$w" in
    x86_64|aarch64|windows) "check_$w" ;;
    *) echo "unknown: $w (x86_64, aarch64, windows)" >&2; exit 2 ;;
  esac
done
echo "check-wheels: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
