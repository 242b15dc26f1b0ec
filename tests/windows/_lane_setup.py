"""The Windows lane's programs, made as a Windows user gets them.

Run by scripts/windows-lane.sh inside the Windows CPython, under Wine:

    python.exe -S _lane_setup.py PIP_WHEEL TETHER_WHEEL DEST

* ``DEST\\tether``: tether's wheel installed by pip itself
  (``pip install --prefix``), so ``DEST\\tether\\Scripts`` holds the console
  scripts exactly as pip makes them on Windows (``tether.exe``,
  ``tether-cmd.exe``, ...). Their launchers start this Python, whose
  ``._pth`` file puts the checkout's ``src`` first: the launchers run the
  code under test.
* ``DEST\\PowerShell\\7\\pwsh.exe``: the stand-in pwsh (``_pwsh.py``) behind
  the same launcher, made by pip's own ``ScriptMaker``.

Stdlib and the pip wheel only.
"""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    pip_wheel, tether_wheel, dest = sys.argv[1:4]
    # platform.uname() asks WMI, which crashes Wine 8 (propsys.VariantToString
    # is missing); without _wmi, platform uses its own fallback.
    sys.modules["_wmi"] = None  # type: ignore[assignment]
    sys.path.insert(0, pip_wheel)
    from pip._internal.cli.main import main as pip_main

    prefix = os.path.join(dest, "tether")
    shutil.rmtree(prefix, ignore_errors=True)
    # --ignore-installed: this Python's path puts the checkout's src first,
    # and an editable install there (CI's) leaves tether.egg-info, which pip
    # would take for tether already installed, and install nothing.
    rc = pip_main(["install", "--quiet", "--no-deps", "--no-index", "--no-compile",
                   "--ignore-installed", "--disable-pip-version-check", "--prefix", prefix,
                   tether_wheel])
    if rc:
        print(f"pip install of {tether_wheel} failed: {rc}", flush=True)
        return 1

    from pip._vendor.distlib.scripts import ScriptMaker

    target = os.path.join(dest, "PowerShell", "7")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    src = os.path.join(dest, "pwsh.py")
    with open(os.path.join(HERE, "_pwsh.py")) as f, open(src, "w") as out:
        out.write("#!python\n" + f.read())  # the shebang ScriptMaker rewrites to this Python
    maker = ScriptMaker(dest, target, add_launchers=True)
    maker.executable = sys.executable
    maker.variants = {""}
    made = maker.make("pwsh.py")
    os.unlink(src)
    print("made", *sorted(os.listdir(os.path.join(prefix, "Scripts"))), *made, flush=True)
    return 0 if os.path.isfile(os.path.join(target, "pwsh.exe")) else 1


if __name__ == "__main__":
    sys.exit(main())
