"""tether-shell's audit records: :class:`ShellLog`, what it writes and where.

Every command ``tether-shell`` runs leaves records in tether's audit log
(``audit.jsonl`` in the state directory, :func:`log_dir`) - its start, its
end, or why it did not start - so ``tether reap`` and ``tether ps`` see the
job and what it left behind. This module is that writer, apart from the
wrapper (``tether.shell``) that runs the command: the records' fields, the
tiny JSON encoder, and the one-``os.write`` append that spares each command
the import of ``tether.audit`` (which does the rotation, carry and pruning
whenever more than an append is needed). The native tether-shell
(``_native/shell.c``) writes the same records the same way. The checks of
``TETHER_SHELL_*`` values live here too (``TETHER_SHELL_LOG*`` are read
first, by :meth:`ShellLog.from_env`); ``tether.shell`` uses them for its own.

It is on tether-shell's hot path (logging is on by default), so it imports
what ``tether.shell`` does: ``os``, ``sys`` and ``tether._constants``; the
rest only when needed.
"""

import os
import sys

from ._constants import AUDIT_MAX_BYTES, AUDIT_PRUNE_EVERY, SHELL_JOB, SHELL_SCOPE_JOB
from ._constants import SHELL_LOG_START_ROOM as START_ROOM

__all__ = ["ShellLog", "log_dir"]

DEFAULT_LOG_DAYS = 14
DEFAULT_LOG_MAX_BYTES = AUDIT_MAX_BYTES
_PROG = "tether-shell"
_BOOLS = {"1": True, "on": True, "yes": True, "true": True,
          "0": False, "off": False, "no": False, "false": False}

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .audit import AuditWriter


# -- the per-day audit log ---------------------------------------------------------

def log_dir(env: "dict[str, str] | os._Environ[str] | None" = None) -> str:
    """Where the log lives: ``$TETHER_STATE_DIR``, else ``$XDG_STATE_HOME/tether``,
    else ``~/.local/state/tether`` (Windows: ``%LOCALAPPDATA%\\tether``) - the same
    state directory as tether's spawn-audit log. A relative or blank
    ``$TETHER_STATE_DIR`` is a ``UsageError``, as everywhere."""
    env = os.environ if env is None else env
    d = env.get("TETHER_STATE_DIR")
    if d:
        path = os.path.expanduser(d)
        if not os.path.isabs(path):
            # the audit's rule and words (a relative one would follow each
            # command's working directory): a UsageError
            from .statedir import state_dir_arg

            path = os.fspath(state_dir_arg(d, "TETHER_STATE_DIR"))
        return path
    if sys.platform == "win32":
        base = env.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
        return os.path.join(base, "tether")
    xdg = env.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: ignore a relative value
        return os.path.join(xdg, "tether")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "tether")


def _json_value(v: object) -> str:
    # The records hold numbers, booleans, fixed words, ids and paths - never
    # command text, arguments or environment values - so a tiny encoder does
    # (json costs ~1 ms to import); ASCII only, as tether.audit writes.
    t = type(v)
    if t is int:
        return str(v)
    if t is str:
        return _json_str(v)  # type: ignore[arg-type]
    if t is dict:
        return "{" + ",".join([f"{_json_str(k)}:{_json_value(x)}"
                               for k, x in v.items()]) + "}"  # type: ignore[attr-defined]
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return repr(v) if v == v and v not in (float("inf"), float("-inf")) else "null"
    return _json_str(str(v))


def _json_str(s: str) -> str:
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) > 0x7E:
            if ord(c) > 0xFFFF:  # a surrogate pair, as json.dumps(ensure_ascii=True) writes it
                n = ord(c) - 0x10000
                out.append(f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}")
            else:
                out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _ident(pid: "int | None", start: "int | None") -> "dict[str, object] | None":
    """An identity as ``tether.shell._job_fields`` gives it: ``{"pid", "start"}`` (start
    ticks; the record's ``boot`` says of which boot)."""
    if not pid or not start:
        return None
    return {"pid": pid, "start": start}


