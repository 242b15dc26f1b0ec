"""cgroup v2: one cgroup directory per job, ended with ``cgroup.kill``.

The kernel keeps every descendant of a member in the member's cgroup; an
unprivileged process cannot move itself out. The keeper lives in the job's
cgroup while the job is open and starts each child there with vfork, so the
child is a member before its first instruction. When the owner dies it
ends every member, however it tried to escape: this (Python) keeper, which
lives in the job's cgroup, SIGKILLs every other process listed there by
pidfd, in rounds (``cgroupfs.kill_all_but``), reaps them, then steps out and
writes ``cgroup.kill`` for anything left; a ``cgroup.kill`` from inside would
end the keeper too, which could die before its members (re-parented to PID 1
while dying), and stepping out first is slow (below). The keeper is a child
subreaper, so a member's orphan is re-parented to it (and reaped at once)
rather than to PID 1. The cgroup files themselves are read and written by
``tether.cgroupfs``.

Pitfalls:
* ``cgroup.kill`` does not exist in the root cgroup (we never use the root)
  and needs Linux >= 5.14 (older kernels: freeze, kill each pid, thaw).
* Writing needs root or a delegated subtree (systemd gives every desktop user
  ``user@UID.service``); find the mount in /proc/self/mountinfo and our place
  in /proc/self/cgroup, never hard-code either.
* If the keeper is SIGKILLed first, the members survive but stay listed in
  the cgroup: the stale directory is proof enough for ``tether reap``.
"""

import os
import sys

from .. import cgroupfs as cg
from .._prctl import set_subreaper
from .base import CGROUP, Availability, Guarantee, JobOptions, KeeperMechanism, _NoContext

MECHANISM = CGROUP


def probe() -> "Availability":
    if not sys.platform.startswith("linux"):
        return Availability(CGROUP, False, "not Linux")
    base, why = cg.base_dir()
    if base is None:
        return Availability(CGROUP, False, why)
    probe_dir = os.path.join(base, cg.probe_dir_name(os.getpid()))
    try:
        os.mkdir(probe_dir)
    except OSError as exc:
        return Availability(CGROUP, False, f"cannot create a cgroup under {base}: {exc.strerror}")
    try:
        has_kill = os.path.exists(os.path.join(probe_dir, "cgroup.kill"))
    finally:
        try:
            os.rmdir(probe_dir)
        except OSError:
            pass
    note = "cgroup.kill" if has_kill else "no cgroup.kill (Linux < 5.14): freeze and kill each member"
    return Availability(CGROUP, True, f"writable cgroup v2 at {base}; {note}",
                        {"base": base, "cgroup_kill": has_kill})


def guarantee(options: "JobOptions | None" = None) -> "Guarantee":
    return Guarantee(
        mechanism=CGROUP,
        kernel_enforced=False,
        transparent=True,
        ends_job="tether's keeper writing cgroup.kill when the owner's pidfd fires",
        not_covered=(
            "if the keeper is SIGKILLed before the owner, members survive but stay listed in "
            "the job's cgroup (tether reap ends them with one cgroup.kill)",
            "a root process inside the job can move itself to another cgroup",
        ),
    )


