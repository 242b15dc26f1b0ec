"""A stand-in for PowerShell 7's ``pwsh.exe`` in the Windows lane (Wine has no PowerShell).

``_lane_setup.py`` puts it behind pip's own ``.exe`` launcher as
``...\\PowerShell\\7\\pwsh.exe``, so it is found where the wrapper looks for
pwsh and, like pwsh.exe, gets its arguments from the C runtime's split of its
command line. (Its text must never name the wrapper: the wrapper's recursion
guard takes a program whose last KiB name it for a copy of itself.) It stands for that command-line handling only, not for the
language: it prints one line of JSON, ``{"argv": [ARG...]}``, and exits with N
when it was given ``-Command "exit N"`` (else 0).
"""

import json
import sys


def main() -> int:
    args = sys.argv[1:]
    print(json.dumps({"argv": args}), flush=True)
    if len(args) >= 2 and args[-2] == "-Command":
        words = args[-1].split()
        if len(words) == 2 and words[0].lower() == "exit":
            try:
                return int(words[1])
            except ValueError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
