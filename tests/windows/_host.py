"""A host application for the Windows lane's background-job tests.

``python.exe -S _host.py TOKEN STATE_DIR``

Opens a ``tether.Host``, asks for a background job and tries to start
``_child.py sleep TOKEN`` in it; also starts the same child with plain
``subprocess.Popen`` (it stays wherever the host is: the control). Prints one
line of JSON - the background job's guarantee and trace, and the pids it
started or why it was refused - then waits until stdin closes or a line
arrives, and exits without closing anything (the background job must
outlive it on purpose).
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    token, state_dir = sys.argv[1:3]
    from tether import Host
    from tether.errors import JobRefused

    child = [sys.executable, "-S", os.path.join(HERE, "_child.py"), "sleep", token]
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}
    host = Host("lane-app", state_dir, reap=False)
    bg = host.background_job("work", cpu_percent=None)
    g = bg.guarantee
    trace = bg.trace()
    out = {"disabled": g.disabled, "ends_job": g.ends_job, "not_covered": list(g.not_covered),
           "enclosing_job": trace.get("enclosing_job"), "leave": trace.get("leave")}
    try:
        out["background"] = bg.popen(child, **quiet).pid
    except JobRefused as e:
        out["refused"] = str(e)
    out["plain"] = subprocess.Popen(child, **quiet).pid
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
