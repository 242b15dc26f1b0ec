"""Build step for the native keeper; everything else is in pyproject.toml.

``pip install .``, ``pip install -e .`` and ``python -m build`` compile
``src/tether/_native/keeper.c`` into the program ``tether/_native/tether-keeper``
(Linux only) with the C compiler of this machine: libc and kernel headers
only, warnings as errors, nothing downloaded. On Linux the native programs
are not optional: where they cannot be built (no compiler, no Linux headers)
the build stops with one line that names the packages to install, rather
than make a wheel that lacks them.

Which libc: where ``musl-gcc`` exists (Debian's ``musl-tools``), the programs
are linked statically against musl - a keeper then costs ~170 KiB PSS where
the same source linked against the system's glibc costs ~400-470 (a lone
keeper carries its share of every glibc page it maps; a static glibc is
bigger still), and a static program starts without the dynamic loader
(tether-shell -c: ~0.3 ms less). Else, or with ``TETHER_NATIVE_LIBC=system``,
they are linked dynamically against the system's libc.

The wheel is platform-specific because it carries that program (it needs no
compiler to install); the Python code in it is the same everywhere.

For the wheels an index accepts (scripts/build-wheels.sh): ``TETHER_NATIVE_CC``
is the one compiler to use (e.g. ``python -m ziglang cc -target
aarch64-linux-musl``: a cross compiler, no other tried), and
``TETHER_WHEEL_PLATFORM`` the wheel's platform tag (e.g.
``manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64`` for
programs linked statically; ``win_amd64`` with ``TETHER_BUILD_PLATFORM=win32``).
"""

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from distutils.command.build_scripts import build_scripts  # setuptools ships distutils

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's, if it is there
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel can be built here anyway
        bdist_wheel = None

#: The platform the wheel is for: this one, unless TETHER_BUILD_PLATFORM names
#: another (scripts/windows-lane.sh builds the Windows wheel on Linux: then
#: nothing is compiled and the commands are Windows' console scripts).
TARGET = os.environ.get("TETHER_BUILD_PLATFORM") or sys.platform
LINUX = TARGET.startswith("linux")

SOURCE = os.path.join("src", "tether", "_native", "keeper.c")
SHELL_SOURCE = os.path.join("src", "tether", "_native", "shell.c")
PROGRAM = "tether-keeper"
SHELL_PROGRAM = "tether-shell"
# The Python tether-shell, installed beside the native one: it serves what
# the native program hands over (an interactive shell, scope caller, errors).
SHELL_FALLBACK = "tether-shell-py"
CFLAGS = ["-std=gnu11", "-O2", "-pthread", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2",
          "-fstack-protector-strong", "-fno-strict-aliasing"]


def _compiler() -> list[str] | None:
    for cand in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if not cand:
            continue
        argv = shlex.split(cand)
        if argv and shutil.which(argv[0]):
            return argv
    return None


def _kernel_headers(tmp: str) -> str | None:
    """A directory with the system's kernel headers (linux/, asm/,
    asm-generic/) and nothing else, for musl-gcc, which searches only musl's
    own headers; None when this machine has none."""
    base = "/usr/include"
    asm = os.path.join(base, "asm")
    if not os.path.isdir(asm):
        import glob

        triplet = sysconfig.get_config_var("MULTIARCH")
        found = [os.path.join(base, triplet, "asm")] if triplet else glob.glob(base + "/*/asm")
        asm = found[0] if found else asm
    dirs = {"linux": os.path.join(base, "linux"), "asm-generic": os.path.join(base, "asm-generic"),
            "asm": asm}
    if not all(os.path.isdir(d) for d in dirs.values()):
        return None
    os.makedirs(tmp, exist_ok=True)
    for name, target in dirs.items():
        link = os.path.join(tmp, name)
        if not os.path.islink(link):
            os.symlink(target, link)
    return tmp


#: One line, for a Linux build that cannot compile the native programs.
NEEDS = ("install a C compiler and the Linux headers (Debian, Ubuntu: apt-get install gcc "
         "libc6-dev musl-tools; Fedora: dnf install gcc kernel-headers; Alpine: apk add gcc "
         "musl-dev linux-headers), or install a tether wheel")


def _builds(out: str) -> list[tuple[str, list[str]]]:
    """How to build, best first: (what, compiler argv with its own flags)."""
    given = os.environ.get("TETHER_NATIVE_CC")
    if given:  # the wheels' pinned (cross) compiler: that one, or none
        return [(given, [*shlex.split(given), "-static", "-s"])]
    ways = []
    libc = os.environ.get("TETHER_NATIVE_LIBC", "auto")
    musl = shutil.which("musl-gcc") if libc in ("auto", "musl") else None
    if musl:
        inc = _kernel_headers(out + ".kernel-headers")
        if inc:
            ways.append(("musl-gcc", [musl, "-static", "-idirafter", inc]))
    cc = _compiler()
    if cc is not None and libc != "musl":
        ways.append((" ".join(cc), cc))
    return ways


def write_constants_header() -> None:
    """src/tether/_native/tether_constants.h from src/tether/_constants.py,
    the one definition of what the C and Python sides share (rewritten only
    when it changed: a build from a read-only sdist finds it as it was)."""
    import runpy

    text = runpy.run_path(os.path.join("src", "tether", "_constants.py"))["c_header"]()
    path = os.path.join("src", "tether", "_native", "tether_constants.h")
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)


