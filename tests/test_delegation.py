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
        os.rmdir(sim["svc"])  # the next answer is for a new unit (an answer is kept per unit)
        os.mkdir(sim["svc"])
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
from tether.keeper import native
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
    env = dict(os.environ, CG=sim["owned"], PY=py, CODE=PIN, PYTHONPATH=SRC)
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


# -- asked once per unit: systemctl's answer kept on the unit's cgroup (issue 32) -------

def _counting_systemctl(tmp_path, answer: str):
    """A systemctl that answers ``answer`` and counts its calls in a file
    (stands in for systemd's own answer: systemd does not run here)."""
    calls = tmp_path / f"calls-{answer}"
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\necho {answer}\n")
    fake.chmod(0o755)
    return fake, calls


def _ncalls(calls) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_systemctl_is_asked_once_per_unit_and_again_for_a_new_unit(sim, tmp_path):
    from tether.systemd import DELEGATION_MEMO

    fake, calls = _counting_systemctl(tmp_path, "yes")
    for _ in range(3):
        ok, why = delegation(sim["svc"], systemctl=str(fake))
        assert ok, why
    assert _ncalls(calls) == 1 and "remembered" in why
    assert os.getxattr(sim["svc"], DELEGATION_MEMO) == b"yes"
    # A new unit of the same name is a new directory: asked again.
    os.rmdir(sim["svc"])
    os.mkdir(sim["svc"])
    assert delegation(sim["svc"], systemctl=str(fake))[0] and _ncalls(calls) == 2
    # An answer that is no answer is not remembered: asked every time (fail closed).
    os.removexattr(sim["svc"], DELEGATION_MEMO)
    (tmp_path / "v").mkdir()
    vague, vcalls = _counting_systemctl(tmp_path / "v", "maybe")
    for _ in range(2):
        assert not delegation(sim["svc"], systemctl=str(vague))[0]
    assert _ncalls(vcalls) == 2
    with pytest.raises(OSError):
        os.getxattr(sim["svc"], DELEGATION_MEMO)


def _native_shell_in(cgroup: str, tmp_path, answer: str) -> tuple[dict, int]:
    """Run the native ``tether-shell -c`` in ``cgroup`` under the simulated
    systemd, systemctl answering ``answer``: which program kept the job (its
    keeper's exe), whose cgroup the command ran in, and how often systemctl ran."""
    from procutil import native_shell

    shell = native_shell()
    if shell is None:
        pytest.skip("the native tether-shell is not built here")
    fake, calls = _counting_systemctl(tmp_path, answer)
    script = 'readlink /proc/$PPID/exe; sed -n "s/^0:://p" /proc/self/cgroup'
    code = (f"import os, subprocess, sys; r = subprocess.run([{shell!r}, '-c', {script!r}], "
            "capture_output=True, text=True, timeout=30); sys.stdout.write(r.stdout); "
            "sys.exit(r.returncode)")
    env_path = f"{fake.parent}:{os.environ.get('PATH', '')}"
    old = os.environ.get("PATH")
    os.environ["PATH"] = env_path
    try:
        r = _under_systemd(cgroup, code)
    finally:
        os.environ["PATH"] = old or ""
    assert r.returncode == 0, r.stderr
    keeper, where = r.stdout.split()
    return {"native": keeper == os.path.realpath(shell), "cgroup": where}, _ncalls(calls)


@pytest.mark.parametrize("unit,answer,delegated", [
    ("deleg", "no", True),   # marked Delegate=yes: systemctl's word is never needed
    ("plain", "yes", False),  # marked, not delegated: the same
    ("svc", "yes", True),    # no marks: asked once, then remembered
    ("svc", "no", False),
])
def test_the_native_tether_shell_decides_delegation_without_an_interpreter(
        sim, tmp_path, unit, answer, delegated):
    """On systemd the native front end handed every start in a writable
    cgroup to the Python one, which ran systemctl each time (36-45 ms a start
    under a real systemd 252). Now the first start in a unit is the Python
    one's, which decides (systemctl only for an unmarked unit) and leaves the
    answer on the unit's cgroup; every later start reads it natively. The
    control is that first start: served by the Python one (the check can
    see it)."""
    from tether.systemd import DELEGATION_MEMO

    runs = [_native_shell_in(sim[unit], tmp_path, answer) for _ in range(3)]
    asked = runs[-1][1]
    for res, _ in runs:
        under_job = res["cgroup"].startswith(sim[unit][len(cgroupfs.mount() or ""):] + "/tether-")
        assert under_job is delegated, res
    assert asked == (1 if unit == "svc" else 0)
    assert not runs[0][0]["native"] and runs[1][0]["native"] and runs[2][0]["native"], runs
    assert os.getxattr(sim[unit], DELEGATION_MEMO) == (b"yes" if delegated else b"no")


def test_an_answer_for_one_user_is_not_read_for_another(sim, tmp_path):
    """An answer that holds for one uid only (a cgroup its owner was given
    outside a user manager) is kept as such: the native front end of another
    user (here root) does not take it, and hands the start over."""
    from tether.systemd import DELEGATION_MEMO

    os.setxattr(sim["svc"], DELEGATION_MEMO, f"yes:{NOBODY}".encode())
    res, asked = _native_shell_in(sim["svc"], tmp_path, "no")
    assert not res["native"] and asked == 1  # root's own answer: systemctl's "no"
    assert os.getxattr(sim["svc"], DELEGATION_MEMO) == b"no"
    # Control: an answer for root is read natively.
    os.setxattr(sim["svc"], DELEGATION_MEMO, b"yes:0")
    res, asked = _native_shell_in(sim["svc"], tmp_path, "no")
    assert res["native"] and asked == 1, res  # (the shim's count from before)
