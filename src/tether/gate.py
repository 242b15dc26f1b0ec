"""The signal gate: the one way tether signals a process that is not its own
unreaped child.

A process is named by its :class:`~tether.identity.Identity` (pid + start
ticks + boot id, read by :mod:`tether.identity`, the process reader). Before
a signal the gate pins the process (a pidfd on Linux >= 5.3), reads it again
while pinned, and sends only if it is still the one named and, where a
:class:`Proof` is given, proven to be the job's (its cgroup, its cookie, its
group or parent). It refuses PID <= 1, this process and its ancestors, and
another user's process unless the caller vouches for a member.

Reading lives in :mod:`tether.identity` and the cgroup file system in
:mod:`tether.cgroupfs`; this module uses both and neither uses it, so the
signal path has no import cycle. ``tests/test_signal_sites.py`` lists every
call in the source that sends a signal and fails on one that bypasses this
gate without a stated reason. keeper.c's ``kill_pid`` and shell.c's
``signal_if_still`` apply the same rules in C.
"""

import os
import sys

from tether import identity
from tether.errors import SignalRefused

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
    from collections.abc import Callable, Iterable

__all__ = ["Proof", "send_signal", "signal_child"]

_LINUX = sys.platform.startswith("linux")


def _refuse(ident: "identity.Identity", why: str) -> "SignalRefused":
    return SignalRefused(f"refusing to signal pid {ident[0]!r} ({why})")


class Proof:
    """What, besides pid + start ticks + boot id, proves a process is the one
    meant: its job's cookie (a whole ``NAME=value`` environment entry) and/or
    its job's cgroup directory.

    Start ticks have a 10 ms resolution, and a PID namespace with a writable
    ``ns_last_pid`` can hand a leftover's pid to a stranger within the same
    tick; the stranger then matches pid, start and boot. So before a signal
    to a process known from the past (an audit record, an earlier capture),
    :func:`send_signal` also asks its cgroup (a member of the job's cgroup is
    proven) or else its environment (it must carry the cookie). Where neither
    can be read, the process is spared: "identity ambiguous".

    ``groups`` and ``parents`` (the ``pgroup`` mechanism and PTY close,
    where no cgroup holds the job): ids of process groups or sessions, and
    pids, proven to be the job's a moment ago. A process that is a member,
    not the leader, of one of those groups or sessions, or whose parent is
    one of those pids, is proven too (read while the pidfd pins it): a group
    or session id is not reused while it has members, and a stranger handed
    a dead member's pid in the same tick has its own parent and, leading a
    group of its own, leads it - so only the cookie proves a leader.
    """

    __slots__ = ("cookie", "cgroup", "groups", "parents")

    def __init__(self, cookie: "bytes | None" = None, cgroup: "str | None" = None,
                 groups: "frozenset[int] | set[int]" = frozenset(),
                 parents: "frozenset[int] | set[int]" = frozenset()) -> None:
        self.cookie = cookie
        self.cgroup = cgroup
        self.groups = groups
        self.parents = parents

    def __repr__(self) -> str:
        return (f"Proof(cookie={self.cookie!r}, cgroup={self.cgroup!r}, "
                f"groups={len(self.groups)}, parents={len(self.parents)})")

    @classmethod
    def own_child(cls) -> "Proof":
        """This process's own child, not yet reaped: proven while its parent,
        read while the pidfd pins it, is this process (a child's pid is not
        reused before its parent reaps it)."""
        return cls(parents=frozenset({os.getpid()}))

    def tracking(self, find: "Callable[[], Iterable[identity.Identity]]",
                 roots: "Iterable[int]" = ()) -> "Callable[[], list[identity.Identity]]":
        """``find`` wrapped so that each look also proves: a process whose
        parent is one of ``roots`` (a keeper, this process) or of what the
        last look found is proven, as a tree found a moment ago is (its pids
        are pinned by their children's parent links; a stranger handed a
        member's pid has its own parent). Sets this proof's ``parents``."""
        base = frozenset(p for p in roots if p > 1)
        parents: set[int] = set(base)
        self.parents = parents

        def found() -> "list[identity.Identity]":
            got = list(find())
            parents.clear()
            parents.update(base)
            parents.update(i[0] for i in got if i[0] > 1)
            return got

        return found

    def _related(self, pid: int, cur: "identity.Identity | None") -> bool:
        if cur is None or not (self.groups or self.parents):
            return False
        if cur[3] in self.parents and cur[3] > 1:
            return True
        return any(v != pid and v > 1 and v in self.groups for v in (cur[4], cur[5]))

    def check(self, pid: int, cur: "identity.Identity | None" = None) -> "str | None":
        """None when ``pid`` is proven to be the job's, else why not.
        ``cur``: the process as read while pinned (its ppid, pgid and sid
        are asked of ``groups`` and ``parents``)."""
        if self._related(pid, cur):
            return None
        if self.cgroup:
            from . import cgroupfs  # only here: the wrapper's hot path never proves

            rel = cgroupfs.own(pid)
            if rel is not None:
                if cgroupfs.is_member(pid, self.cgroup):
                    return None
                if self.cookie is None:
                    return "not in its job's cgroup"
        if self.cookie:
            from . import environ  # only here, as cgroupfs above

            has = environ.environ_has(pid, self.cookie)
            if has:
                return None
            if has is False:
                return "it does not carry its job's cookie"
        if not self.cgroup and not self.cookie:
            if self.groups or self.parents:
                return "neither a member of its job's groups nor a child of its processes"
            return None  # nothing to prove with: pid + start + boot is all there is
        return "identity ambiguous: neither its cgroup nor its environment can be read"