class Mechanism(KeeperMechanism):
    name = CGROUP
    kernel_enforced = False

    def prepare(self) -> None:
        parent = self.options.parent
        parent_path = None
        if parent is not None:
            parent_path = (parent.trace() or {}).get("cgroup_path")
        # ".bg" marks a background job's cgroup: the reaper leaves it alone even
        # without an audit log.
        leaf = self.options.job_id + (cg.BACKGROUND_SUFFIX if self.options.background else "")
        made_run = None
        loc = cg.where()
        if parent_path:
            path = os.path.join(parent_path, leaf)
        else:
            base, why = cg.base_dir(loc)
            if base is None:
                raise OSError(why)
            if self.params.get("sweep", True):
                cg.remove_stale_run_dirs(base)
            run_dir = os.path.join(base, cg.run_dir_name(self.owner_pid, self.owner_start))
            try:
                os.mkdir(run_dir)
                made_run = run_dir
            except FileExistsError:
                pass
            path = os.path.join(run_dir, leaf)
        try:
            os.mkdir(path)
        except OSError as exc:
            # A shared job (tether-shell's scope caller: one cgroup per caller,
            # used by each of its commands) is opened again by each of them.
            if not (isinstance(exc, FileExistsError) and self.params.get("shared")):
                if made_run is not None:
                    try:
                        os.rmdir(made_run)
                    except OSError:
                        pass
                raise
        self.params["cgroup_path"] = path
        self.params["home_cgroup"] = loc[1] if loc else "/"
        self.params["mount"] = loc[0] if loc else None

    @property
    def path(self) -> str:
        return self.params["cgroup_path"]

    # The keeper lives in the job's cgroup while the job is open, so a child
    # is born there (posix_spawn, no move). A move into a cgroup is what is
    # slow: it takes the kernel's threadgroup lock for writing, and when no
    # move happened within the last RCU grace period that waits for one -
    # measured here 5.7 ms median, 13.6 ms p90 after 50 ms of quiet, 0.1 ms
    # right after another move. Moving in and out around every spawn paid it
    # on every spaced-out spawn (an agent's commands); now a job pays it
    # twice: at open, and before cgroup.kill (which would end the keeper too).
    inside = False
    keeper_inside = True  # the Python keeper; the native one clones into the job from outside
    kernel_keeps_members = True

    def _home_procs(self) -> str:
        home = cg.path_of(self.params["home_cgroup"], self.params["mount"])
        assert home is not None  # under the job's mount, found when it opened
        return os.path.join(home, "cgroup.procs")

    def keeper_setup(self, keeper) -> None:
        self._enter()
        # A member's orphan comes to the keeper, not to PID 1 (which may reap
        # late, or never: an app that is a container's PID 1); it stays a
        # member either way, so a refusal only leaves its parent as it was.
        try:
            set_subreaper()
        except OSError:
            pass

    def _enter(self) -> None:
        try:
            cg.write(os.path.join(self.path, "cgroup.procs"), "0")
            self.inside = True
        except OSError:
            # Not allowed in (a delegated subtree needs write access to the
            # common ancestor's cgroup.procs): spawn_context moves per spawn.
            self.inside = False

    def _leave(self) -> None:
        if self.inside:
            cg.write(self._home_procs(), "0")
            self.inside = False

    def step_aside(self) -> None:
        self._leave()

    def spawn_context(self):
        if not self.inside:
            self._enter()  # again after a terminate() that left the job open
        if self.inside:
            return _NoContext()  # born where the keeper is: no move
        return _Inside(self.path, os.path.dirname(self._home_procs()))

    def member_pids(self, keeper_pid: int) -> list[int]:
        return [p for p in cg.procs(self.path) if p != keeper_pid]

    def kill_all(self, keeper, timeout: float) -> None:
        if self.inside:
            # The members first, from in here, by pidfd: a move out first
            # waits for an RCU grace period (owner's death to last member's,
            # bench/kill_latency.py at 100: 16.8 ms, now 6.9), and a
            # cgroup.kill from in here would end this keeper with them
            # (their orphans would go to PID 1 as they die). Their
            # subreaper, it reaps them; then it steps out.
            cg.kill_all_but(self.path, os.getpid(), timeout, reap=keeper.reap)
        try:
            self._leave()
        except OSError:
            pass  # cannot step out: the kill below ends this keeper too (members first)
        cg.kill(self.path, timeout, reap=keeper.reap)

    def cleanup(self, keeper) -> None:
        try:
            self._leave()  # a background job's keeper waited inside until it emptied
        except OSError:
            pass
        cg.remove_tree(self.path)
        run_dir = os.path.dirname(self.path)
        if cg.parse_run_dir(os.path.basename(run_dir)) is not None:
            try:
                os.rmdir(run_dir)
            except OSError:
                pass

    def owner_cleanup(self) -> None:
        if os.path.isdir(self.path) and not cg.populated(self.path):
            cg.remove_tree(self.path)

    def trace(self) -> dict:
        return {"cgroup_path": self.path}


class _Inside:
    """Move the (single-threaded) keeper into the job cgroup around one spawn."""

    __slots__ = ("job", "home")

    def __init__(self, job: str, home: str):
        self.job = os.path.join(job, "cgroup.procs")
        self.home = os.path.join(home, "cgroup.procs")

    def __enter__(self):
        cg.write(self.job, "0")

    def __exit__(self, *exc):
        cg.write(self.home, "0")
        return False
