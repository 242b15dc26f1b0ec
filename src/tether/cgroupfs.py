"""cgroup v2 as files: the one module that reads and writes cgroupfs.

Everything tether does with cgroups goes through here: finding the v2 mount
(``/proc/self/mountinfo``, never hard-coded: it is ``/sys/fs/cgroup`` on
current distributions and ``/sys/fs/cgroup/unified`` on hybrid layouts),
a process's own cgroup (the ``0::`` line of ``/proc/PID/cgroup``), the
processes of a subtree, ``cgroup.kill``, removing a tree, and the names of
tether's own directories with their one parser:

    <a cgroup tether may write>/tether-<owner pid>-<owner start ticks>/   a run
                                 .../<job id>[.bg]/                       a job
                                 .../<job id>/<nested job id>/            a nested job

The run directory names its owner by identity, so whether a run is over is
a fact the kernel can be asked (:func:`prove_stale`), and ``tether reap``,
``tether ps``, the host and the next job all read the same names the same way.

Pitfalls: ``cgroup.kill`` does not exist in the root cgroup (tether never
uses the root) and needs Linux >= 5.14 (older kernels: freeze, SIGKILL each
member through a pidfd, thaw). Moving a process into a cgroup takes the
kernel's threadgroup lock and, after a quiet moment, waits for an RCU grace
period (5.7 ms median here): a hot path avoids moves.

Import-light (``os``, ``time``): the shell wrapper's one-command path uses it.
"""

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc costs start-up time: hints only
    from collections.abc import Iterator

__all__ = [
    "RUN_PREFIX", "BACKGROUND_SUFFIX", "mount", "own", "own_dir", "path_of", "where", "base_dir",
    "write", "procs_here", "procs", "populated", "kill", "remove_tree", "run_dir_name",
    "parse_run_dir", "probe_dir_name", "parse_probe_dir", "run_dir_of", "prove_stale",
    "remove_stale_run_dirs", "is_member", "SYSTEMD_MARKER", "SHELL_SCOPE_DIR", "PIN_DIR", "is_pin",
    "walk",
]

RUN_PREFIX = "tether-"
#: A job directory whose name ends so belongs to a background job: it
#: outlives its owner on purpose and no reaper ends it.
BACKGROUND_SUFFIX = ".bg"
#: The child cgroup of a native keeper's job that holds the job's pin: one
#: sleeping process, the keeper's child, that keeps an idle job's cgroup
#: populated (a spawn into an empty cgroup pays the kernel's cgroup.events
#: notice; see keeper.c's pin_job). Not a job, and its process not a member:
#: every reader skips it. Its cgroup.procs is read-only, so only root (who can
#: leave any cgroup anyway) could hide a member there; cgroup.kill of the job
#: ends it too.
from ._constants import PIN_DIR, SHELL_SCOPE_DIR  # noqa: E402 - shared with the C side

_PROBE = RUN_PREFIX + "probe-"
_SIGKILL = 9
_PIN_BATCH = 256  # pidfds held at once by a kill round (well below a 1024-fd limit)


# -- where -------------------------------------------------------------------------

def _read(path: str) -> bytes | None:
    # Bytes through one fd: a text-mode open costs more than the read (every
    # tether-shell command's keeper reads both files below).
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return data
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)


_MOUNT: tuple[int, str] | None = None  # (mount namespace, mount point) once found


def mount() -> str | None:
    """The cgroup v2 mount point, from ``/proc/self/mountinfo``; None if none.
    Remembered per mount namespace (the file is long, and every job open
    asked: ~0.1 ms a time)."""
    global _MOUNT
    try:
        ns = os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        ns = -1
    if _MOUNT is not None and _MOUNT[0] == ns and ns != -1:
        return _MOUNT[1]
    for line in (_read("/proc/self/mountinfo") or b"").split(b"\n"):
        left, _, right = line.partition(b" - ")
        if right.split(b" ", 1)[0] == b"cgroup2":
            point = left.split(b" ")[4].decode("utf-8", "replace").replace("\\040", " ")
            _MOUNT = (ns, point)
            return point
    return None


def own(pid: int | str = "self") -> str | None:
    """The v2 cgroup of ``pid`` as ``/proc/PID/cgroup`` names it (``/a/b``)."""
    for line in (_read(f"/proc/{pid}/cgroup") or b"").split(b"\n"):
        if line.startswith(b"0::"):
            return line[3:].strip().decode("utf-8", "replace")
    return None


def path_of(rel: str, where: str | None = None) -> str | None:
    """The directory of cgroup ``rel`` (as :func:`own` names it) under the mount."""
    where = where or mount()
    if where is None:
        return None
    return where if rel in ("", "/") else os.path.join(where, rel.lstrip("/"))


def is_pin(pid: int) -> bool:
    """Whether ``pid`` is a job's pin (it is in a :data:`PIN_DIR` cgroup)."""
    rel = own(pid)
    return rel is not None and rel.rsplit("/", 1)[-1] == PIN_DIR