class ShellLog:
    """tether-shell's records, written as ordinary audit records by
    ``tether.audit.AuditWriter`` into the audit log (``audit.jsonl`` in
    :func:`log_dir`): its rotation, carry and pruning, with ``max_bytes`` =
    ``TETHER_SHELL_LOG_MAX_BYTES`` and ``keep_days`` = ``TETHER_SHELL_LOG_DAYS``.

    A command's start is a ``job-open`` (``run``, ``job``, ``name``
    ``tether-shell``, ``scope``, ``owner`` - the wrapper, or in scope
    ``caller`` the caller -, ``keeper``, ``caller``, ``cookie``,
    ``cookie_var`` when not ``TETHER_JOB``, ``cgroup``, ``mechanism``) and a
    ``spawn`` of the shell (``pid``, ``start``, ``boot``, ``in_job``); its end
    an ``exit`` (``status``: the code, or minus the signal; or ``error``:
    ``no-status``/``keeper-died``; ``leftovers``, ``ms``, ``stopped_by``,
    ``ended_by``) and a ``job-close``; a command that did not start an
    ``error`` record (``error``: ``usage``, ``no-shell``, ``job-refused`` or
    an errno name such as ``ENOENT``). Every record has ``app``
    ``tether-shell``, ``wrapper`` (this pid) and ``mechanism``; ``job-open``
    and ``error`` also ``parent`` (the caller's pid), ``mode``
    (``shell``/``interactive``/``comspec``), ``argc``, and ``job-open``
    ``login``. Never command text, arguments or environment values. The
    generic path (no one-command job) names its own run and job, with the
    wrapper as owner.

    An unusable directory or file (a symlink, another user's, writable by
    others, not a regular file: the audit writer's rules) turns logging off,
    silently: the command runs anyway.

    As the native tether-shell does, an event's records are appended here in
    one ``os.write`` (``tether.audit`` costs milliseconds to import) while
    nothing else is needed: the checks pass, the live file is not within
    ``START_ROOM`` of ``max_bytes``, and the last prune (the lock file's
    mtime) is younger than ``tether.audit.PRUNE_EVERY``. Otherwise the
    ``AuditWriter`` writes them (and rotates, carries, prunes, or refuses).
    """

    def __init__(self, directory: str, keep_days: int = DEFAULT_LOG_DAYS,
                 max_bytes: int = DEFAULT_LOG_MAX_BYTES) -> None:
        self.directory = directory
        self.keep_days = keep_days
        self.max_bytes = max_bytes
        self.writer: AuditWriter | None = None
        self.off = False
        self.fd: int | None = None  # the live file, while appending here will do
        self._fast_tried = False
        self._job: dict[str, object] | None = None  # the generic path's run and job

    @classmethod
    def from_env(cls, env: "dict[str, str] | os._Environ[str] | None" = None) -> "ShellLog | None":
        """The log ``TETHER_SHELL_LOG*`` ask for, or None (off); raises
        ``UsageError`` for a bad value of any of them."""
        env = os.environ if env is None else env
        on = _bool_env(env, "TETHER_SHELL_LOG", True)
        days = _int_env(env, "TETHER_SHELL_LOG_DAYS", DEFAULT_LOG_DAYS)
        cap = _int_env(env, "TETHER_SHELL_LOG_MAX_BYTES", DEFAULT_LOG_MAX_BYTES)
        if not on:
            return None
        try:
            directory = log_dir(env)
        except (KeyError, RuntimeError):  # no home directory at all
            return None
        return cls(directory, days, cap)

    def _writer(self):
        if self.writer is None and not self.off:
            from .audit import AuditDirError, AuditWriter

            try:
                self.writer = AuditWriter(self.directory, max_bytes=self.max_bytes,
                                          keep_days=self.keep_days, on_loss=lambda _m: None)
            except (AuditDirError, OSError, ValueError):
                self.off = True
        return self.writer

    def write(self, event: str, *, child: int | None, mode: str | None,
              mechanism: str | None, detail: dict[str, object],
              job: "dict[str, object] | None" = None) -> bool:
        """One event of the command (``start``, ``exit`` or ``error``) as its
        audit records; ``job``: the fields that name the job (``tether.shell._job_fields``)."""
        base: dict[str, object] = {"app": _PROG, "wrapper": os.getpid(), "mechanism": mechanism}
        if event == "error":
            return self._emit([("error", {**base, "parent": _parent_pid(), "mode": mode,
                                          **detail})])
        if job is None:
            job = self._generic(child)
        boot = job.get("boot")

        def tok(v: object) -> "str | None":  # start ticks as the audit log writes them
            if type(v) is dict:
                v = v.get("start")
            return f"{v}@{boot}" if type(v) is int and v and type(boot) is str else None

        def ident(v: object) -> "dict[str, object] | None":
            t = tok(v)
            return {"pid": v["pid"], "start": t} if t and type(v) is dict else None

        scope, cg = job.get("scope"), job.get("cgroup")
        names = {"run": job["run"], "job": job["job"]}
        proc = {"pid": child, "start": tok(job.get("start"))} if child else {}
        recs: list[tuple[str, dict[str, object]]] = []
        if event == "start":
            recs.append(("job-open", {
                **base, **names, "name": SHELL_SCOPE_JOB if scope == "caller" else SHELL_JOB,
                "scope": scope, "owner": ident(job.get("owner")), "keeper": ident(job.get("keeper")),
                "caller": ident(job.get("caller")), "cookie": job.get("cookie"),
                "cookie_var": job.get("cookie_var"), "cgroup": cg, "parent": _parent_pid(),
                "mode": mode, **detail}))
            if proc:
                recs.append(("spawn", {**base, **names, **proc, "boot": boot, "in_job": True,
                                       "cgroup": cg}))
            return self._emit(recs)
        st: dict[str, object] = dict(detail)
        if "code" in st:
            st["status"] = st.pop("code")
        elif "signal" in st:
            st["status"] = -int(st.pop("signal"))  # type: ignore[call-overload]
        if proc:
            recs.append(("exit", {**base, **names, **proc, **st}))
        left = detail.get("leftovers")
        # A command's job is over when it returned; in scope caller only if it
        # left nothing (what it left ends with the caller).
        if scope != "caller" or left == 0:
            recs.append(("job-close", {**base, **names, "leftovers": left}))
        return self._emit(recs)

    def _emit(self, recs: "list[tuple[str, dict[str, object]]]") -> bool:
        """The records of one event: appended in one write where that will do, else
        through the audit writer. None fields are left out (absent, not null)."""
        recs = [(ev, {k: v for k, v in f.items() if v is not None}) for ev, f in recs]
        fd = self._fast()
        if fd is not None:
            import time

            ts = time.time()
            data = "".join(_json_value({"v": 1, "ts": ts, "event": ev, **f}) + "\n"
                           for ev, f in recs).encode("ascii", "backslashreplace")
            try:
                if os.write(fd, data) == len(data):
                    return True
            except OSError:
                pass
            self.fd = None  # trouble: the audit writer's to say and handle
        w = self._writer()
        if w is None:
            return False
        ok = True
        for ev, f in recs:
            ok = w.write(ev, **f) and ok
        return ok

    def _fast(self) -> "int | None":
        """The live file opened to append, if nothing but an append is needed (see
        the class doc); decided once."""
        if self._fast_tried:
            return self.fd
        self._fast_tried = True
        if not _FAST:
            return None
        try:
            try:
                st = os.lstat(self.directory)
            except FileNotFoundError:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
                st = os.lstat(self.directory)
            if not _safe_dir(st):
                return None
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                          | os.O_CLOEXEC)
            try:
                if not _safe_dir(os.fstat(dfd)) or _has_acl(dfd) or not _pruned_lately(dfd):
                    return None
                fd = os.open("audit.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                             | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600, dir_fd=dfd)
            finally:
                os.close(dfd)
            st = os.fstat(fd)
            if not _ours_only(st, fd) or (st.st_size and st.st_size + START_ROOM > self.max_bytes):
                os.close(fd)
                return None
            self.fd = fd
        except OSError:
            return None
        return fd

    def _generic(self, child: "int | None") -> "dict[str, object]":
        """The generic path's run and job, named here (the one-command path names its own)."""
        if self._job is None:
            from .audit_fields import new_run_id
            from .identity import boot_id, read

            me = read(os.getpid())
            kid = read(child) if child else None
            self._job = {"run": new_run_id(), "job": "1", "scope": "command", "boot": boot_id(),
                         "owner": _ident(os.getpid(), me.start if me else None),
                         "start": kid.start if kid else None}
        return self._job

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        if self.writer is not None:
            self.writer.close()


_FAST = sys.platform.startswith("linux") and os.open in os.supports_dir_fd
_LOCK = "audit.jsonl.lock"
_PRUNE_EVERY = AUDIT_PRUNE_EVERY


def _parent_pid() -> int:
    if sys.platform == "win32":  # os.getppid() aborts the process under Wine: see identity
        from .identity import parent_pid

        return parent_pid()
    return os.getppid()


def _safe_dir(st: "os.stat_result") -> bool:
    """A directory (not a link to one) of ours that no one else can write."""
    return (st.st_mode & 0o170000) == 0o040000 and st.st_uid == os.geteuid() \
        and not st.st_mode & 0o022


def _has_acl(fd: int) -> bool:
    try:
        os.getxattr(fd, "system.posix_acl_access")
    except OSError:  # ENODATA (no ACL) or ENOTSUP
        return False
    return True


def _ours_only(st: "os.stat_result", fd: int) -> bool:
    """A regular file of ours that no one else can write (``tether.audit.file_refusal``'s
    rule; anything it would have to judge is left to it)."""
    return (st.st_mode & 0o170000) == 0o100000 and st.st_uid == os.geteuid() \
        and not st.st_mode & 0o022 and not _has_acl(fd)


def _pruned_lately(dfd: int) -> bool:
    """The last prune (the lock file's mtime) is recent, or the lock file is new."""
    import time

    try:
        st = os.stat(_LOCK, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        try:
            os.close(os.open(_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dfd))
        except FileExistsError:
            pass
        return True
    now = time.time()
    return (st.st_mode & 0o170000) == 0o100000 and st.st_uid == os.geteuid() \
        and not st.st_mode & 0o022 and now - _PRUNE_EVERY < st.st_mtime <= now


# -- the TETHER_SHELL_* values (tether.shell checks its others with these too) ------

def _usage(msg: str) -> "BaseException":
    from .errors import UsageError

    return UsageError(msg)


def _bool_env(env, name: str, default: bool) -> bool:
    v = env.get(name)
    if not v:
        return default
    b = _BOOLS.get(v.lower())
    if b is None:
        raise _usage(f"{name} must be 1 or 0 (on/off, yes/no, true/false), not {v!r}")
    return b


def _int_env(env, name: str, default: int) -> int:
    v = env.get(name)
    if not v:
        return default
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n <= 0:
        raise _usage(f"{name} must be a positive whole number, not {v!r}")
    return n
