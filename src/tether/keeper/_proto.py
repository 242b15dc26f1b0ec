"""Messages between an owner and its keeper (POSIX): docs/protocol.md.

One message is one frame on a SOCK_STREAM unix socket: a 4-byte big-endian
length, then that many bytes of CBOR (RFC 8949; the subset the document
lists), one map. File descriptors ride on a frame's first bytes in
SCM_RIGHTS; a body larger than INLINE_MAX travels in a memfd
(``{"_memfd": size}`` + the fd). Any language can speak it: a peer that
cannot pass fds names the keeper's own (``inherit``) or paths (``open``).

A keeper serves its owner's socket and, after a fork, more: a forked child
of the owner sends ``{"op": "channel"}`` with one end of a new socketpair,
and from then on talks on that one (replies, and the exits of the children
it spawned); the keeper's answer comes there.
"""

from __future__ import annotations

import array
import errno
import os
import socket
import struct

from .._constants import INLINE_MAX, MAX_FDS, MAX_MSG, PROTOCOL_VERSION

__all__ = ["DONTWAIT", "INLINE_MAX", "MAX_FDS", "MAX_MSG", "PROTOCOL_VERSION", "Malformed", "decode",
           "encode", "recv", "send", "socketpair"]

_LEN = struct.Struct(">I")
_F64 = struct.Struct(">d")


def socketpair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


# -- CBOR ---------------------------------------------------------------------

def _head(out: bytearray, major: int, n: int) -> None:
    if n < 24:
        out.append(major | n)
    elif n < 0x100:
        out += bytes((major | 24, n))
    elif n < 0x10000:
        out.append(major | 25)
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(major | 26)
        out += n.to_bytes(4, "big")
    else:
        out.append(major | 27)
        out += n.to_bytes(8, "big")


# The encoded form of the strings every message repeats (keys, ops, the
# search path of each spawn), up to a bound: a spawn request is mostly them.
_TEXT: dict[str, bytes] = {}


def _text(obj: str) -> bytes:
    try:
        b = obj.encode()
        major = 0x60
    except UnicodeEncodeError:  # a name that is no UTF-8 (surrogateescape): its bytes
        b = obj.encode("utf-8", "surrogateescape")
        major = 0x40
    item = bytearray()
    _head(item, major, len(b))
    item += b
    done = bytes(item)
    if len(b) <= 256 and len(_TEXT) < 512:
        _TEXT[obj] = done
    return done


def _enc(obj: object, out: bytearray) -> None:
    t = type(obj)
    if t is str:
        out += _TEXT.get(obj) or _text(obj)  # type: ignore[arg-type, call-overload]
    elif t is bytes or t is bytearray:
        _head(out, 0x40, len(obj))  # type: ignore[arg-type]
        out += obj  # type: ignore[arg-type, operator]
    elif t is bool:
        out.append(0xF5 if obj else 0xF4)
    elif t is int:
        if 0 <= obj < 24:  # type: ignore[operator]
            out.append(obj)  # type: ignore[arg-type]
        elif obj >= 0:  # type: ignore[operator]
            _head(out, 0x00, obj)  # type: ignore[arg-type]
        else:
            _head(out, 0x20, -1 - obj)  # type: ignore[operator]
    elif obj is None:
        out.append(0xF6)
    elif t is dict:
        _head(out, 0xA0, len(obj))  # type: ignore[arg-type]
        for k, v in obj.items():  # type: ignore[attr-defined]
            if type(k) is str:
                out += _TEXT.get(k) or _text(k)
            else:
                _enc(k, out)
            tv = type(v)  # (the scalars of a request inline: a call each is most of its cost)
            if tv is bool:
                out.append(0xF5 if v else 0xF4)
            elif v is None:
                out.append(0xF6)
            elif tv is int and 0 <= v < 24:
                out.append(v)
            else:
                _enc(v, out)
    elif t is list or t is tuple:
        _head(out, 0x80, len(obj))  # type: ignore[arg-type]
        for v in obj:  # type: ignore[attr-defined]
            tv = type(v)
            if tv is str:  # (a spawn's search path)
                out += _TEXT.get(v) or _text(v)
            elif tv is int and 0 <= v < 24:
                out.append(v)
            elif tv is bytes and len(v) < 24:  # (argv)
                out.append(0x40 | len(v))
                out += v
            else:
                _enc(v, out)
    elif t is float:
        out.append(0xFB)
        out += _F64.pack(obj)
    elif isinstance(obj, int):  # an IntEnum, a signal number
        _enc(int(obj), out)
    else:
        raise TypeError(f"cannot send a {t.__name__}")


def encode(msg: dict) -> bytes:
    """The CBOR body of one message (no frame)."""
    out = bytearray()
    _enc(msg, out)
    return bytes(out)


def _arg(data: bytes, i: int, ai: int) -> tuple[int, int]:
    if ai < 24:
        return ai, i
    if ai > 27:
        raise ValueError("reserved or indefinite length where a number is")
    n = 1 << (ai - 24)
    if i + n > len(data):
        raise ValueError("truncated message")
    return int.from_bytes(data[i:i + n], "big"), i + n