def own_dir(pid: int | str = "self") -> str | None:
    """The directory of ``pid``'s own cgroup, or None."""
    rel = own(pid)
    return None if rel is None else path_of(rel)


def where(pid: int | str = "self") -> tuple[str, str, str] | None:
    """``(mount, own cgroup as /proc names it, its directory)`` of ``pid``,
    from one read of each file; None without cgroup v2."""
    m = mount()
    rel = own(pid) if m is not None else None
    if m is None or rel is None:
        return None
    d = path_of(rel, m)  # not None: m is a mount
    return None if d is None else (m, rel, d)


def base_dir(loc: tuple[str, str, str] | None = None) -> tuple[str | None, str]:
    """Where this process may create job cgroups (its own cgroup's directory),
    or ``(None, why not)``. ``loc``: :func:`where`, if already read."""
    if loc is None:
        loc = where()
    if loc is None:
        if mount() is None:
            return None, "no cgroup v2 hierarchy is mounted"
        return None, "this process has no cgroup v2 membership (/proc/self/cgroup has no 0:: line)"
    m, _rel, d = loc
    if not os.path.exists(os.path.join(m, "cgroup.procs")):
        return None, f"{m} is not a cgroup v2 mount"
    if not os.access(d, os.W_OK) or not os.access(os.path.join(d, "cgroup.procs"), os.W_OK):
        return None, (f"no writable cgroup v2: {d} is not writable by uid {os.geteuid()} "
                      f"(needs root or a delegated subtree such as "
                      f"user@{os.getuid()}.service)")
    if os.path.isdir(SYSTEMD_MARKER):  # one stat where systemd does not run
        from .systemd import delegation

        ok, why = delegation(d, m)
        if not ok:
            return None, why
    return d, ""


#: Present when systemd is the init system (what ``sd_booted()`` checks);
#: then ``tether.systemd.delegation`` decides whether a cgroup is ours to divide.
SYSTEMD_MARKER = "/run/systemd/system"


# -- files -------------------------------------------------------------------------

def write(path: str, data: str) -> None:
    """One write to a cgroup file (``cgroup.procs``, ``cgroup.kill``...)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def procs_here(path: str) -> list[int]:
    """The processes directly in cgroup ``path`` (not in its children)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError as e:
        if e.errno in (24, 23, 12):  # EMFILE, ENFILE, ENOMEM: an error, never "empty"
            raise
        return []  # the directory is gone
    except ValueError:
        return []


def _walk_error(e: OSError) -> None:
    if e.errno in (24, 23, 12):  # out of fds or memory: an error, never "no members"
        raise e


def walk(path: str, onerror=None) -> "Iterator[tuple[str, list[str], list[str]]]":
    """``os.walk(path)``, top-down, that never enters a job's pin cgroup
    (:data:`PIN_DIR`): the one walk of a job's cgroup tree for every reader
    of members or jobs. A caller may prune ``dirs`` in place, as with os.walk."""
    for dirpath, dirs, files in os.walk(path, onerror=onerror):
        if PIN_DIR in dirs:
            dirs.remove(PIN_DIR)
        yield dirpath, dirs, files


def procs(path: str) -> list[int]:
    """The processes in cgroup ``path`` and every cgroup below it (but a
    job's pin, :data:`PIN_DIR`)."""
    out: list[int] = []
    for dirpath, _dirs, _files in walk(path, onerror=_walk_error):
        out.extend(procs_here(dirpath))
    return out


def populated(path: str) -> bool:
    """Whether any process is in ``path`` or below (``cgroup.events``)."""
    try:
        with open(os.path.join(path, "cgroup.events"), "rb") as f:
            for line in f:
                if line.startswith(b"populated "):
                    return line.split()[1] != b"0"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    return bool(procs(path))


def is_member(pid: int, path: str) -> bool:
    """Whether ``pid`` is in cgroup ``path`` or below, as its own file says."""
    rel = own(pid)
    where = mount()
    if rel is None or where is None:
        return False
    mine = path_of(rel, where)
    return mine == path or (mine or "").startswith(path.rstrip("/") + "/")