def send_signal(ident: "identity.Identity", sig: int, *, member: bool = False,
                proof: "Proof | None" = None) -> bool:
    """Send ``sig`` to the process ``ident`` names, if it is still that process.

    THE one way tether signals any process that is not its own direct
    ``Popen`` child. Raises :class:`~tether.errors.SignalRefused`, before any
    signal-related system call, for PID <= 1 (which would mean a process
    group or every process), this process, and any of its ancestors; and,
    unless ``member=True`` (the caller vouches the process is a member of its
    job), for a process whose real uid is not ours. Also raised when the
    kernel denies permission (EPERM).

    Returns False, sending nothing, when the identity no longer matches: the
    process is gone, or its pid now names another process (different start
    or boot). Returns True when the signal was sent (a zombie that still
    matches counts: the signal is harmless to it).

    Linux >= 5.3 is race-free: a pidfd is opened first, which pins whichever
    process holds the pid at that instant; the identity is checked after; the
    signal goes through the pidfd, so it cannot reach a process that took the
    pid over in between. (If the check passes, the process holding the pid is
    the one named, and it held it at the open too: a process that took the pid
    over after the open would have a start tick at or after the open, which a
    recorded identity cannot have unless the old process died, was reaped and
    its pid was reused all within that one 10 ms tick.) That last case is what
    ``proof`` (a :class:`Proof`) closes: it is checked while the pidfd pins
    the process, and a process it does not prove is refused.
    """
    pid = ident[0]
    if type(pid) is not int:
        raise _refuse(ident, "not an integer pid")
    if pid <= 1:
        raise _refuse(ident, "PID <= 1 means init, a process group or every process")
    if pid == os.getpid():
        raise _refuse(ident, "that is this process")
    if identity.is_own_ancestor(pid):
        raise _refuse(ident, "that is an ancestor of this process")
    if ident[2] != identity.boot_id():
        return False  # recorded in another boot: the pid now names someone else

    fd = -1
    if _LINUX:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except AttributeError:
            fd = -1  # Python without os.pidfd_open: fall back to kill below
        except OSError as e:
            import errno

            if e.errno == errno.EINVAL:
                return False  # a thread id, not a process
            # ENOSYS (kernel < 5.3), EMFILE...: fall back to os.kill after the
            # identity check; the window between check and kill is then a few
            # microseconds, and reuse within it needs a full pid wrap-around.
            fd = -1
    try:
        # A vouched-for member needs no uid, and with a pidfd open a thread id
        # was already rejected (EINVAL): /proc/PID/stat alone is enough then.
        cur = identity.read_stat(pid) if (member and fd >= 0) else identity.read(pid)
        if cur is None or cur[1] != ident[1]:
            return False
        if proof is not None and cur[7] not in ("Z", "X", "x"):
            why = proof.check(pid, cur)
            # A process inside exit has no environment left to read: a signal
            # cannot hurt it any more, so it is sent (and counts) as to any.
            if why is not None and not identity.exiting(pid):
                raise _refuse(ident, why)
        if not member and _has_uid() and cur[6] != os.getuid():
            raise _refuse(
                ident,
                f"it belongs to uid {cur[6]}, not to this process's uid {os.getuid()}, "
                "and the caller did not say it is a job member",
            )
        try:
            if fd >= 0:
                import signal

                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return False  # exited after the check
        except PermissionError as e:
            raise _refuse(ident, "the kernel denied permission (EPERM)") from e
        return True
    finally:
        if fd >= 0:
            os.close(fd)


def signal_child(pid: int, sig: int, parent: int) -> bool:
    """Send ``sig`` to ``pid``, read a moment ago from the children list of
    ``parent``, if it is still a child of ``parent`` or of this process; True
    when sent. A kill loop's way (a subreaper's, whose processes carry no
    recorded identity yet): :func:`send_signal` checks a recorded start time,
    this checks the parent.

    Why: ``parent`` may reap that child (a wait already under way when a kill
    loop SIGKILLed it) and the pid go to another process. A child of this
    process is still that child (only we reap it); any other pid is pinned
    first (a pidfd) and its parent read while pinned (re-parented to us, it
    counts). False for one gone, not a child of either now, or that cannot be
    pinned (no fd). The refusals of :func:`send_signal` hold (PID <= 1, this
    process, an ancestor). keeper.c's kill_pid is the same rule."""
    me = os.getpid()
    if type(pid) is not int or pid <= 1 or pid == me:
        raise SignalRefused(f"refusing to signal pid {pid!r} (not a child)")
    if parent == me:
        try:
            os.kill(pid, sig)
        except OSError:
            return False
        return True
    if identity.is_own_ancestor(pid):
        raise SignalRefused(f"refusing to signal pid {pid!r} (an ancestor of this process)")
    fd = identity.open_pidfd(pid)
    if fd is None and identity.HAVE_PIDFD:
        return False
    try:
        cur = identity.read_stat(pid)  # the pinned one's, with a pidfd
        if cur is None or cur[3] not in (parent, me):
            return False
        if fd is None:  # no pidfd in this Python: the window of the read, a wrap-around
            os.kill(pid, sig)
        else:
            import signal

            signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _has_uid() -> bool:
    return hasattr(os, "getuid")  # Windows has no uids; psutil reports none there
