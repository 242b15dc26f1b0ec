"""PID namespace per job (strict): the keeper is the namespace's init.

When a PID namespace's init exits, the kernel SIGKILLs every other process
in it - even if every tether process was SIGKILLed first. The keeper (the
native program, ``keeper.c``) becomes that init: it calls
``unshare(CLONE_NEWPID)`` (with ``CLONE_NEWUSER`` when unprivileged: plain
CLONE_NEWPID is EPERM for users) and forks itself, which is PID 1 inside and
watches the owner through a pidfd inherited from outside (``getppid()`` is
0 in there, so the usual PDEATHSIG race check cannot work). This module is
the owner's side: the probe (which tries it for real), the guarantee, and
the members as the owner sees them.

Visible costs, stated by ``guarantee``: the job's processes see their own
PIDs (``echo $!`` prints a number the outside does not know; ``kill`` of a
PID read from the shared /proc, or of a server started outside, fails);
under a user namespace setuid programs such as sudo stop working. We map the
user to itself, so it does not appear as root inside.

Pitfalls: ``unshare(CLONE_NEWUSER)`` refuses a multi-threaded caller (the
intermediate is a fresh fork, single-threaded); after ``unshare(CLONE_NEWPID)``
the caller's later forks go into the namespace, and fail with ENOMEM once
its init exits - so the intermediate only forks once and exits.
"""

from __future__ import annotations

import os
import sys

from .. import identity, proctree
from .base import PIDNS, Availability, Guarantee, JobOptions, KeeperMechanism

MECHANISM = PIDNS

CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):
        os.unshare(flags)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter_new_namespace() -> None:
    """In a fresh single-threaded fork: new PID namespace (+ user ns if needed)."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        _unshare(CLONE_NEWPID)
        return
    _unshare(CLONE_NEWUSER | CLONE_NEWPID)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


_probe_cache: Availability | None = None


def probe() -> Availability:
    global _probe_cache
    if _probe_cache is not None:
        return _probe_cache
    _probe_cache = _probe()
    return _probe_cache


def _probe() -> Availability:
    if not sys.platform.startswith("linux"):
        return Availability(PIDNS, False, "not Linux")
    if not identity.HAVE_PIDFD:
        return Availability(PIDNS, False, "Python lacks os.pidfd_open (needs 3.9+ on Linux >= 5.3)")
    try:
        fd = os.pidfd_open(os.getpid())
        os.close(fd)
    except OSError as exc:
        return Availability(PIDNS, False, f"pidfd_open failed: {exc.strerror} (kernel older than 5.3?)")
    if os.geteuid() != 0:
        try:
            with open("/proc/sys/user/max_user_namespaces") as f:
                if int(f.read().strip() or 0) == 0:
                    return Availability(PIDNS, False, "user namespaces are disabled (user.max_user_namespaces = 0)")
        except OSError:
            pass
        try:
            with open("/proc/sys/kernel/unprivileged_userns_clone") as f:
                if f.read().strip() == "0":
                    return Availability(PIDNS, False, "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)")
        except OSError:
            pass
    # Try it for real in a throwaway fork: the only honest probe.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                enter_new_namespace()
                child = os.fork()
                if child == 0:
                    os._exit(0 if os.getpid() == 1 else 3)
                _, st = os.waitpid(child, 0)
                os.write(w, b"ok" if os.waitstatus_to_exitcode(st) == 0 else b"E:not pid 1")
            except OSError as exc:
                os.write(w, f"E:{exc.strerror or exc}".encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 512)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    if data == b"ok":
        how = "as root" if os.geteuid() == 0 else "with a user namespace (unprivileged)"
        return Availability(PIDNS, True, f"PID namespace {how}; kernel-enforced")
    why = data[2:].decode(errors="replace") or "unknown failure"
    what = "unshare(CLONE_NEWPID)" if os.geteuid() == 0 else "unshare(CLONE_NEWUSER|CLONE_NEWPID)"
    return Availability(PIDNS, False, f"{what} failed: {why}")


def guarantee(options: JobOptions | None = None) -> Guarantee:
    visible = ["the job's processes see their own PIDs: `echo $!` prints a PID the outside "
               "does not know; `kill` of a PID read from /proc or of a server started "
               "outside the job (kill $(pgrep -f devserver)) fails"]
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        visible.append("runs in a user namespace: setuid programs (sudo) do not work; "
                       "the user keeps its uid (mapped to itself)")
    return Guarantee(
        mechanism=PIDNS,
        kernel_enforced=True,
        transparent=False,
        ends_job="the kernel, when the namespace's init (tether's keeper) exits - it exits "
                 "when the owner's pidfd fires, and if it is killed the namespace dies with it",
        visible=tuple(visible),
        not_covered=("processes the job hands to an outside service (systemd-run, a "
                     "daemon reached over a socket) are outside the namespace",),
    )


class Mechanism(KeeperMechanism):
    """The owner's side of a pidns job; its keeper, the namespace's init, is
    the native program (``keeper.c``), which enters the namespace itself."""

    name = PIDNS
    kernel_enforced = True
    transparent = False
    joins_owner_group = False  # (the owner's group is not visible inside the namespace)

    def member_pids(self, keeper_pid: int) -> list[int]:
        return proctree.descendant_pids(keeper_pid)
