"""What systemd says about cgroups: whether a unit's cgroup was delegated,
and where a user's manager lives.

systemd owns the cgroup tree where it is the init system, and asks programs
to create cgroups only inside units started with ``Delegate=yes`` (a
desktop user's ``user@UID.service`` is one; a terminal's scope usually is
not). ``cgroupfs.base_dir`` asks :func:`delegation` before it offers a
cgroup to a job; ``tether doctor`` uses :func:`user_manager_dir` to say how
to get a delegated one. Loaded only where systemd runs (``/run/systemd/system``
exists): the wrapper's hot path elsewhere never compiles it.
"""

import os

from .cgroupfs import mount

__all__ = ["systemd_unit", "user_manager_dir", "delegation"]


# -- systemd's rule: only a delegated unit's cgroup is ours to divide --------------

def systemd_unit(path: str, where: str | None = None) -> tuple[str, str] | None:
    """``(unit name, its cgroup directory)``: the innermost ``.service`` or
    ``.scope`` at or above cgroup directory ``path``; None if there is none."""
    where = (where or mount() or "").rstrip("/")
    p = path.rstrip("/")
    while len(p) > len(where):
        name = os.path.basename(p)
        if name.endswith((".service", ".scope")):
            return name, p
        p = os.path.dirname(p)
    return None


def user_manager_dir(uid: int, where: str | None = None) -> str | None:
    """The cgroup of ``user@UID.service`` (systemd's per-user manager, which
    systemd delegates to the user), if it exists."""
    where = where or mount()
    if where is None:
        return None
    d = os.path.join(where, "user.slice", f"user-{int(uid)}.slice", f"user@{int(uid)}.service")
    return d if os.path.isdir(d) else None


def delegation(path: str, where: str | None = None, *,
               systemctl: str = "systemctl") -> tuple[bool, str]:
    """Whether systemd delegated cgroup directory ``path`` - whether a program
    may create cgroups below it (systemd asks programs to leave the cgroups of
    units not started with ``Delegate=yes`` alone). ``(True, how it is known)``
    or ``(False, why not)``; fails closed: what cannot be known is a no.

    Asked in this order, cheapest first: the delegation mark systemd puts on
    a delegated unit's cgroup (``trusted.delegate``/``user.delegate`` = 1); no
    mark on a cgroup that carries systemd's other marks (``invocation_id``) is
    a no; a cgroup a non-root user owns outside a user manager's subtree (what
    systemd hands a ``Delegate=yes`` unit with ``User=``, or an administrator
    a delegated subtree) is a yes; else the unit's ``Delegate`` property,
    from ``systemctl show`` (bounded to 2 s), asked once per unit and kept
    on its cgroup (:data:`DELEGATION_MEMO`).
    """
    unit = systemd_unit(path, where)
    if unit is None:
        return False, (f"systemd manages this cgroup tree, and {path} is in no unit of it: "
                       "not delegated")
    name, udir = unit
    ok, why, for_uid = _decide(name, udir, systemctl)
    if ok is not None:  # a definite answer: the native front ends read it from now on
        _remember(udir, ("yes" if ok else "no") + (f":{for_uid}" if for_uid is not None else ""))
    return bool(ok), why


def _decide(name: str, udir: str, systemctl: str) -> tuple[bool | None, str, int | None]:
    """(delegated, why, the uid the answer holds for or None for every uid);
    delegated None: not known (a no, never remembered)."""
    marks = {}
    for attr in ("trusted.delegate", "user.delegate", "trusted.invocation_id",
                 "user.invocation_id"):
        try:
            marks[attr] = os.getxattr(udir, attr).strip()
        except OSError:  # absent, unreadable (trusted.* needs root) or unsupported
            continue
    if marks.get("trusted.delegate") == b"1" or marks.get("user.delegate") == b"1":
        return True, f"{name} is delegated (Delegate=yes)", None
    not_delegated = (f"{name} was not started with Delegate=yes: systemd asks programs not "
                     f"to create cgroups inside it")
    if marks:
        return False, not_delegated, None
    euid = os.geteuid()
    managers = [c for c in udir.split("/")[:-1] if c.startswith("user@") and c.endswith(".service")]
    try:
        owner = os.stat(udir).st_uid
    except OSError as exc:
        return None, f"cannot stat {udir}: {exc.strerror}", None
    if euid != 0 and owner == euid and not managers:
        return True, f"{name}'s cgroup is owned by uid {euid} (delegated to it)", euid
    user = bool(managers) or name.startswith("user@")
    if user and name != f"user@{euid}.service" and managers and managers[-1] != f"user@{euid}.service":
        return False, f"{name} belongs to another user's manager ({managers[-1]})", euid
    memo = _remembered(udir)
    prop = memo or _unit_delegate(systemctl, name, user and not name.startswith("user@"))
    said = "remembered from systemctl" if memo else "systemctl"
    if prop == "yes":
        return True, f"{name} is delegated ({said}: Delegate=yes)", None
    if prop == "no":
        return False, not_delegated, None
    return None, (f"cannot tell whether {name} is delegated ({prop}): "
                  "not using it (fail closed)"), None


#: The answer of delegation() for a unit, kept on the unit's own cgroup:
#: ``yes`` / ``no``, or ``yes:UID`` / ``no:UID`` where it holds for that user
#: only. The native tether-shell and tether run only read it (they hand a
#: start with no answer for them to the Python front end, which decides here
#: and writes it), so the rules exist once and systemctl is asked once per
#: unit, not on every start. It lives as long as the unit: a new unit of the
#: same name is a new directory, and is decided again. Only who may write the
#: unit's cgroup (its owner) can set it, and the answer is about systemd's
#: wishes for that owner's own cgroup, not about anyone else's processes.
from ._constants import DELEGATION_MEMO  # noqa: E402 - shared with the native front ends


def _remembered(udir: str) -> str | None:
    """systemctl's answer kept for the unit (an answer for every uid)."""
    val = _memo(udir)
    return val if val in ("yes", "no") else None


def _memo(udir: str) -> str | None:
    try:
        return os.getxattr(udir, DELEGATION_MEMO).strip().decode("ascii", "replace")
    except OSError:
        return None


def _remember(udir: str, answer: str) -> None:
    if _memo(udir) == answer:
        return
    try:
        os.setxattr(udir, DELEGATION_MEMO, answer.encode())
    except OSError:  # not ours to mark, or no user xattrs here: asked again next time
        pass


def _unit_delegate(systemctl: str, unit: str, user: bool) -> str:
    """``yes``/``no``: the unit's ``Delegate`` property; else why it is unknown."""
    import subprocess  # only here: the wrapper's hot path does not get this far

    cmd = [systemctl, *(["--user"] if user else []), "show", "--property=Delegate", "--value",
           "--", unit]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=2,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(cmd[:2])}: {exc}"
    out = r.stdout.strip()
    if r.returncode == 0 and out in ("yes", "no"):
        return out
    err = (r.stderr.strip().splitlines() or [out or f"exit status {r.returncode}"])[0]
    return f"{' '.join(cmd[:-3])} failed: {err}"
