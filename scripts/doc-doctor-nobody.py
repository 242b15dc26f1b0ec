#!/usr/bin/env python3
"""Compare docs/guarantees.md's `runuser -u nobody -- tether doctor` sample
with a real run of it (scripts/check-wheels.sh runs this, as root, with the
x86-64 wheel installed into a venv uid 65534 can read: the sample shows that
install). The comparison is tests/test_docs.py's (numbers, install paths and
`...` lines are loose); the venv's path is read as the sample's.

usage: python3 scripts/doc-doctor-nobody.py VENV   (exit 0: the page says what ran)
"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import test_docs  # noqa: E402 - the docs' own reader and matcher

CMD = "runuser -u nobody -- tether doctor"


def main() -> int:
    venv = os.path.abspath(sys.argv[1])
    sample = [b for b in test_docs.blocks("docs/guarantees.md")
              if b.kind == "shown" and b.text.startswith(f"$ {CMD}\n")]
    if len(sample) != 1:
        print(f"docs/guarantees.md: {len(sample)} samples of `{CMD}`, not 1")
        return 1
    want = sample[0].text.splitlines()[1:]
    shown_venv = next((w.split("(", 1)[1].split("/lib/python", 1)[0] for w in want
                       if "the native keeper (" in w), None)
    r = subprocess.run(["runuser", "-u", "nobody", "--", "env", "-i", "HOME=/", "LANG=C.UTF-8",
                        f"PATH={venv}/bin:/usr/bin:/bin", "tether", "doctor"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    got = (r.stdout + r.stderr).replace(venv, shown_venv or venv).splitlines()
    while got and not got[-1].strip():
        got.pop()
    if r.returncode != 0 or not test_docs._matches(want, got):
        print(f"docs/guarantees.md:{sample[0].line}: `{CMD}` printed (exit {r.returncode})")
        print("\n".join(got))
        print("--- the page says")
        print("\n".join(want))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
