"""The environment of another process, read: whether it carries an entry,
the value of one, whether it has none - and the processes that carry a
job's cookie.

A process tether starts carries its job's cookie in its environment
(``TETHER_JOB=<cookie>``, :data:`tether.identity.COOKIE_VAR`). It is what
still ties a process to its job when nothing else does - its keeper gone, a
double fork cutting the parent links - so a gate proof, a close under
``pgroup`` and the reaper ask it here. Linux reads ``/proc/PID/environ``
(at most 1 MiB); elsewhere psutil's ``environ()``. :func:`environ_has`
answers None for an environment it cannot read (another user's, a process
exiting or inside exec): that is not a "no".

Built on :mod:`tether.identity` (the process reader) and
:mod:`tether.capture` (:func:`carriers` makes one bounded capture); neither
imports this module, so there is no cycle (``identity.environ_has`` and the
others still resolve, lazily).
"""

import os

from . import identity
from .capture import capture
from .identity import _psutil, _read_fd, _stat_fields

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~20 ms of import time on a bare interpreter
    from .identity import Identity

__all__ = ["environ_has", "environ_empty", "environ_value", "carriers"]


_ENVIRON_CAP = 1 << 20  # an environment larger than this is not searched further
# Test knob: take the portable (psutil) path on Linux too, as macOS/BSD do.
_PORTABLE_ENVIRON = os.environ.get("_TETHER_PORTABLE_ENVIRON") == "1"


def environ_has(pid: int, entry: bytes) -> bool | None:
    """Whether the environment of ``pid`` holds ``entry`` (a whole
    ``NAME=value``): True or False, or None when it cannot be read (gone,
    another user's, exiting). Reads at most 1 MiB. Where there is no /proc,
    psutil's ``environ()``."""
    if not identity._LINUX or _PORTABLE_ENVIRON:  # identity's switch (a test turns it off)
        return _environ_has_psutil(pid, entry)
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
    except OSError:
        return None
    needle = b"\0" + entry + b"\0"
    try:
        data = b"\0"
        while len(data) < _ENVIRON_CAP:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
            if needle in data + b"\0":
                return True
        # Nothing at all: a process that is exiting (its memory is gone) reads
        # so, as does one that cleared its environment - not a "no".
        return False if len(data) > 1 else None
    except OSError:
        return None
    finally:
        os.close(fd)


def environ_empty(pid: int) -> bool:
    """Whether ``pid``'s environment is set up and empty (exec'd with none):
    ``/proc/PID/stat``'s env_start and env_end (proc(5) fields 50, 51) equal
    and not 0. An empty read of ``/proc/PID/environ`` means that, or a process
    exiting (no memory: 0 there) or inside exec (the new memory's fields are 0
    until the kernel lays out the new stack) - the two worth asking again.
    False where it cannot be told (not Linux, gone, fields not shown)."""
    if not identity._LINUX:
        return False
    try:
        fields = _stat_fields(pid, 49)
        start, end = int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return False
    return start == end != 0


def environ_value(pid: int, name: bytes) -> bytes | None:
    """The value of the first ``name=`` entry in the environment of ``pid``
    (Linux: at most 1 MiB read), or None: no such entry, or not readable. One
    read answers for many cookies at once (the reaper's search)."""
    if not identity._LINUX or _PORTABLE_ENVIRON:
        ps = _psutil()
        try:
            v = ps.Process(pid).environ().get(os.fsdecode(name))
        except (ps.Error, OSError):
            return None
        return None if v is None else os.fsencode(v)
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = b"\0" + _read_fd(fd, _ENVIRON_CAP)
    except OSError:
        return None
    i = data.find(b"\0" + name + b"=")
    if i < 0:
        return None
    start = i + len(name) + 2
    end = data.find(b"\0", start)
    return data[start:] if end < 0 else data[start:end]


def carriers(entry: bytes, *, born_after: int) -> "list[Identity]":
    """The live processes of this user (root: of anyone) born after
    ``born_after`` whose environment holds ``entry`` - a job's cookie, the
    whole ``NAME=value`` - and what those started: a job's members found
    from outside, when nothing else links them to it (its keeper is gone, or
    a double fork cut the parent links). One bounded capture; a zombie is
    left out."""
    cap = capture(born_after=born_after)
    uid = os.geteuid()
    found = {i.pid: i for i in cap.procs.values()
             if i.pid > 2 and i.state not in "ZXx" and (i.uid == uid or uid == 0)
             and environ_has(i.pid, entry)}
    for d in cap.descendants(list(found), born_after=born_after):
        if d.state not in "ZXx":
            found.setdefault(d.pid, d)
    return list(found.values())


def _environ_has_psutil(pid: int, entry: bytes) -> "bool | None":
    ps = _psutil()
    name, _, value = os.fsdecode(entry).partition("=")
    try:
        env = ps.Process(pid).environ()
    except (ps.Error, OSError):
        return None
    if not env:
        return None  # exiting, or no environment to read: not a "no"
    return env.get(name) == value
