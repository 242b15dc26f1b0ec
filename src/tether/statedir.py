"""Where tether keeps its state, and which directories and files it refuses.

The state directory (:func:`default_state_dir`: ``$TETHER_STATE_DIR``, else
``$XDG_STATE_HOME/tether``, else ``~/.local/state/tether``) holds the audit
log (:mod:`tether.audit`) and a host's session locks. Whoever can write there
could plant records that steer the reaper, or files that hang or redirect a
writer. So tether refuses:

* a directory that is a symbolic link, is owned by another user, or that
  another user can write (group/other mode bits, or a POSIX ACL):
  :func:`check_dir` raises :class:`AuditDirError`, and :func:`_open_dir`
  checks the same again through the descriptor it opens;
* a file in it that is not a regular file (a FIFO, a socket, a device), is
  owned by another user, or that another user can write: :func:`file_refusal`,
  judged through the descriptor once it is open.

Files there are opened relative to a descriptor of the checked directory,
never following a link and never blocking (a FIFO planted there hangs
nothing): the ``_O_*`` flags and ``_DIR_FD`` below, which the writer and the
reader use. Windows has no owners, modes or directory descriptors to check:
only a link, or a directory or file of the wrong kind, is refused there.

A state directory the user names is checked here too: :func:`state_dir_arg`
(the command line, ``$TETHER_STATE_DIR``: absolute only) and
:func:`resolve_state_dir` (the API: a relative one resolved once).

Split from :mod:`tether.audit`, which imports it at load and still offers
these names (``audit.check_dir``). Standard library only, plus
``tether.errors``: ``tether-shell`` loads it on its logging path.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from tether.errors import TetherError

__all__ = [
    "AuditDirError",
    "state_dir_arg",
    "resolve_state_dir",
    "default_state_dir",
    "file_refusal",
    "check_dir",
]

_WINDOWS = sys.platform == "win32"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOINHERIT", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
# Every open of a log file, a rotated copy or the lock file is non-blocking
# (a FIFO planted there must never hang anything) and never follows a link;
# what it opened is checked through the fd before a byte is read or written.
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# Directory-relative syscalls close the window in which the checked directory
# could be swapped for a symlink; Windows has none, it uses paths.
_DIR_FD = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and not _WINDOWS


class AuditDirError(TetherError):
    """The audit directory is unsafe to use (symlink, other owner, writable by others)."""


# --------------------------------------------------------------------------
# where the log lives


def state_dir_arg(value: str | os.PathLike[str], what: str = "--state-dir") -> Path:
    """A state directory given by the user, checked: not empty, absolute (a
    relative one would follow whatever directory each process runs in).
    ``~`` is expanded. Raises :class:`tether.errors.UsageError` otherwise."""
    from .errors import UsageError

    text = os.fspath(value)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        raise UsageError(f"{what} must not be empty")
    p = Path(text).expanduser()
    if not p.is_absolute():
        raise UsageError(f"{what} must be an absolute path, not {text!r}")
    return p


def resolve_state_dir(value: str | os.PathLike[str]) -> Path:
    """A state directory given through the API: a relative one resolved once,
    against the current directory (a later ``chdir`` must not move the log
    or a host's locks). An empty or blank one is a ``ValueError``: it would
    be the current directory, silently (say, a setting left unset), or a
    directory named by blanks in it."""
    text = os.fspath(value)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        raise ValueError(f"state_dir must not be empty or blank, not {text!r} "
                         "(None: the default)")
    return Path(os.path.abspath(text))


def default_state_dir() -> Path:
    """``$TETHER_STATE_DIR``, else ``$XDG_STATE_HOME/tether``, else
    ``~/.local/state/tether`` (Windows: ``%LOCALAPPDATA%\\tether``).
    A relative ``$TETHER_STATE_DIR`` is a :class:`tether.errors.UsageError`
    (an empty one means unset)."""
    env = os.environ.get("TETHER_STATE_DIR")
    if env:
        return state_dir_arg(env, "TETHER_STATE_DIR")
    if _WINDOWS:
        base = os.environ.get("LOCALAPPDATA")
        if base:
            return Path(base) / "tether"
        return Path.home() / "AppData" / "Local" / "tether"
    xdg = os.environ.get("XDG_STATE_HOME")
    # The XDG spec says a relative value is invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "tether"
    return Path.home() / ".local" / "state" / "tether"


_ACL_XATTR = "system.posix_acl_access"
_ACL_USER, _ACL_GROUP, _ACL_WRITE = 0x02, 0x08, 0x02


def _acl_grants_write(target: int | str | Path) -> bool:
    """Whether a POSIX ACL on ``target`` (an fd or a path) gives a named user
    or group write access. Its binary form: a 4-byte version, then 8-byte
    entries (tag u16, perm u16, id u32). The ACL mask is not applied: an
    entry that would grant write once the mask is widened is refused too."""
    getxattr = getattr(os, "getxattr", None)
    if getxattr is None:
        return False
    try:
        raw = getxattr(target, _ACL_XATTR) if isinstance(target, int) else \
            getxattr(os.fspath(target), _ACL_XATTR, follow_symlinks=False)
    except OSError:  # ENODATA: no ACL; ENOTSUP: a file system without them
        return False
    euid = os.geteuid()
    for off in range(4, len(raw) - 7, 8):
        tag = int.from_bytes(raw[off:off + 2], "little")
        perm = int.from_bytes(raw[off + 2:off + 4], "little")
        ident = int.from_bytes(raw[off + 4:off + 8], "little")
        if perm & _ACL_WRITE and (tag == _ACL_GROUP or (tag == _ACL_USER and ident != euid)):
            return True
    return False


def file_refusal(st: os.stat_result, fd: int | None = None) -> str | None:
    """Why an opened log file, rotated copy or lock file (its fstat, and its
    fd for the ACL) must not be read or written, or None: it is not a regular
    file (a FIFO, a socket, a device), another user owns it, or another user
    can write it (group/other mode bits, or an ACL)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if _WINDOWS:
        return None
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if fd is not None and _acl_grants_write(fd):
        return "an ACL lets another user write it"
    return None


def _refusal(path: Path | str, st: os.stat_result) -> str | None:
    """Why a directory with this (l)stat must not hold the audit log, or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"audit directory {path} is a symbolic link; refusing to use it"
    if not stat.S_ISDIR(st.st_mode):
        return f"audit directory {path} is not a directory"
    if _WINDOWS:
        return None  # owner and mode bits mean nothing there; ACLs are out of scope
    euid = os.geteuid()
    if st.st_uid != euid:
        return (
            f"audit directory {path} is owned by uid {st.st_uid}, not by this user "
            f"(uid {euid}); refusing to use it"
        )
    if st.st_mode & 0o022:
        return (
            f"audit directory {path} is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); refusing to use it (chmod 700 it)"
        )
    if _acl_grants_write(path):
        return (f"audit directory {path} has an ACL that lets another user write it; "
                "refusing to use it (setfacl -b it)")
    return None


def check_dir(path: str | os.PathLike[str], *, create: bool = True) -> Path:
    """Return *path* as a Path if it is safe to hold the audit log.

    Creates it (mode 0700, parents with the default mode) when missing and
    *create* is true. Raises :class:`AuditDirError` for a directory that is a
    symlink, owned by another user, or group/other-writable, and
    ``FileNotFoundError`` (an OSError) when missing and *create* is false.
    Other OSErrors (a read-only parent, ...) propagate.
    """
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        if not create:
            raise
        os.makedirs(p, mode=0o700, exist_ok=True)
        st = os.lstat(p)
    why = _refusal(p, st)
    if why:
        raise AuditDirError(why)
    return p


def _open_dir(path: Path) -> int:
    """An fd on the checked directory, verified through the fd itself."""
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    try:
        why = _refusal(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    if why:
        os.close(fd)
        raise AuditDirError(why)
    return fd
