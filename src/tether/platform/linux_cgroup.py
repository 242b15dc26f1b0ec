"""cgroup v2: one cgroup directory per job, ended with ``cgroup.kill``.

The kernel keeps every descendant of a member in the member's cgroup; an
unprivileged process cannot move itself out. The job's keeper, the native
program (``_native/keeper.c``), starts each child straight into the job's
cgroup (``clone3`` with ``CLONE_INTO_CGROUP``), so the child is a member
before its first instruction; the keeper itself stays outside, so that when
the owner dies one ``cgroup.kill`` ends every member, however it tried to
escape, and not the keeper. This module is the owner's side: it makes the
cgroup before the keeper starts (a refusal is known before anything runs),
lists its members, and removes it if the keeper could not. The cgroup files
themselves are read and written by ``tether.cgroupfs``.

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
from .base import CGROUP, Availability, Guarantee, JobOptions, KeeperMechanism

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
    kernel_keeps_members = True

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
        except OSError:
            if made_run is not None:
                try:
                    os.rmdir(made_run)
                except OSError:
                    pass
            raise
        self.params["cgroup_path"] = path
        self.params["mount"] = loc[0] if loc else None

    @property
    def path(self) -> str:
        return self.params["cgroup_path"]

    def member_pids(self, keeper_pid: int) -> list[int]:
        return [p for p in cg.procs(self.path) if p != keeper_pid]

    def owner_cleanup(self) -> None:
        if os.path.isdir(self.path) and not cg.populated(self.path):
            cg.remove_tree(self.path)

    def trace(self) -> dict:
        return {"cgroup_path": self.path}