def kill(path: str, timeout: float, reap=None) -> bool:
    """End every process in ``path`` and below (the kernel's own kill); True
    once it is empty. ``reap()`` is called between rounds (a keeper reaps
    its children there)."""
    deadline = time.monotonic() + timeout
    kill_file = os.path.join(path, "cgroup.kill")
    while True:
        if os.path.exists(kill_file):
            try:
                write(kill_file, "1")
            except OSError:
                pass
        else:  # Linux < 5.14: freeze so nobody forks between read and kill
            _kill_frozen(path)
        if reap is not None:
            reap()
        if not populated(path):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def _kill_each(pids: list[int], path: str) -> bool:
    """SIGKILL each of ``pids`` that is in ``path`` or below once pinned by a
    pidfd; False where there are no pidfds (nothing sent). Pinned in batches,
    then checked against one read of the cgroup: a pid listed there now is
    its pinned process (a live or zombie one keeps its pid), else that one is
    gone and the signal reaches nobody - one read, not one per process."""
    import _signal

    for at in range(0, len(pids), _PIN_BATCH):
        fds: dict[int, int] = {}
        try:
            for pid in pids[at:at + _PIN_BATCH]:
                try:
                    fds[pid] = os.pidfd_open(pid)
                except AttributeError:
                    return False
                except OSError as e:
                    if e.errno == 38:  # ENOSYS: a kernel before 5.3
                        return False
                    # gone (or out of fds: the next round tries again)
            still = set(procs(path))
            for pid, fd in fds.items():
                if pid in still:
                    try:
                        _signal.pidfd_send_signal(fd, _SIGKILL)
                    except OSError:
                        pass
        finally:
            for fd in fds.values():
                os.close(fd)
    return True


def _kill_frozen(path: str) -> None:
    freeze = os.path.join(path, "cgroup.freeze")
    try:
        write(freeze, "1")
    except OSError:
        pass
    _kill_each(procs(path), path)
    try:
        write(freeze, "0")
    except OSError:
        pass


def remove_tree(path: str) -> bool:
    """rmdir the cgroup and its children, deepest first; True if all went."""
    ok = True
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -t[0].count("/")):
        for _ in range(20):
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.002)
        else:
            ok = False
    return ok


# -- tether's names ------------------------------------------------------------------

def run_dir_name(owner_pid: int, owner_start: int) -> str:
    """The run directory of an owner: ``tether-<pid>-<start ticks>``."""
    return f"{RUN_PREFIX}{int(owner_pid)}-{int(owner_start)}"


def parse_run_dir(name: str) -> tuple[int, int] | None:
    """``(owner pid, owner start ticks)`` of a run directory's basename, or None."""
    if not name.startswith(RUN_PREFIX):
        return None
    pid, sep, start = name[len(RUN_PREFIX):].partition("-")
    if not sep or not (pid.isdigit() and start.isdigit() and pid.isascii() and start.isascii()):
        return None
    return int(pid), int(start)


def probe_dir_name(pid: int) -> str:
    return f"{_PROBE}{int(pid)}"


def parse_probe_dir(name: str) -> int | None:
    """The pid of a probe directory's basename (``tether-probe-<pid>``), or None."""
    if name.startswith(_PROBE) and name[len(_PROBE):].isdigit():
        return int(name[len(_PROBE):])
    return None


def run_dir_of(path: str, where: str | None = None) -> str | None:
    """The run directory at or above ``path`` inside the mount, or None."""
    where = where or mount()
    if where is None:
        return None
    try:
        real = os.path.realpath(path)
    except OSError:
        return None
    where = os.path.realpath(where)
    if real != where and not real.startswith(where.rstrip("/") + "/"):
        return None
    p = real
    while len(p) > len(where):
        if parse_run_dir(os.path.basename(p)) is not None:
            return p
        p = os.path.dirname(p)
    return None


def prove_stale(run_dir: str) -> str | None:
    """The one check before any ``cgroup.kill`` of a run directory that is not
    the caller's own: None when it is provably a leftover, else why not.

    Provably a leftover: a real directory (not a symlink) named as a run
    directory, owned by this user, whose owner - by pid and start ticks, from
    its name - is no longer running, and which does not hold the caller (an
    ancestor of the caller's own cgroup, where a kill would end the caller).
    """
    from . import identity  # only here: the wrapper's hot path never proves

    parsed = parse_run_dir(os.path.basename(run_dir.rstrip("/")))
    if parsed is None:
        return "not a tether run directory"
    try:
        st = os.lstat(run_dir)
    except OSError as e:
        return f"cannot stat it ({e.strerror})"
    if (st.st_mode & 0o170000) != 0o040000:
        return "not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}"
    owner = identity.Identity(parsed[0], parsed[1], identity.boot_id())
    if identity.is_alive(owner):
        return f"its owner (pid {parsed[0]}) is running"
    mine = own_dir()
    real = os.path.realpath(run_dir)
    if mine is not None and (mine == real or mine.startswith(real.rstrip("/") + "/")):
        return "it holds this process"
    return None


def remove_stale_run_dirs(base: str) -> list[str]:
    """Remove this user's *empty* run directories under ``base`` that
    :func:`prove_stale` proves are leftovers (what a keeper killed before it
    could remove them left). A directory with any
    process in it is never touched: ending that is ``tether reap``'s work."""
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if parse_run_dir(name) is None:
            continue
        path = os.path.join(base, name)
        if prove_stale(path) is not None or populated(path):
            continue
        if remove_tree(path):
            removed.append(path)
    return removed
