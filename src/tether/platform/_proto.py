"""Messages between an owner and its keeper (POSIX).

One message is one SOCK_SEQPACKET datagram: a ``marshal``-encoded dict plus
optional file descriptors in SCM_RIGHTS. Both ends are the same Python (a
forked copy, or ``sys.executable`` for the warden), so ``marshal`` is safe and
far cheaper to import and run than json or pickle.

A keeper serves its owner's socket and, after a fork, more: a forked child
of the owner sends ``{"op": "channel"}`` with one end of a new socketpair,
and from then on talks on that one (replies, and the exits of the children
it spawned); the keeper's answer comes there.
"""

from __future__ import annotations

import array
import errno
import marshal
import os
import socket

MAX_MSG = 1 << 20  # largest message that may travel inline (see INLINE_MAX)
MAX_FDS = 250  # SCM_RIGHTS limit is 253 per message


def socketpair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def encode(msg: dict) -> bytes:
    return marshal.dumps(msg)


INLINE_MAX = 64 * 1024  # bigger payloads (a huge environment) travel in a memfd
# recvmsg allocates its whole buffer for every message: a 1 MiB buffer costs an
# mmap/munmap pair per request, so size it for the largest inline message.
RECV_SIZE = INLINE_MAX + 4096


def send(sock: socket.socket, msg: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
    data = marshal.dumps(msg)
    extra = -1
    if len(data) > INLINE_MAX and hasattr(os, "memfd_create"):
        # A datagram cannot exceed the socket buffer (~208 KiB); ARG_MAX can.
        extra = os.memfd_create("tether-msg", os.MFD_CLOEXEC)
        os.write(extra, data) if len(data) < (1 << 30) else None
        os.lseek(extra, 0, os.SEEK_SET)
        data = marshal.dumps({"_memfd": len(data)})
        fds = [*fds, extra]
    try:
        if fds:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
            sock.sendmsg([data], anc)
        else:
            sock.sendall(data)
    finally:
        if extra != -1:
            os.close(extra)


def _fds_lost(sock: socket.socket) -> str:
    """Why a message's fds did not all arrive (MSG_CTRUNC): too many for
    one, or no room for them here (the kernel drops what it cannot install;
    a low ``ulimit -n`` reads as a malformed request otherwise)."""
    try:
        os.close(os.dup(sock.fileno()))
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            limit = ""
            try:  # (an import that needs a file to open fails here)
                import resource

                limit = f" (RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]})"
            except Exception:  # noqa: BLE001 - the number is a courtesy
                pass
            return ("the message's file descriptors could not be taken: the receiver is at its "
                    f"open-file limit{limit}")
    return "more file descriptors than a request may carry"


def recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message, or (None, []) at end of file. Received fds are close-on-exec."""
    fds_size = socket.CMSG_SPACE(MAX_FDS * 4)
    data, anc, flags, _ = sock.recvmsg(RECV_SIZE, fds_size, getattr(socket, "MSG_CMSG_CLOEXEC", 0))
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - (len(payload) % arr.itemsize)])
            fds.extend(arr)
    if not data and _hung_up(sock):
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError("request larger than a datagram may be" if flags & socket.MSG_TRUNC
                             else _fds_lost(sock))
        msg = marshal.loads(data)
        if isinstance(msg, dict) and "_memfd" in msg and fds:
            mfd = fds.pop()
            try:
                size = msg["_memfd"]
                import stat

                st = os.fstat(mfd)
                if not stat.S_ISREG(st.st_mode) or not isinstance(size, int) or \
                        not 0 <= size <= st.st_size:  # a pipe would block us for good
                    raise ValueError("truncated memfd payload (or not a memfd)")
                chunks = []
                while size > 0:
                    chunk = os.read(mfd, min(size, 1 << 20))
                    if not chunk:
                        raise ValueError("truncated memfd payload")
                    chunks.append(chunk)
                    size -= len(chunk)
                msg = marshal.loads(b"".join(chunks))
            finally:
                os.close(mfd)
        if not isinstance(msg, dict):  # None among them: only end of file means "gone"
            raise ValueError(f"a message is a dict, not {type(msg).__name__}")
    except (ValueError, EOFError, TypeError, OSError) as exc:
        for fd in fds:
            os.close(fd)
        raise Malformed(str(exc) or type(exc).__name__) from None
    return msg, fds


class Malformed(ValueError):
    """A message that is not one: undecodable, truncated, too large."""


def _hung_up(sock: socket.socket) -> bool:
    """After a zero-length read: the peer closed (EOF), or sent an empty datagram."""
    import select

    p = select.poll()
    p.register(sock.fileno(), select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))
