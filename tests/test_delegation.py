"""systemd's delegation rule, on simulated systemd cgroup trees (systemd does
not run here): real cgroup v2 directories named as systemd names them,
marked (``user.delegate``, ``user.invocation_id`` xattrs) or chowned as
systemd marks and chowns them, and ``/run/systemd/system`` made in a private
mount namespace, so the real ``tether doctor`` and a real ``Job`` run under
the simulated systemd.

Controls: the same non-delegated scope without the systemd marker is used
(it is writable: the check is what refuses it), and each unknown answer
(systemctl missing, failing or saying nonsense) is a refusal (fail closed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from procutil import SRC, unprivileged_blocker

from tether import cgroupfs
from tether.systemd import delegation, systemd_unit, user_manager_dir

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroup v2 is Linux"),
    pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() != 0,
                       reason="building a simulated systemd cgroup tree needs root"),
]

NOBODY = 65534


@pytest.fixture
def sim():
    """<own cgroup>/sim-<id>/{user.slice/user-1001.slice/user@1001.service/app.slice/
    {deleg.scope,plain.scope}, system.slice/{svc.service,owned.service}}"""
    base = cgroupfs.own_dir()
    if base is None or not os.access(os.path.join(base, "cgroup.procs"), os.W_OK):
        pytest.skip("no writable cgroup v2 directory of our own here")
    root = os.path.join(base, f"sim-{uuid.uuid4().hex[:8]}")
    app = os.path.join(root, "user.slice", "user-1001.slice", "user@1001.service", "app.slice")
    d = {"root": root, "manager": os.path.dirname(app),
         "deleg": os.path.join(app, "deleg.scope"), "plain": os.path.join(app, "plain.scope"),
         "svc": os.path.join(root, "system.slice", "svc.service"),
         "owned": os.path.join(root, "system.slice", "owned.service")}
    for k in ("deleg", "plain", "svc", "owned"):
        os.makedirs(d[k])
    try:
        os.setxattr(d["deleg"], "user.delegate", b"1")
        for k in ("manager", "deleg", "plain"):
            os.setxattr(d[k], "user.invocation_id", uuid.uuid4().hex.encode())
    except OSError as exc:
        cgroupfs.remove_tree(root)
        pytest.skip(f"this kernel's cgroupfs takes no user xattrs ({exc.strerror})")
    for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
        os.chown(os.path.join(d["owned"], name), NOBODY, -1)
    yield d
    assert cgroupfs.remove_tree(root), f"simulated tree left behind: {root}"


def test_unit_of_a_cgroup_is_the_innermost_service_or_scope(sim):
    assert systemd_unit(sim["deleg"]) == ("deleg.scope", sim["deleg"])
    inner = os.path.join(sim["deleg"], "tether-1-2", "j1-1")
    assert systemd_unit(inner) == ("deleg.scope", sim["deleg"])
    assert systemd_unit(os.path.join(sim["root"], "user.slice")) is None


def test_marked_unit_is_delegated_and_its_subgroups_too(sim):
    assert delegation(sim["deleg"]) == (True, "deleg.scope is delegated (Delegate=yes)")
    sub = os.path.join(sim["deleg"], "worker")
    os.mkdir(sub)
    try:
        assert delegation(sub)[0] is True
    finally:
        os.rmdir(sub)


def test_unit_systemd_marked_but_not_as_delegated_is_refused(sim):
    ok, why = delegation(sim["plain"])
    assert not ok and "plain.scope was not started with Delegate=yes" in why


def test_cgroup_in_no_unit_is_refused(sim):
    ok, why = delegation(os.path.join(sim["root"], "system.slice"))
    assert not ok and "in no unit" in why


def test_unit_property_is_asked_and_every_unknown_answer_refuses(sim, tmp_path):
    # No mark at all (older systemd): the unit's Delegate property decides.
    # Here systemd does not run, so the real systemctl cannot answer: refused.
    ok, why = delegation(sim["svc"])
    assert not ok and "cannot tell whether svc.service is delegated" in why and "fail closed" in why
    ok, why = delegation(sim["svc"], systemctl=str(tmp_path / "no-such-systemctl"))
    assert not ok and "fail closed" in why
    answers = {"yes": True, "no": False, "maybe": False}
    for answer, want in answers.items():
        fake = tmp_path / f"systemctl-{answer}"  # stands in for systemd's own answer
        fake.write_text(f"#!/bin/sh\n[ \"$*\" = 'show --property=Delegate --value -- svc.service' ]"
                        f" || exit 9\necho {answer}\n")
        fake.chmod(0o755)
        ok, why = delegation(sim["svc"], systemctl=str(fake))
        assert ok is want, (answer, why)
    failing = tmp_path / "systemctl-fails"
    failing.write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
    failing.chmod(0o755)
    ok, why = delegation(sim["svc"], systemctl=str(failing))
    assert not ok and "Failed to connect to bus" in why


def _as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    # The system Python: an interpreter under root's home is not nobody's to run.
    py = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    why = unprivileged_blocker(py, NOBODY)
    if why:
        pytest.skip(why)
    return subprocess.run(["runuser", "-u", "nobody", "--", py, "-c", code],
                          env=dict(os.environ, PYTHONPATH=SRC), capture_output=True, text=True,
                          timeout=60)


def test_ownership_outside_a_user_manager_means_delegated(sim):
    code = ("import sys; from tether.systemd import delegation; "
            f"print(delegation({sim['owned']!r})); print(delegation({sim['svc']!r})[0])")
    r = _as_nobody(code)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == f"(True, \"owned.service's cgroup is owned by uid {NOBODY} (delegated to it)\")"
    assert second == "False"  # the control: root's service is not nobody's


def test_user_manager_dir(sim):
    where = os.path.join(sim["root"])
    assert user_manager_dir(1001, where) == sim["manager"]
    assert user_manager_dir(1002, where) is None


# -- end to end: tether doctor and a Job under a simulated systemd ------------------

def _under_systemd(cgroup: str, code: str, systemd: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` in cgroup ``cgroup`` - in a private mount namespace
    with ``/run/systemd/system``, as where systemd is the init system."""
    marker = "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && " if systemd else ""
    script = (f'echo $$ > "$CG/cgroup.procs" && exec unshare -m sh -c '
              f'\'{marker}exec "$PY" -c "$CODE"\'')
    env = dict(os.environ, CG=cgroup, PY=sys.executable, CODE=code, PYTHONPATH=SRC)
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)