# the decoded short texts (keys), as _TEXT; a reply's keys known from the start
_KEYS: dict[bytes, str] = {k.encode(): k for k in (
    "ok", "pid", "exit", "status", "kind", "errno", "strerror", "filename", "keeper", "ident")}


def _dec(data: bytes, i: int, depth: int) -> tuple[object, int]:
    if depth > 32:
        raise ValueError("nesting too deep")
    if i >= len(data):
        raise ValueError("truncated message")
    b = data[i]
    i += 1
    major, ai = b >> 5, b & 31
    if major == 7:
        if ai == 20 or ai == 21:
            return ai == 21, i
        if ai == 22:
            return None, i
        if 25 <= ai <= 27:
            n = 1 << (ai - 24)
            if i + n > len(data):
                raise ValueError("truncated message")
            fmt = {2: ">e", 4: ">f", 8: ">d"}[n]
            return struct.unpack(fmt, data[i:i + n])[0], i + n
        raise ValueError(f"unsupported simple value {ai}")
    if ai == 31 and major in (4, 5):  # indefinite-length array or map, to a break
        items: list = []
        while True:
            if i >= len(data):
                raise ValueError("truncated message")
            if data[i] == 0xFF:
                i += 1
                break
            v, i = _dec(data, i, depth + 1)
            items.append(v)
        if major == 4:
            return items, i
        if len(items) % 2:
            raise ValueError("a map with a key and no value")
        return dict(zip(items[::2], items[1::2], strict=True)), i
    n, i = _arg(data, i, ai)
    if major == 0:
        return n, i
    if major == 1:
        return -1 - n, i
    if major in (2, 3):
        if i + n > len(data):
            raise ValueError("a string longer than the message")
        raw = data[i:i + n]
        if major == 2:
            return raw, i + n
        text = _KEYS.get(raw)
        if text is None:
            text = raw.decode()
            if n <= 16 and len(_KEYS) < 256:
                _KEYS[raw] = text
        return text, i + n
    if major == 4:
        if n > len(data) - i:
            raise ValueError("more items than the message has bytes")
        out = []
        for _ in range(n):
            v, i = _dec(data, i, depth + 1)
            out.append(v)
        return out, i
    if major == 5:
        if n > len(data) - i:
            raise ValueError("more items than the message has bytes")
        d = {}
        for _ in range(n):
            k, i = _dec(data, i, depth + 1)
            v, i = _dec(data, i, depth + 1)
            d[k] = v  # (an unhashable key: TypeError, malformed)
        return d, i
    raise ValueError("tags are not part of the protocol")


def _flat_map(data: bytes) -> dict | None:
    """The common message, fast: one map whose keys are short texts and
    whose values are small integers, booleans, null or short texts (a reply,
    an exit report); None for anything else (then _dec reads it). A call per
    item is most of a small message's cost in Python."""
    n = len(data)
    if n < 2 or data[0] != 0xBF or data[-1] != 0xFF:
        return None
    out = {}
    i = 1
    keys = _KEYS
    while i < n - 1:
        b = data[i]
        if not 0x60 <= b < 0x78:
            return None
        j = i + 1 + (b - 0x60)
        key = keys.get(data[i + 1:j])
        if key is None or j >= n - 1:
            return None
        b = data[j]
        if b < 0x18:
            v: object = b
            i = j + 1
        elif b == 0x1A and j + 5 <= n:  # a pid, a status
            v = int.from_bytes(data[j + 1:j + 5], "big")
            i = j + 5
        elif b == 0x19 and j + 3 <= n:
            v = int.from_bytes(data[j + 1:j + 3], "big")
            i = j + 3
        elif b == 0x18 and j + 2 <= n:
            v = data[j + 1]
            i = j + 2
        elif b == 0xF5 or b == 0xF4:
            v = b == 0xF5
            i = j + 1
        elif b == 0xF6:
            v = None
            i = j + 1
        else:
            return None
        out[key] = v
    return out if i == n - 1 else None


def decode(data: bytes) -> object:
    """One CBOR item, the whole of data."""
    fast = _flat_map(data)
    if fast is not None:
        return fast
    obj, i = _dec(data, 0, 0)
    if i != len(data):
        raise ValueError("bytes after the message")
    return obj


def frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


# -- sending and receiving ----------------------------------------------------

