"""cgroup v2: one cgroup directory per job, ended with ``cgroup.kill``.

The kernel keeps every descendant of a member in the member's cgroup; an
unprivileged process cannot move itself out. The keeper lives in the job's
cgroup while the job is open and starts each child there with vfork, so the
child is a member before its first instruction; when the owner dies it moves
itself out and writes ``cgroup.kill`` - one write ends every member
atomically, however it tried to escape.

Pitfalls:
* ``cgroup.kill`` does not exist in the root cgroup (we never use the root)
  and needs Linux >= 5.14 (older kernels: freeze, kill each pid, thaw).
* Writing needs root or a delegated subtree (systemd gives every desktop user
  ``user@UID.service``); find the mount in /proc/self/mountinfo and our place
  in /proc/self/cgroup, never hard-code either.
* If the keeper is SIGKILLed first, the members survive but stay listed in
  the cgroup: the stale directory is proof enough for ``tether reap``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time

from ._linux_kill import (  # noqa: F401 - re-exported: they lived here first
    RUN_PREFIX,
    _procs,
    _write,
    cgroup2_mount,
    kill_cgroup,
    own_cgroup,
    populated,
    remove_tree,
)
from ._posix_base import KeeperMechanism
from .base import CGROUP, Availability, Guarantee


def base_dir() -> tuple[str | None, str]:
    """Where this process may create job cgroups, or (None, why not)."""
    mount = cgroup2_mount()
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    own = own_cgroup()
    if own is None:
        return None, "this process has no cgroup v2 membership (/proc/self/cgroup has no 0:: line)"
    own_dir = os.path.join(mount, own.lstrip("/")) if own != "/" else mount
    if not os.path.exists(os.path.join(mount, "cgroup.procs")):
        return None, f"{mount} is not a cgroup v2 mount"
    if not os.access(own_dir, os.W_OK) or not os.access(os.path.join(own_dir, "cgroup.procs"), os.W_OK):
        return None, (f"no writable cgroup v2: {own_dir} is not writable by uid {os.geteuid()} "
                      "(needs root or a delegated subtree such as user@UID.service)")
    return own_dir, ""


def probe() -> Availability:
    if not sys.platform.startswith("linux"):
        return Availability(CGROUP, False, "not Linux")
    base, why = base_dir()
    if base is None:
        return Availability(CGROUP, False, why)
    probe_dir = os.path.join(base, f"{RUN_PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe_dir)
    except OSError as exc:
        return Availability(CGROUP, False, f"cannot create a cgroup under {base}: {exc.strerror}")
    try:
        has_kill = os.path.exists(os.path.join(probe_dir, "cgroup.kill"))
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe_dir)
    note = "cgroup.kill" if has_kill else "no cgroup.kill (Linux < 5.14): freeze and kill each member"
    return Availability(CGROUP, True, f"writable cgroup v2 at {base}; {note}",
                        {"base": base, "cgroup_kill": has_kill})


_RUN_DIR = re.compile(re.escape(RUN_PREFIX) + r"(\d+)-(\d+)$")


def remove_stale_run_dirs(base: str) -> list[str]:
    """Remove this user's empty run directories under ``base`` whose owner
    (pid and start ticks, in the name) is no longer running: what a keeper
    that ended its job from inside, after its owner died, could not remove.
    A directory with any process in it is never touched (that is
    ``tether reap``'s work, with proof from the audit log)."""
    from .. import identity

    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        m = _RUN_DIR.match(name)
        if m is None:
            continue
        owner = identity.read(int(m.group(1)))
        if owner is not None and owner.start == int(m.group(2)):
            continue  # its owner is alive
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or populated(path):
            continue  # another user's (not ours to judge), or someone is in it
        if remove_tree(path):
            removed.append(path)
    return removed


class CgroupMechanism(KeeperMechanism):
    name = CGROUP
    kernel_enforced = False

    def prepare(self) -> None:
        parent = self.options.parent
        parent_path = None
        if parent is not None:
            parent_path = (parent.trace() or {}).get("cgroup_path")
        # ".bg" marks a background job's cgroup: the reaper leaves it alone even
        # without an audit log.
        leaf = self.options.job_id + (".bg" if self.options.background else "")
        if parent_path:
            path = os.path.join(parent_path, leaf)
        else:
            base, why = base_dir()
            if base is None:
                raise OSError(why)
            remove_stale_run_dirs(base)
            run_dir = os.path.join(base, f"{RUN_PREFIX}{self.owner_pid}-{self.owner_start}")
            with contextlib.suppress(FileExistsError):
                os.mkdir(run_dir)
            path = os.path.join(run_dir, leaf)
        os.mkdir(path)
        self.params["cgroup_path"] = path
        self.params["home_cgroup"] = own_cgroup() or "/"
        self.params["mount"] = cgroup2_mount()

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
    _inside = False
    keeper_inside = True

    def _home_procs(self) -> str:
        return os.path.join(self.params["mount"], self.params["home_cgroup"].lstrip("/"),
                            "cgroup.procs")

    def keeper_setup(self, keeper) -> None:
        self._enter()

    def _enter(self) -> None:
        try:
            _write(os.path.join(self.path, "cgroup.procs"), "0")
            self._inside = True
        except OSError:
            self._inside = False  # spawn_context moves in and out per spawn instead

    def _leave(self) -> None:
        if self._inside:
            _write(self._home_procs(), "0")
            self._inside = False

    def step_aside(self) -> None:
        self._leave()

    def spawn_context(self):
        if not self._inside:
            self._enter()  # again after a terminate() that left the job open
        if self._inside:
            return contextlib.nullcontext()
        return _Inside(self.path, os.path.dirname(self._home_procs()))

    def member_pids(self, keeper_pid: int) -> list[int]:
        return [p for p in _procs(self.path) if p != keeper_pid]

    def kill_all(self, keeper, timeout: float) -> None:
        try:
            self._leave()
        except OSError:
            pass  # cannot step out: the kill below ends this keeper too, members first
        kill_cgroup(self.path, timeout, reap=keeper.reap)

    def end_for_dead_owner(self, keeper) -> None:
        # Nobody waits for a report: one cgroup.kill from inside ends every
        # member and this keeper at once, without the slow move out first
        # (5.7 ms median here). The empty directories it leaves are removed by
        # the next job opened under the same cgroup, or by `tether reap`.
        if self._inside and os.path.exists(os.path.join(self.path, "cgroup.kill")):
            with contextlib.suppress(OSError):
                _write(os.path.join(self.path, "cgroup.kill"), "1")
                time.sleep(5)  # the SIGKILL is on its way to this process too
        super().end_for_dead_owner(keeper)

    def cleanup(self, keeper) -> None:
        with contextlib.suppress(OSError):
            self._leave()  # a background job's keeper waited inside until it emptied
        remove_tree(self.path)
        run_dir = os.path.dirname(self.path)
        if os.path.basename(run_dir).startswith(RUN_PREFIX):
            with contextlib.suppress(OSError):
                os.rmdir(run_dir)

    def owner_cleanup(self) -> None:
        if os.path.isdir(self.path) and not populated(self.path):
            remove_tree(self.path)

    def trace(self) -> dict:
        return {"cgroup_path": self.path}

    def guarantee(self) -> Guarantee:
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


class _Inside:
    """Move the (single-threaded) keeper into the job cgroup around one spawn."""

    __slots__ = ("job", "home")

    def __init__(self, job: str, home: str):
        self.job = os.path.join(job, "cgroup.procs")
        self.home = os.path.join(home, "cgroup.procs")

    def __enter__(self):
        _write(self.job, "0")

    def __exit__(self, *exc):
        _write(self.home, "0")
        return False
