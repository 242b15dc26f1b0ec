"""Build step for the native keeper; everything else is in pyproject.toml.

``pip install .``, ``pip install -e .`` and ``python -m build`` compile
``src/tether/_native/keeper.c`` into the program ``tether/_native/tether-keeper``
(Linux only) with the C compiler of this machine: libc and kernel headers
only, warnings as errors, nothing downloaded. Where it cannot be built (no
compiler, no Linux headers, ``TETHER_NATIVE_BUILD=0``) the install goes on
without it and says so once; tether then runs its Python keeper, with the
same behaviour (``tether doctor`` says which keeper runs).

The wheel is platform-specific because it carries that program (it needs no
compiler to install); the Python code in it is the same everywhere.
"""

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's, if it is there
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel can be built here anyway
        bdist_wheel = None

SOURCE = os.path.join("src", "tether", "_native", "keeper.c")
PROGRAM = "tether-keeper"
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2",
          "-fstack-protector-strong", "-fno-strict-aliasing"]


def _compiler() -> list[str] | None:
    for cand in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if not cand:
            continue
        argv = shlex.split(cand)
        if argv and shutil.which(argv[0]):
            return argv
    return None


def compile_keeper(out: str) -> str | None:
    """Compile the keeper to ``out``; None when it was built, else why not."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.environ.get("TETHER_NATIVE_BUILD", "1") == "0":
        return "TETHER_NATIVE_BUILD=0"
    cc = _compiler()
    if cc is None:
        return "no C compiler (install gcc)"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    # Linked dynamically: a static libc costs each keeper ~600 KiB more of
    # memory (its text is not shared with other processes; 720 vs 197 KiB PSS
    # measured with bench/spawn.py), for ~0.1 ms less per job open.
    r = subprocess.run([*cc, *CFLAGS, "-o", tmp, SOURCE], capture_output=True, text=True)
    if r.returncode == 0:
        os.replace(tmp, out)
        return None
    why = ((r.stderr or r.stdout).strip().splitlines() or ["failed"])[-1]
    try:
        os.unlink(tmp)
    except OSError:
        pass
    return f"{' '.join(cc)} failed: {why}"


class build_native(build_ext):
    """Compile the keeper program (not a Python extension)."""

    def run(self) -> None:
        inplace = self.inplace or getattr(self, "editable_mode", False)
        base = os.path.join("src", "tether") if inplace else os.path.join(self.build_lib,
                                                                          "tether")
        out = os.path.join(base, "_native", PROGRAM)
        why = compile_keeper(out)
        if why is not None:
            print(f"tether: the native keeper is not built ({why}); tether will run its "
                  "Python keeper (the same behaviour, slower)", file=sys.stderr)
        else:
            self._outputs = [out]

    def get_outputs(self) -> list[str]:
        return list(getattr(self, "_outputs", []))

    def get_source_files(self) -> list[str]:
        return [SOURCE]


if bdist_wheel is not None:
    class bdist_program_wheel(bdist_wheel):
        """py3-none-<platform>: the program needs this platform, not this Python."""

        def get_tag(self) -> tuple[str, str, str]:
            plat = super().get_tag()[2]
            return ("py3", "none", plat) if plat != "any" else ("py3", "none", "any")


class _WithProgram(Distribution):
    def has_ext_modules(self) -> bool:  # a platform wheel: it carries a program
        return sys.platform.startswith("linux")


_COMMANDS: dict = {"build_ext": build_native}
if bdist_wheel is not None:
    _COMMANDS["bdist_wheel"] = bdist_program_wheel
setup(cmdclass=_COMMANDS, distclass=_WithProgram)
