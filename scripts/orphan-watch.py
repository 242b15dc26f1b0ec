#!/usr/bin/env python3
"""Run a command and record every process re-parented to PID 1 while it runs.

scripts/leak-check.py says what is left at the end; this says what was an
orphan on the way, however briefly, and which test it came from (its
PYTEST_CURRENT_TEST). Every 10 ms it captures the processes born after the
command started (identity.capture: bounded, born-after) and keeps those
whose parent is PID 1 and that are not zombies. One JSON line per process
goes to OUT (pid, comm, command line, test, how long it was seen); a summary
by name and test is printed.

    python3 scripts/orphan-watch.py OUT -- COMMAND [ARGS...]
    python3 scripts/orphan-watch.py /tmp/orphans.jsonl -- bash .ci/run

Exit status: the command's. Reads only; it signals nothing.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from tether import identity  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    out = argv[0]
    born = identity.now_ticks()
    p = subprocess.Popen(argv[2:])
    seen: dict[tuple[int, int], dict] = {}
    try:
        while p.poll() is None:
            now = time.monotonic()
            for ident in identity.capture(born_after=born).procs.values():
                if ident.ppid != 1 or ident.state in "ZX" or ident.pid == p.pid:
                    continue
                row = seen.get((ident.pid, ident.start))
                if row is None:
                    test = identity.environ_value(ident.pid, b"PYTEST_CURRENT_TEST") or b"-"
                    seen[(ident.pid, ident.start)] = {
                        "pid": ident.pid, "comm": ident.comm, "cmd": identity.cmdline(ident.pid)[:200],
                        "test": test.decode(errors="replace"), "first": now, "last": now}
                else:
                    row["last"] = now
            time.sleep(0.01)
    finally:
        if p.poll() is None:  # interrupted: the command is ours, started above
            p.terminate()
        p.wait()
    with open(out, "w") as f:
        for row in seen.values():
            row["seen_s"] = round(row.pop("last") - row.pop("first"), 3)
            f.write(json.dumps(row) + "\n")
    by = collections.Counter((r["comm"], r["test"].split(" ")[0]) for r in seen.values())
    print(f"orphan-watch: {len(seen)} processes had PID 1 as parent while the command ran; "
          f"written to {out}")
    for (comm, test), n in by.most_common(20):
        print(f"  {n:5d}  {comm:<16} {test}")
    return p.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
