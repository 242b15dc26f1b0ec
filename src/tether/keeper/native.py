"""The native keeper: ``tether-keeper``, one small C program per job.

What it is: on Linux, the one keeper of the cgroup, subreaper and pidns
mechanisms (``src/tether/_native/keeper.c``), spoken to over a socket in the
protocol of ``docs/protocol.md`` (``_proto`` is the Python end). It is built
when tether is installed; setup.py stops a Linux build that cannot compile
it. A job costs a ~100 KiB process instead of a forked interpreter, a spawn
is one ``clone3`` straight into the job, and an owner with threads needs no
warden (a fork server): ``posix_spawn`` of the helper is safe from any
thread.

There is no second implementation to fall back to: where the program is
missing (a source tree never built, a copied install), a job of those
mechanisms is refused (:class:`tether.errors.JobRefused`) with the fix in
one line, and ``tether doctor`` says the same. The Python keeper
(``_keeper_socket``) serves only ``pgroup``, the keeper of macOS and the BSDs.

The owner's death reaches it twice: by the owner's pidfd, and earlier, at the
start of the owner's exit, by the owner's beacon (``_beacon``) where this
process has one.

Trap: the helper must get nothing of the owner but its control socket, the
owner's pidfd and the beacon's page. ``posix_spawn`` keeps every inheritable fd, so the
helper closes all others itself before it serves, and its stdio is
``/dev/null`` (a keeper holding the owner's stdout would keep a pipe's
reader waiting after the owner is gone).
"""

import errno
import os

HELPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_native",
                      "tether-keeper")
# Test knob: another build of the same program (the sanitizer build in CI).
HELPER = os.environ.get("_TETHER_NATIVE_HELPER") or HELPER
# What a sanitizer build reads (it writes its reports where these say).
_PASSED_ON = ("ASAN_OPTIONS", "UBSAN_OPTIONS")
MECHANISMS = ("cgroup", "subreaper", "pidns")
#: Test knob, read when a job opens: its keeper answers as if the owner's
#: /proc could not be read (the owner then sends its state itself).
NO_OWNER_STATE = "_TETHER_TEST_NO_OWNER_STATE"
#: The fix, in one line, where the program is missing.
FIX = ("reinstall tether with a C compiler and the Linux headers present (Debian, Ubuntu: "
       "apt-get install gcc libc6-dev), or install a tether wheel")


def built() -> bool:
    return os.access(HELPER, os.X_OK)


def status() -> "tuple[bool, str]":
    """Whether the native keeper is here, and what that means, in words for
    ``doctor``."""
    if built():
        return True, f"the native keeper ({HELPER}, {linkage(HELPER)})"
    return False, (f"none: {HELPER} is missing, so jobs of {', '.join(MECHANISMS)} are "
                   f"refused; {FIX}")


def required(mechanism: str) -> bool:
    """Whether a job of ``mechanism`` is kept by the native keeper (every
    mechanism of :data:`MECHANISMS`); raises :class:`tether.errors.JobRefused`
    naming the fix when it is one of them and the program is missing."""
    if mechanism not in MECHANISMS:
        return False
    if not built():
        from ..errors import JobRefused

        why = f"tether's native keeper is not built ({HELPER} is missing)"
        raise JobRefused(f"{mechanism}: {why}; {FIX}", reason=why, mechanism=mechanism)
    return True


