"""The timeout of a background job, enforced from inside the job.

``python -m tether._bgwatch SECONDS GRACE BORN [CGROUP]`` runs as one member
of a background job (one interpreter per job, not per spawn), so the job's
timeout holds after the host that started it is gone. Until the deadline it
sleeps, and leaves as soon as it is the job's last process; at the deadline
it ends every other member through ``tether.ending`` (SIGTERM, ``GRACE``
seconds, then ``cgroup.kill`` where the job has a cgroup, SIGKILL else).

Members are the job's cgroup (``CGROUP``), or the descendants of its keeper
(this process's parent); only processes born at or after ``BORN`` (kernel
ticks, when the job opened) are ever looked at.
"""

from __future__ import annotations

import os
import sys
import time

from . import cgroupfs, gate, identity, proctree
from .ending import end


def main(argv: list[str]) -> int:
    left, grace, born = float(argv[0]), float(argv[1]), int(argv[2])
    cg = argv[3] if len(argv) > 3 else ""
    me, keeper = os.getpid(), os.getppid()
    if keeper <= 1:
        return 0  # the keeper is gone already: so is the job's guard; nothing to time
    deadline = time.monotonic() + left

    def others() -> list[identity.Identity]:
        if cg:
            pids = cgroupfs.procs(cg)
            found = [i for i in map(identity.read, pids) if i is not None]
        else:
            found = proctree.descendants([keeper], born_after=born)
        return [i for i in found if i.pid not in (me, keeper) and i.start >= born
                and i.state not in ("Z", "X", "x")]

    time.sleep(0.2)  # the spawn that started us is still handing the job its first process
    while time.monotonic() < deadline:
        if not others():
            return 0
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def kill() -> None:
        if cg:
            # We are a member too: the kernel kill ends this process last of all.
            cgroupfs.kill(cg, timeout=1.0)

    # Proven by the job's cgroup, else as the keeper's tree (the keeper is the
    # subreaper every orphan of the job comes to).
    proof = gate.Proof(cgroup=cg or None)
    find = others if cg else proof.tracking(others, roots=[keeper])
    end(find, born_after=born, grace=grace, kill=kill if cg else None, kill_name="cgroup.kill",
        proof=lambda _i: proof)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