DOCTOR = "import json; from tether.doctor import report; print(json.dumps(report()))"

JOB = r'''
import json, os, subprocess
from tether import Job, identity
with Job(mechanism="cgroup") as job:
    p = job.popen(["sh", "-c", "sleep 300 & setsid sleep 300 & exec sleep 300"])
    import time
    while len(job.members()) < 3:
        time.sleep(0.01)
    members = job.members()
    path = job.trace()["cgroup_path"]
print(json.dumps({"path": path, "alive": [identity.is_alive(m) for m in members],
                  "dir_left": os.path.exists(path)}))
'''


def test_doctor_and_job_in_a_delegated_scope(sim):
    r = _under_systemd(sim["deleg"], DOCTOR)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    cg = next(m for m in data["mechanisms"] if m["mechanism"] == "cgroup")
    assert cg["available"], cg
    assert cg["detail"]["base"] == sim["deleg"]
    assert data["auto"] == "cgroup" and data["cgroup_fix"] == []
    r = _under_systemd(sim["deleg"], JOB)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["path"].startswith(sim["deleg"] + "/tether-")
    assert res["alive"] == [False, False, False] and not res["dir_left"]


PIN = r'''
import json, os, subprocess, time
from tether import Job, cgroupfs
from tether.platform import native
with Job(mechanism="cgroup") as job:
    path = job.trace()["cgroup_path"]
    job.run(["true"])
    pin_dir = os.path.join(path, cgroupfs.PIN_DIR)
    deadline = time.monotonic() + 5
    while not (os.path.isdir(pin_dir) and cgroupfs.procs_here(pin_dir)) and time.monotonic() < deadline:
        time.sleep(0.01)
    def move(to):
        return job.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs"', to],
                       stderr=subprocess.DEVNULL).returncode
    hide = move(pin_dir)
    os.mkdir(os.path.join(path, "mine"))
    other = move(os.path.join(path, "mine"))  # the control: a cgroup of the user's own
    pins = cgroupfs.procs_here(pin_dir)
print(json.dumps({"native": native.built(), "uid": os.getuid(), "pins": len(pins), "hide": hide,
                  "other": other, "left": os.path.exists(path)}))
'''


def test_a_member_cannot_hide_in_its_jobs_pin(sim):
    """As a user in a cgroup delegated to it (owned.service, owned by nobody):
    a member cannot move itself into its job's pin cgroup (read-only
    cgroup.procs); the control, a cgroup of its own in the job, it can."""
    py = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    why = unprivileged_blocker(py, NOBODY)
    if why:
        pytest.skip(why)
    os.chmod(sim["owned"], 0o755)
    script = ('echo $$ > "$CG/cgroup.procs" && exec setpriv --reuid=65534 --regid=65534 '
              '--clear-groups "$PY" -c "$CODE"')
    env = dict(os.environ, CG=sim["owned"], PY=py, CODE=PIN, PYTHONPATH=SRC, TETHER_NATIVE="1")
    r = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    if not res["native"]:
        pytest.skip("the native keeper is not built: no pin")
    assert res["uid"] == NOBODY and res["pins"] == 1, res
    assert res["hide"] != 0 and res["other"] == 0, res
    assert not res["left"], res


def test_doctor_in_a_scope_not_delegated_says_how_to_get_one(sim):
    r = _under_systemd(sim["plain"], DOCTOR)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    cg = next(m for m in data["mechanisms"] if m["mechanism"] == "cgroup")
    assert not cg["available"]
    assert "plain.scope was not started with Delegate=yes" in cg["reason"]
    assert data["auto"] == "subreaper"
    assert "  systemd-run --scope -p Delegate=yes -- CMD [ARG...]" in data["cgroup_fix"]
    r = _under_systemd(sim["plain"], "from tether import Job\nJob(mechanism='cgroup')")
    assert r.returncode != 0 and "JobRefused" in r.stderr and "Delegate=yes" in r.stderr
    text = _under_systemd(sim["plain"], "from tether.doctor import doctor; doctor()")
    assert "To get a cgroup here (uid 0):" in text.stdout, text.stdout + text.stderr
    # Control: the same scope where systemd does not run is writable, and used.
    r = _under_systemd(sim["plain"], DOCTOR, systemd=False)
    cg = next(m for m in json.loads(r.stdout)["mechanisms"] if m["mechanism"] == "cgroup")
    assert cg["available"] and cg["detail"]["base"] == sim["plain"]


def test_doctor_fix_for_an_unprivileged_user_names_its_manager():
    code = "import json; from tether.doctor import cgroup_fix; print(json.dumps(cgroup_fix('subreaper')))"
    r = _as_nobody(code)
    lines = json.loads(r.stdout)
    assert f"uid {NOBODY}" in lines[0] or "systemd" in lines[0], lines
    assert lines[-1] == "until then jobs use subreaper (tether doctor lists what it does not cover)"
