"""The wheel: built from a copy of this checkout as a user would (``pip wheel``,
what ``python -m build`` and ``pip install .`` make too), it is for this
platform, carries the compiled programs, and installs into a fresh virtual
environment without building anything, where the native keeper and the
native ``tether`` then run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the native programs are built on Linux only")

def _version() -> str:
    """tether.__version__ as the checkout says (the one source of the version)."""
    import ast

    with open(os.path.join(ROOT, "src", "tether", "__init__.py")) as f:
        for node in ast.parse(f.read()).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__version__":
                return node.value.value  # type: ignore[attr-defined]
    raise AssertionError("no __version__ in tether/__init__.py")


VERSION = _version()
DATA = f"tether-{VERSION}.data/scripts"
#: What the wheel must carry as compiled programs (path in the wheel).
PROGRAMS = ("tether/_native/tether-keeper", f"{DATA}/tether", f"{DATA}/tether-shell")


#: What the build reads from the checkout (pyproject.toml's readme, setup.py's
#: scripts in bin/, the package and the C sources under src/).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "bin", "src")


def _compiler_here() -> bool:
    return any(shutil.which(c) for c in ("musl-gcc", "cc", "gcc", "clang"))


def _source_copy(tmp) -> str:
    src = tmp / "src-copy"
    # A copy: the build must not write into the checkout (build/, the programs
    # beside keeper.c) that an editable install is running from. Only what the
    # build reads, and no symlink followed: the checkout may hold much else
    # (scripts/windows-lane.sh's .wine-lane has a Wine prefix whose z: is a
    # link to /, and copying it filled the disk).
    skip = shutil.ignore_patterns("*.egg-info", "__pycache__")

    def ignore(where: str, names: list[str]) -> set[str]:
        left = set(skip(where, names))
        if os.path.basename(where) == "_native":  # programs built here: the build makes its own
            left |= {n for n in names if not n.endswith(".c")}
        return left

    src.mkdir()
    for name in BUILD_INPUTS:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(path, src / name, follow_symlinks=False)
    return str(src)


def _pip_wheel(src: str, out: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "_TETHER_"))}
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--disable-pip-version-check", "-w", out, src],
                          capture_output=True, text=True, timeout=300, env={**base, **env})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    if not _compiler_here():
        pytest.skip("no C compiler here: the wheel would carry no programs (tested elsewhere)")
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp)
    out = tmp / "dist"
    r = _pip_wheel(src, str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = sorted(out.glob("tether-*.whl"))
    assert len(wheels) == 1, wheels
    return str(wheels[0])


def test_the_wheel_is_for_this_platform_and_carries_the_programs(wheel):
    name = os.path.basename(wheel)
    assert name.endswith(".whl") and not name.endswith("-none-any.whl"), name
    assert "linux" in name, name  # a platform wheel: it holds compiled programs
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for prog in PROGRAMS:
            assert prog in names, f"{prog} missing from {name}"
            data = z.read(prog)
            assert data[:4] == b"\x7fELF", f"{prog} is no compiled program"
            mode = z.getinfo(prog).external_attr >> 16
            assert mode & 0o111, f"{prog} is not executable in the wheel ({oct(mode)})"
        # The Python launchers the native programs hand over to are there too.
        assert f"{DATA}/tether-py" in names
        assert f"{DATA}/tether-shell-py" in names
        with z.open(f"tether-{VERSION}.dist-info/WHEEL") as f:
            meta = f.read().decode()
        assert "Root-Is-Purelib: false" in meta, meta
        with z.open(f"tether-{VERSION}.dist-info/METADATA") as f:
            assert f"\nVersion: {VERSION}\n" in f.read().decode()


def test_the_wheel_installs_with_nothing_built_and_runs_natively(wheel, tmp_path, procs):
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0 and "ensurepip" in (r.stdout + r.stderr):
        pytest.skip(f"this Python cannot make a venv with pip: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    bindir = venv / "bin"
    py = str(bindir / "python")
    # No compiler reachable, and none asked for: a wheel install builds nothing.
    env = {k: v for k, v in procs.env().items()
           if k not in ("PYTHONPATH", "CC") and not k.startswith(("TETHER_", "_TETHER_"))}
    env.update(PATH=f"{bindir}:/usr/bin:/bin", CC="/bin/false",
               TETHER_STATE_DIR=str(tmp_path / "state"), TETHER_TEST_MARK=procs.mark)
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--disable-pip-version-check", wheel],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr

    # The installed programs are the wheel's own bytes: nothing was rebuilt.
    where = subprocess.run([py, "-c", "import tether, os; print(os.path.dirname(tether.__file__))"],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    pkg = where.stdout.strip()
    assert pkg.startswith(str(venv)), pkg  # this venv's copy, not the checkout's
    installed = {"tether/_native/tether-keeper": os.path.join(pkg, "_native", "tether-keeper"),
                 f"{DATA}/tether": str(bindir / "tether"),
                 f"{DATA}/tether-shell": str(bindir / "tether-shell")}
    with zipfile.ZipFile(wheel) as z:
        for member, path in installed.items():
            with open(path, "rb") as f:
                assert hashlib.sha256(f.read()).digest() == hashlib.sha256(z.read(member)).digest(), \
                    f"{path} differs from the wheel's {member}"

    # The venv's Python runs the native keeper; its tether and tether-shell are native.
    probe = ("from tether.keeper import native; ok, why = native.status(); print(why); "
             "[print(c['name'], c['native']) for c in native.front_ends()]")
    r = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=60, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("the native keeper (" + pkg), r.stdout
    assert "tether True" in r.stdout and "tether-shell True" in r.stdout, r.stdout

    # And they work: a command in a job, by the native `tether run`.
    r = subprocess.run([str(bindir / "tether"), "run", "--", "sh", "-c", 'echo "job=$TETHER_JOB"'],
                       capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("job=") and len(r.stdout.strip()) > len("job="), r.stdout
    r = subprocess.run([str(bindir / "tether-shell"), "-c", "exit 7"], capture_output=True,
                       text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 7, r.stdout + r.stderr

    # One version: the native tether hands --version to the wheel's tether-py,
    # which says the wheel's version.
    r = subprocess.run([str(bindir / "tether"), "--version"], capture_output=True, text=True,
                       timeout=60, env=env, cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, f"tether {VERSION}\n"), r.stdout + r.stderr


def test_a_linux_build_without_a_c_compiler_stops_with_one_line(tmp_path):
    """No wheel that silently lacks the keeper: pip's build of the source with
    no C compiler on PATH fails, saying in one line what to install (the
    module's other tests are the control: the same build with one succeeds)."""
    src = _source_copy(tmp_path)
    bindir = tmp_path / "no-cc"
    bindir.mkdir()
    for tool in ("sh", "uname", "ls", "cat", "rm", "mkdir", "tar", "gzip"):  # no cc, gcc, musl-gcc
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bindir / tool)
    os.symlink(sys.executable, bindir / "python3")
    r = _pip_wheel(src, str(tmp_path / "dist"), PATH=str(bindir), CC="")
    assert r.returncode != 0, r.stdout + r.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))
    lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines()
             if ln.strip().startswith("tether: ")]
    assert lines == ["tether: the native keeper cannot be built (no C compiler): install a C "
                     "compiler and the Linux headers (Debian, Ubuntu: apt-get install gcc "
                     "libc6-dev musl-tools; Fedora: dnf install gcc kernel-headers; Alpine: "
                     "apk add gcc musl-dev linux-headers), or install a tether wheel"], lines