def compile_program(out: str, source: str = SOURCE) -> str | None:
    """Compile the keeper (or, with ``source=SHELL_SOURCE``, the native
    tether-shell, which includes it) to ``out``; None when it was built, else why not."""
    if not LINUX:
        return "not Linux"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_constants_header()
    ways = _builds(out)
    if not ways:
        return "no C compiler"
    tmp = out + ".tmp"
    whys = []
    try:
        for what, cc in ways:
            r = subprocess.run([*cc, *CFLAGS, "-o", tmp, source], capture_output=True, text=True)
            if r.returncode == 0:
                os.replace(tmp, out)
                if whys:  # never a silent fallback: the bigger keeper says why
                    print(f"tether: {os.path.basename(out)} is linked against the system's libc "
                          f"({'; '.join(whys)})", file=sys.stderr)
                return None
            whys.append(f"{what} failed: "
                        + ((r.stderr or r.stdout).strip().splitlines() or ["failed"])[-1])
        return "; ".join(whys)
    finally:
        shutil.rmtree(out + ".kernel-headers", ignore_errors=True)
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _stop(what: str) -> None:
    """End a Linux build that cannot make the native programs: one line."""
    sys.exit(f"tether: {what}: {NEEDS}")


class build_native(build_ext):
    """Compile the keeper program (not a Python extension)."""

    def run(self) -> None:
        inplace = self.inplace or getattr(self, "editable_mode", False)
        base = os.path.join("src", "tether") if inplace else os.path.join(self.build_lib,
                                                                          "tether")
        out = os.path.join(base, "_native", PROGRAM)
        why = compile_program(out)
        if why is not None:
            _stop(f"the native keeper cannot be built ({why})")
        self._outputs = [out]

    def get_outputs(self) -> list[str]:
        return list(getattr(self, "_outputs", []))

    def get_source_files(self) -> list[str]:
        return [SOURCE]


#: (program, the Python launcher it hands over to): on Linux each is the
#: native program where it can be built, else its Python launcher (bin/).
NATIVE_SCRIPTS = ((SHELL_PROGRAM, SHELL_FALLBACK), ("tether", "tether-py"))


class build_shell_scripts(build_scripts):
    """The scripts, then the native programs in their place (Linux): for
    ``tether-shell`` and ``tether``, the Python launcher is kept as
    ``tether-shell-py`` / ``tether-py`` (what the native program hands the
    invocations it does not serve to), and the program itself - one binary,
    shell.c, which acts as the CLI when started as ``tether`` - takes the
    name where it can be built (else the Python launcher keeps it)."""

    def run(self) -> None:
        super().run()
        if not LINUX:
            return
        names = [n for n, _ in NATIVE_SCRIPTS if os.path.exists(os.path.join(self.build_dir, n))]
        for name, fallback in NATIVE_SCRIPTS:
            if name in names:
                shutil.copy2(os.path.join(self.build_dir, name),
                             os.path.join(self.build_dir, fallback))
        if not names:
            return
        first = os.path.join(self.build_dir, names[0])
        why = compile_program(first, SHELL_SOURCE)
        if why is not None:
            _stop(f"the native tether-shell and tether cannot be built ({why})")
        for name in names[1:]:
            shutil.copy2(first, os.path.join(self.build_dir, name))


if bdist_wheel is not None:
    class bdist_program_wheel(bdist_wheel):
        """py3-none-<platform>: the program needs this platform, not this Python."""

        def get_tag(self) -> tuple[str, str, str]:
            given = os.environ.get("TETHER_WHEEL_PLATFORM")
            if given:  # the platforms the wheel is for (build-wheels.sh)
                return ("py3", "none", given)
            plat = super().get_tag()[2]
            return ("py3", "none", plat) if plat != "any" else ("py3", "none", "any")


class _WithProgram(Distribution):
    def has_ext_modules(self) -> bool:  # a platform wheel: it carries a program
        return LINUX


_COMMANDS: dict = {"build_ext": build_native, "build_scripts": build_shell_scripts}
if bdist_wheel is not None:
    _COMMANDS["bdist_wheel"] = bdist_program_wheel

# The commands. POSIX: tether-shell is a plain script (pip's console-script
# launcher imports `re` first: milliseconds on every command an agent runs),
# on Linux replaced by the native program; so is `tether` on Linux. Windows:
# pip's .exe launchers - Scripts\tether-cmd.exe is what COMSPEC (and SHELL,
# for -c CMD) point at. There is no console script named tether-shell: pip
# would install it instead of the script (docs/shell.md, "Start-up cost").
_CONSOLE = ["tether-cmd = tether.shell:main"]
_SCRIPTS = ["bin/tether-shell"]
if LINUX:
    _SCRIPTS.append("bin/tether")
else:
    _CONSOLE.append("tether = tether.cli:main")
setup(cmdclass=_COMMANDS, distclass=_WithProgram, scripts=_SCRIPTS,
      entry_points={"console_scripts": _CONSOLE, "pytest11": ["tether = tether.pytest_plugin"]})