def start(mech, ctl_child: int, owner_pid: int, owner_pidfd: "int | None") -> int:
    """Start the native keeper of ``mech`` serving socket fd ``ctl_child``;
    its pid (a child of this process, to be reaped by the caller)."""

    # The fds move above every source first (any may be 0-2 in an owner
    # that closed its stdio), then stdio becomes /dev/null.
    from . import _beacon  # (not at import: the one-command path loads this module too)

    beacon = _beacon.for_keeper() if owner_pid == os.getpid() else None
    hi = max(ctl_child, owner_pidfd if owner_pidfd is not None else 0,
             beacon[0] if beacon else 0, 2) + 1
    actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [(os.POSIX_SPAWN_DUP2, ctl_child, hi)]
    if owner_pidfd is not None:
        actions.append((os.POSIX_SPAWN_DUP2, owner_pidfd, hi + 1))
    if beacon:
        actions.append((os.POSIX_SPAWN_DUP2, beacon[0], hi + 2))
    actions += [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0),
                (os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]
    args = [HELPER, "serve", mech.name, str(hi), str(owner_pid),
            str(hi + 1) if owner_pidfd is not None else "-1"]
    if mech.name == "cgroup":
        args += [f"cgroup={mech.params['cgroup_path']}", f"mount={mech.params.get('mount') or ''}"]
    if mech.options.background:
        args.append("background=1")
    if os.environ.get("_TETHER_NATIVE_LEGACY") == "1":  # tests: the old-kernel paths
        args.append("legacy=1")
    if mech.params.get("no_owner_state"):  # NO_OWNER_STATE, read when the job opened
        args.append("owner_state=0")  # tests: the owner sends its state itself
    if beacon:
        args.append(f"beacon={hi + 2}:{beacon[1]}")
    env = {k: os.environ[k] for k in _PASSED_ON if k in os.environ}
    # No setsigdef: exec resets handled signals, and the keeper sets every
    # disposition itself first (ignored ones included); 64 sigactions fewer
    # in the vfork'd child the owner waits for.
    try:
        return os.posix_spawn(HELPER, args, env, file_actions=actions, setpgroup=0, setsigmask=())
    except OSError as exc:
        if exc.errno == errno.EBADF:  # the dup2 above to a number past RLIMIT_NOFILE
            raise OSError(errno.EMFILE, f"this process is at its open-file limit (its keeper's "
                          f"fds would be {hi} and up)") from None
        raise


#: The commands that are native programs on Linux where they could be built
#: (``_native/shell.c``; setup.py installs them): each hands what it does
#: not serve to the Python one installed beside it.
FRONT_ENDS = (("tether-shell", "tether-shell-py", "tether-shell -c CMD"),
              ("tether", "tether-py", "tether run -- CMD"))


def linkage(path: str) -> str:
    """``linked statically`` (setup.py links against musl where it can: no
    libc pages shared with, and charged against, other processes) or
    ``linked dynamically`` (the system's libc), from the ELF's program
    headers: a dynamic program names its loader (PT_INTERP)."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:  # ELF64 only
                return "linkage unknown"
            end = "<" if head[5] == 1 else ">"
            phoff, = struct.unpack_from(end + "Q", head, 32)
            phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return "linkage unknown"
    for k in range(min(phnum, len(table) // max(phentsize, 1))):
        if struct.unpack_from(end + "I", table, k * phentsize)[0] == 3:  # PT_INTERP
            return "linked dynamically"
    return "linked statically"


def is_program(path: str) -> bool:
    """Whether ``path`` is a compiled program (ELF) we may run: the native
    front end, where a script is the Python one."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return False
    except OSError:
        return False
    return os.access(path, os.X_OK)


def front_ends(bindir: "str | None" = None) -> "list[dict[str, object]]":
    """For ``doctor``: whether ``tether-shell`` and ``tether`` (beside this
    interpreter, or in ``bindir``) are the native programs, in words."""
    import sys

    bindir = bindir or os.path.dirname(sys.executable)
    out = []
    for name, fallback, serves in FRONT_ENDS:
        path = os.path.join(bindir, name)
        if not os.path.exists(path):
            out.append({"name": name, "native": False, "path": None,
                        "what": f"not installed beside {sys.executable}"})
            continue
        native = is_program(path)
        if not native:
            what = "the Python one (no native program was built at install time)"
        else:
            what = (f"native ({linkage(path)}): serves {serves} with no interpreter, "
                    f"the rest by {fallback}")
        out.append({"name": name, "native": native, "path": path, "what": what})
    return out
