"""Entry point of the warden interpreter (see ``posix._Warden``)."""

from __future__ import annotations

import os
import select
import signal
import socket


def main() -> None:
    from .. import identity
    from .._prctl import name_process
    from . import _proto, keeper_mechanism
    from ._keeper import close_other_fds, detach_signals
    from ._keeper_socket import fork_keeper
    from .base import JobOptions

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
