#!/usr/bin/env bash
# The release artifacts, from this checkout (its tracked files as they are in
# the work tree), into OUTDIR:
#
#   bash scripts/build-wheels.sh OUTDIR
#
#   tether-V.tar.gz                                   the sdist (Linux: builds with a C compiler)
#   tether-V-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64.whl
#   tether-V-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl
#   tether-V-py3-none-win_amd64.whl                   pure Python (Job Objects)
#   tether-V-py3-none-macosx_10_9_x86_64.macosx_11_0_arm64.whl   pure Python
#
# The Linux wheels carry tether-keeper and the native tether / tether-shell,
# linked statically against musl by one pinned compiler for both machines:
# zig cc from PyPI's ziglang (its own musl and kernel headers: the bytes do
# not depend on which libc or headers this machine has). A static program
# needs no libc of the host, so the wheel is tagged for every glibc
# (manylinux2014, the oldest aarch64 tag) and musl (musllinux_1_1) system;
# `auditwheel show` checks that. Each wheel is built from the sdist, as pip
# would; `twine check` then checks every artifact.
#
# Needs: python3 with venv, and the registries (PyPI) for the pinned tools,
# which go into a venv of their own ($TETHER_WHEEL_TOOLS, default
# ~/.cache/tether-wheel-tools: kept between runs and checkouts, remade when
# the pins change). No C compiler of this machine is used.
# scripts/check-wheels.sh runs what was built.
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: bash scripts/build-wheels.sh OUTDIR" >&2; exit 2; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
TOOLS="${TETHER_WHEEL_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/tether-wheel-tools}"
# The build tools, pinned (a new release changes nothing here until this line does).
PINS=(build==1.6.1 setuptools==80.9.0 twine==7.0.0 auditwheel==6.8.2 ziglang==0.17.1)
LINUX_TAG='manylinux_2_17_{A}.manylinux2014_{A}.musllinux_1_1_{A}'
say() { echo "build-wheels: $*"; }

if [ "$(cat "$TOOLS/.pins" 2>/dev/null)" != "${PINS[*]}" ]; then
  say "installing ${PINS[*]} into $TOOLS"
  rm -rf "$TOOLS"
  "${PYTHON:-python3}" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}" 2>&1 \
    | { grep -v -e '^WARNING: Location' || true; }
  echo "${PINS[*]}" > "$TOOLS/.pins"
fi
PY="$TOOLS/bin/python"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# Reproducible archives: every timestamp is the last commit's.
SOURCE_DATE_EPOCH="$(git -C "$REPO" log -1 --format=%ct)"
export SOURCE_DATE_EPOCH
# The environment of this shell says nothing about the build (an editable
# install's TETHER_* knobs, CC): each build gets only what is set below.
for v in $(env | sed -n 's/^\(TETHER_[A-Z_]*\|_TETHER_[A-Z_]*\|CC\|CFLAGS\)=.*/\1/p'); do
  unset "$v"
done

# The tracked files only (not build/, .venv/ or programs built in place).
mkdir "$WORK/src"
git -C "$REPO" ls-files -z | (cd "$REPO" && tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
VERSION="$(cd "$WORK/src/src" && "$PY" -c 'import ast, sys
for n in ast.parse(open("tether/__init__.py").read()).body:
    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__version__":
        print(n.value.value)')"
say "tether $VERSION"
rm -f "$OUT"/tether-"$VERSION"[.-]*

"$PY" -m build -q --no-isolation --sdist -o "$OUT" "$WORK/src" >/dev/null
SDIST="$OUT/tether-$VERSION.tar.gz"
[ -f "$SDIST" ] || { say "no sdist made"; exit 1; }
say "$(basename "$SDIST")"

# wheel NAME ENV...: one wheel, built from a fresh copy of the sdist.
wheel() {
  local name="$1"; shift
  rm -rf "$WORK/$name" && mkdir "$WORK/$name"
  tar -xzf "$SDIST" -C "$WORK/$name"
  env "$@" "$PY" -m build -q --no-isolation --wheel -o "$OUT" \
    "$WORK/$name/tether-$VERSION" > "$WORK/$name.log" 2>&1 \
    || { cat "$WORK/$name.log"; say "the $name wheel failed"; exit 1; }
}
for arch in x86_64 aarch64; do
  wheel "linux-$arch" "TETHER_NATIVE_CC=$PY -m ziglang cc -target $arch-linux-musl" \
    "TETHER_WHEEL_PLATFORM=${LINUX_TAG//\{A\}/$arch}"
done
wheel windows TETHER_BUILD_PLATFORM=win32 TETHER_WHEEL_PLATFORM=win_amd64
wheel macos TETHER_BUILD_PLATFORM=darwin TETHER_WHEEL_PLATFORM=macosx_10_9_x86_64.macosx_11_0_arm64

# What each Linux wheel must hold: the three programs, static, for its machine.
for arch in x86_64 aarch64; do
  whl="$OUT/tether-$VERSION-py3-none-${LINUX_TAG//\{A\}/$arch}.whl"
  "$PY" - "$whl" "$arch" "$VERSION" <<'EOF'
import sys, zipfile
whl, arch, version = sys.argv[1:]
machine = {"x86_64": 62, "aarch64": 183}[arch]  # ELF e_machine
progs = ("tether/_native/tether-keeper", f"tether-{version}.data/scripts/tether",
         f"tether-{version}.data/scripts/tether-shell")
with zipfile.ZipFile(whl) as z:
    for p in progs:
        elf = z.read(p)
        assert elf[:4] == b"\x7fELF", f"{whl}: {p} is not a program"
        got = int.from_bytes(elf[18:20], "little")
        assert got == machine, f"{whl}: {p} is for ELF machine {got}, not {arch}"
        # a static program has no PT_INTERP (no dynamic loader named)
        assert b"/ld-linux" not in elf and b"/ld-musl" not in elf, f"{whl}: {p} is dynamic"
        mode = z.getinfo(p).external_attr >> 16
        assert mode & 0o111, f"{whl}: {p} is not executable"
print(f"build-wheels: {whl.rsplit('/', 1)[1]}: {', '.join(p.rsplit('/', 1)[1] for p in progs)}"
      f" for {arch}, static")
EOF
  # auditwheel: which policy the wheel's ELF files fit (it reads ELF; any host).
  "$TOOLS/bin/auditwheel" show "$whl" > "$WORK/audit-$arch.txt" 2>&1 || true
  if ! grep -q "is consistent with the following platform tag" "$WORK/audit-$arch.txt" \
     || ! grep -q "requires no external shared libraries" "$WORK/audit-$arch.txt"; then
    cat "$WORK/audit-$arch.txt"; say "auditwheel does not accept $(basename "$whl")"; exit 1
  fi
  # (It reads a static program as glibc's: "couldn't detect wheel libc"; the
  # musllinux tag rests on the same fact, no libc needed from the host.)
  say "auditwheel show: $(tr -s '\n ' '  ' < "$WORK/audit-$arch.txt" \
    | grep -o 'consistent with the following platform tag: "[^"]*"'); no external libraries"
done
for tag in win_amd64 macosx_10_9_x86_64.macosx_11_0_arm64; do
  [ -f "$OUT/tether-$VERSION-py3-none-$tag.whl" ] || { say "no $tag wheel"; exit 1; }
done

"$TOOLS/bin/twine" check --strict "$OUT"/tether-"$VERSION"[.-]*
ls -l "$OUT"/tether-"$VERSION"[.-]*