def send(sock: socket.socket, msg: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
    data = encode(msg)
    extra = -1
    if len(data) > INLINE_MAX and hasattr(os, "memfd_create"):
        # A frame is at most MAX_MSG bytes; ARG_MAX can be more.
        extra = os.memfd_create("tether-msg", os.MFD_CLOEXEC)
        os.write(extra, data) if len(data) < (1 << 30) else None
        os.lseek(extra, 0, os.SEEK_SET)
        data = encode({"_memfd": len(data)})
        fds = [*fds, extra]
    data = _LEN.pack(len(data)) + data
    try:
        if fds:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
            n = sock.sendmsg([data], anc)
            if n < len(data):  # (the fds went with the first part)
                sock.sendall(data[n:])
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


_CMSG_SIZE = socket.CMSG_SPACE(MAX_FDS * 4)
# (plain ints: an operator on the socket module's IntFlag members costs
# microseconds per message)
_CLOEXEC = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
_CTRUNC = int(socket.MSG_CTRUNC)
DONTWAIT = int(socket.MSG_DONTWAIT)  # recv's flag for a look without waiting


def _take_fds(anc: list, fds: list[int]) -> None:
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - (len(payload) % arr.itemsize)])
            fds.extend(arr)


def _read_exact(sock: socket.socket, n: int, fds: list[int]) -> tuple[bytes | None, bool]:
    """n bytes (None at end of file before the first one), collecting fds;
    and whether fds were lost (MSG_CTRUNC)."""
    parts = []
    got = 0
    lost = False
    while got < n:
        data, anc, mflags, _ = sock.recvmsg(n - got, _CMSG_SIZE, _CLOEXEC)
        if anc:
            _take_fds(anc, fds)
        lost = lost or bool(mflags & _CTRUNC)
        if not data:
            if got == 0:
                return None, lost
            raise Malformed("the message was cut short (end of file)")
        parts.append(data)
        got += len(data)
    return (b"".join(parts) if len(parts) > 1 else parts[0]), lost


def recv(sock: socket.socket, flags: int = 0) -> tuple[dict | None, list[int]]:
    """One message, or (None, []) at end of file. Received fds are
    close-on-exec. ``flags=DONTWAIT``: BlockingIOError when no
    message has begun."""
    # The usual frame at the cost of two reads and no more Python than that:
    # a whole head (with the frame's fds, if any), a whole small body.
    head, anc, mflags, _ = sock.recvmsg(4, _CMSG_SIZE, _CLOEXEC | flags)
    fds: list[int] = []
    if anc:
        _take_fds(anc, fds)
    if len(head) == 4 and not mflags & _CTRUNC:
        size = int.from_bytes(head, "big")
        if 0 < size <= INLINE_MAX:
            try:
                data = sock.recv(size)
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            if len(data) == size:
                msg = _flat_map(data)
                if msg is not None and "_memfd" not in msg:
                    return msg, fds
                return _finish(sock, data, fds)
            head += data  # (a body in parts: read the rest as any other frame)
    return _recv_rest(sock, head, mflags, fds)


def _finish(sock: socket.socket, data: bytes, fds: list[int]) -> tuple[dict, list[int]]:
    """A whole body: its message (a memfd's, where it says so)."""
    try:
        msg = decode(data)
        if isinstance(msg, dict) and "_memfd" in msg and fds:
            mfd = fds.pop()
            try:
                msg = decode(_read_memfd(mfd, msg["_memfd"]))
            finally:
                os.close(mfd)
        if not isinstance(msg, dict):
            raise ValueError(f"a message is a map, not {type(msg).__name__}")
    except (ValueError, TypeError, KeyError, OverflowError, struct.error) as exc:
        for fd in fds:
            os.close(fd)
        raise Malformed(str(exc) or type(exc).__name__) from None
    return msg, fds


def _recv_rest(sock: socket.socket, got: bytes, mflags: int,
               fds: list[int]) -> tuple[dict | None, list[int]]:
    """The rest of a frame of which ``got`` (head, maybe part of the body)
    came: read to its end whatever is wrong with it, so the next is whole."""
    try:
        if not got:
            for fd in fds:
                os.close(fd)
            return None, []
        lost = bool(mflags & _CTRUNC)
        if len(got) < 4:
            more, lost2 = _read_exact(sock, 4 - len(got), fds)
            if more is None:
                raise Malformed("the message was cut short (end of file)")
            got += more
            lost = lost or lost2
        head, part = got[:4], got[4:]
        (size,) = _LEN.unpack(head)
        if size > MAX_MSG:
            _skip(sock, size - len(part), fds)
            raise Malformed("request larger than a message may be")
        data = part
        if size > len(part):
            more, lost2 = _read_exact(sock, size - len(part), fds)
            data += more or b""
            lost = lost or lost2
        if len(data) < size:
            raise Malformed("the message was cut short (end of file)")
        if lost:  # (the frame is read: the stream goes on)
            raise Malformed(_fds_lost(sock))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return _finish(sock, data, fds)


def _skip(sock: socket.socket, size: int, fds: list[int]) -> None:
    """Read a frame too large to take, and drop it: the next one is whole."""
    while size > 0:
        data, _ = _read_exact(sock, min(size, 1 << 16), fds)
        if data is None:
            return
        size -= len(data)


def _read_memfd(mfd: int, size: object) -> bytes:
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
    return b"".join(chunks)


class Malformed(ValueError):
    """A message that is not one: undecodable, truncated, too large."""
