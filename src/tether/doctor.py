"""`tether doctor`: which mechanisms protect jobs here, and what each does not cover.

The JSON output (``--json``) is stable; fields are only ever added:

    {"schema": 1, "platform": str, "kernel": str, "python": str, "uid": int,
     "auto": name|null, "auto_reason": str, "strict": name|null, "strict_reason": str,
     "mechanisms": [{"mechanism", "available", "reason", "detail", "guarantee": {...}}],
     "cgroup_fix": [str, ...]}   # Linux without cgroup: how to get one here ([] otherwise)
"""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

SCHEMA = 1


def describe(name: str):
    """The Guarantee a job of mechanism ``name`` would have (no job is opened):
    the mechanism module's own text, from the one table."""
    from .platform import guarantee

    return guarantee(name)


def _kernel() -> str:
    if sys.platform == "win32":
        # platform.release() goes through WMI, which crashes under Wine 8.
        v = sys.getwindowsversion()
        return f"Windows {v.major}.{v.minor}.{v.build}"
    return platform.release()


def report() -> dict[str, Any]:
    from .errors import JobRefused
    from .platform import choose, probe_all

    out: dict[str, Any] = {
        "schema": SCHEMA,
        "platform": sys.platform,
        "kernel": _kernel(),
        "python": platform.python_version(),
        "uid": os.geteuid() if hasattr(os, "geteuid") else None,
        "mechanisms": [],
    }
    for key, mech in (("auto", "auto"), ("strict", "strict")):
        try:
            out[key] = choose(mech)
            out[f"{key}_reason"] = ""
        except JobRefused as exc:
            out[key] = None
            out[f"{key}_reason"] = str(exc)
    for av in probe_all():
        d = av.to_dict()
        try:
            d["guarantee"] = describe(av.mechanism).to_dict()
        except (ImportError, OSError, ValueError) as exc:  # a module that cannot load here
            d["guarantee"] = {"error": str(exc)}
        out["mechanisms"].append(d)
    if os.name == "posix":
        from .keeper import native

        on, why = native.status()
        out["keeper"] = {"native": on, "what": why, "mechanisms": list(native.MECHANISMS),
                         # (per job, Job.trace()["owner_watch"] says what it got)
                         "owner_watch": ("its pidfd, and sooner the owner's beacon (a robust "
                                         "mutex the owner's main thread holds: told at the "
                                         "start of its exit, not at the end)") if on
                         else "its pidfd"}
        if sys.platform.startswith("linux"):
            out["commands"] = native.front_ends()
    cg = next((m for m in out["mechanisms"] if m["mechanism"] == "cgroup"), None)
    out["cgroup_fix"] = cgroup_fix(out["auto"]) if (
        sys.platform.startswith("linux") and cg is not None and not cg["available"]) else []
    return out


def cgroup_fix(auto: str | None) -> list[str]:
    """How to get a writable, delegated cgroup on this machine, in steps."""
    from . import cgroupfs

    uid = os.getuid()
    try:
        import pwd

        user = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        user = str(uid)
    lines: list[str] = []
    where = cgroupfs.mount()
    if where is None:
        lines.append("no cgroup v2 is mounted: mount -t cgroup2 none /sys/fs/cgroup (as root), "
                     "or boot with systemd.unified_cgroup_hierarchy=1")
    elif not os.path.isdir(cgroupfs.SYSTEMD_MARKER):
        lines.append(f"systemd is not running here ({cgroupfs.SYSTEMD_MARKER} is absent), so "
                     "nobody delegates cgroups: run as root, or have root delegate a directory "
                     f"to uid {uid}:")
        lines.append(f"  mkdir {where}/{user}; chown {uid} {where}/{user} {where}/{user}/cgroup.procs "
                     f"{where}/{user}/cgroup.subtree_control {where}/{user}/cgroup.threads")
        lines.append(f"  then, as root, move the shell that starts the program into it: "
                     f"echo <its pid> > {where}/{user}/cgroup.procs")
    else:
        from .systemd import user_manager_dir

        manager = user_manager_dir(uid, where)
        if uid == 0:
            lines.append("run the program in a scope of its own that systemd delegates:")
            lines.append("  systemd-run --scope -p Delegate=yes -- CMD [ARG...]")
        else:
            if manager:
                lines.append(f"user@{uid}.service (your systemd user manager) runs: {manager}")
            else:
                lines.append(f"user@{uid}.service does not exist: uid {uid} ({user}) has no systemd "
                             "user manager - log in through a login manager or ssh (pam_systemd), "
                             f"or let it run without a session: loginctl enable-linger {user}")
            lines.append("run the program in a scope of its own that your manager delegates:")
            lines.append("  systemd-run --user --scope -p Delegate=yes -- CMD [ARG...]")
    if auto:
        lines.append(f"until then jobs use {auto} (tether doctor lists what it does not cover)")
    return lines


def doctor(as_json: bool = False) -> int:
    data = report()
    if as_json:
        try:
            print(json.dumps(data, indent=2, sort_keys=True))
        except BrokenPipeError:  # `tether doctor --json | head`
            sys.stdout = None
        return 0
    w = sys.stdout.write
    w(f"tether doctor — {data['platform']} {data['kernel']}, Python {data['python']}, uid {data['uid']}\n\n")
    for m in data["mechanisms"]:
        mark = "yes" if m["available"] else "no "
        w(f"  [{mark}] {m['mechanism']:<10} {m['reason']}\n")
    if data["cgroup_fix"]:
        w("\n  To get a cgroup here (uid {}):\n".format(data["uid"]))
        for line in data["cgroup_fix"]:
            w(f"    {line}\n")
    if data.get("keeper"):
        k = data["keeper"]
        w(f"\n  keeper of {', '.join(k['mechanisms'])} jobs: {k['what']}\n")
        w(f"  an owner's death seen by: {k['owner_watch']}\n")
    for c in data.get("commands", []):
        w(f"  {c['name']}: {c['what']}\n")
    w("\n")
    for key, label in (("auto", "auto   (default, transparent)"), ("strict", "strict (kernel-enforced)")):
        if data[key]:
            w(f"  {label}: {data[key]}\n")
        else:
            w(f"  {label}: NOT AVAILABLE — {data[key + '_reason']}\n")
    w("\nWhat each available mechanism guarantees:\n")
    for m in data["mechanisms"]:
        if not m["available"]:
            continue
        g = m["guarantee"]
        if "error" in g:
            continue
        kind = "kernel-enforced" if g["kernel_enforced"] else "keeper-enforced"
        seen = "transparent" if g["transparent"] else "visible to the job"
        w(f"\n  {m['mechanism']}: {kind}, {seen}\n")
        w(f"    ends the job: {g['ends_job']}\n")
        for v in g["visible"]:
            w(f"    the job sees: {v}\n")
        for n in g["not_covered"]:
            w(f"    not covered: {n}\n")
    return 0
