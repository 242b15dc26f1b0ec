"""The warden: a fork server for Python keepers, for multi-threaded owners.

A Python keeper is a fork of its owner, and a multi-threaded process must
not fork (a lock another thread holds stays locked in the child). So such an
owner starts, on first need, one helper interpreter of its own, the warden,
single-threaded, and has it fork each keeper (``posix.KeeperJob`` sends it
the job's mechanism and the keeper's end of the socket). This module holds
both sides: the owner's (``_Warden``, ``warden``, ``helper_pids``) and the
warden process's own ``main``. That process runs as ``python -S -c`` and
imports what it needs, no more: the owner side's imports are cheap (no
``threading``, ``subprocess`` only when a warden is started).
"""

from __future__ import annotations

import _thread
import os
import select
import signal
import socket
import sys

from . import _proto

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
    from ..platform.base import KeeperMechanism


# -- the owner's side ------------------------------------------------------------------

class _Warden:
    """One helper interpreter per owner, started on first need, that forks keepers.

    A multi-threaded owner must not fork (locks held by other threads stay
    locked in the child). The warden is single-threaded, so it can.
    """

    def __init__(self) -> None:
        import subprocess  # (the owner has it loaded already; the warden needs it not)

        mine, theirs = _proto.socketpair()
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = (f"import sys; sys.path.insert(0, {src!r}); "
                "from tether.keeper._warden import main; main()")
        env = dict(os.environ)
        env["TETHER_WARDEN_FD"] = str(theirs.fileno())
        env["TETHER_OWNER_PID"] = str(os.getpid())
        self.proc = subprocess.Popen([sys.executable, "-S", "-c", code], pass_fds=(theirs.fileno(),),
                                     env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = mine
        self.lock = _thread.allocate_lock()
        self.pid = os.getpid()

    def create(self, mech: KeeperMechanism, child: socket.socket) -> None:
        o = mech.options
        msg = {"op": "create", "mech": mech.name, "name": o.name, "job_id": o.job_id,
               "background": o.background, "cookie": o.cookie, "cookie_var": o.cookie_var,
               "owner_pid": mech.owner_pid,
               "owner_start": mech.owner_start, "params": mech.params_for_keeper()}
        with self.lock:
            _proto.send(self.sock, msg, [child.fileno()])


_warden_lock = _thread.allocate_lock()
_the_warden: _Warden | None = None


def helper_pids() -> frozenset[int]:
    """This process's warden, while it runs: a helper of this process's that
    ends with it (it watches us by pidfd), neither a job's member nor a leak."""
    w = _the_warden
    if w is None or w.pid != os.getpid() or w.proc.poll() is not None:
        return frozenset()
    return frozenset({w.proc.pid})


def warden() -> _Warden:
    """This process's warden, started if it has none (or its parent's, after a fork)."""
    global _the_warden
    with _warden_lock:
        if _the_warden is None or _the_warden.pid != os.getpid() or _the_warden.proc.poll() is not None:
            _the_warden = _Warden()
        return _the_warden


# -- the warden process ----------------------------------------------------------------

def main() -> None:
    from .. import identity
    from .._prctl import name_process
    from ..platform import keeper_mechanism
    from ..platform.base import JobOptions
    from ._keeper import close_other_fds, detach_signals
    from ._keeper_socket import fork_keeper

    fd = int(os.environ.pop("TETHER_WARDEN_FD"))
    owner = int(os.environ.pop("TETHER_OWNER_PID"))
    sock = socket.socket(fileno=fd)
    os.setpgid(0, 0)
    name_process(b"tether-warden")
    detach_signals()
    owner_fd = identity.open_pidfd(owner)
    if os.getppid() != owner:  # the owner died before we could watch it
        os._exit(0)
    close_other_fds({fd, owner_fd} if owner_fd is not None else {fd})
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if owner_fd is not None:
        poller.register(owner_fd, select.POLLIN)
    while True:
        try:
            events = poller.poll(200)
        except InterruptedError:
            events = []
        _reap()
        for efd, _ in events:
            if efd == owner_fd:
                return _drain()
            msg, fds = _proto.recv(sock)
            if msg is None:
                return _drain()
            child = socket.socket(fileno=fds[0])
            try:
                options = JobOptions(name=msg["name"], job_id=msg["job_id"],
                                     background=msg["background"], cookie=msg.get("cookie"),
                                     cookie_var=msg.get("cookie_var") or "TETHER_JOB")
                mech = keeper_mechanism(msg["mech"])(options, msg["owner_pid"],
                                                     msg["owner_start"], **msg["params"])
                fork_keeper(mech, child, owner, owner_fd, extra_keep=())
            except Exception as exc:  # noqa: BLE001 - reported to the owner
                _proto.send(child, {"ready": False, "error": str(exc)})
            finally:
                child.close()
        if owner_fd is None and os.getppid() != owner:
            return _drain()


def _reap() -> None:
    from .. import identity

    identity.reap_exited()


def _drain() -> None:
    # Keepers watch the owner themselves; wait for them so none is left a zombie.
    from .. import identity

    identity.reap_exited(wait=True)
    os._exit(0)
