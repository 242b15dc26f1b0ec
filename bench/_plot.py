"""Figures for docs/benchmarks.md, drawn from bench/results/*.json (matplotlib, PNG).

Each function reads one or two result files and writes one PNG; a missing or
older-format result file skips that figure with a message instead of failing
the whole set. Used by ``bench/run_all.py``; runnable alone:

    python3 bench/_plot.py [--results bench/results] [--out docs/figures]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
FIGURES = os.path.join(os.path.dirname(HERE), "docs", "figures")

TETHER_COLOR = "#1b7837"
ALT_COLOR = "#5e3c99"
LEAK_COLOR = "#d6604d"
BASE_COLOR = "#878787"


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # no display here, PNG only
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt


def _horizontal() -> dict[str, Any]:
    """boxplot's keyword for a horizontal box: ``vert`` was renamed in matplotlib 3.10."""
    import matplotlib

    major, minor = (int(x) for x in matplotlib.__version__.split(".")[:2])
    return {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}


def _load(results: str, name: str) -> dict[str, Any] | None:
    path = os.path.join(results, f"{name}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None



def _save(plt, fig, out: str, name: str) -> str:
    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path)
    plt.close(fig)
    return path


def _plain_log(axis: Any) -> None:
    """Log axis with plain numbers (10, 20, 50) instead of 2x10^1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _load_note(d: dict[str, Any]) -> str:
    la = d.get("load_avg_start") or d.get("load_avg") or (d.get("machine") or {}).get("loadavg")
    cpus = (d.get("machine") or {}).get("cpus") or os.cpu_count()
    at_end = (d.get("machine") or {}).get("loadavg_at_end")
    if not la and at_end:
        return f"load average {at_end[0]:.1f} at the end, on {cpus} CPUs"
    end = d.get("load_avg_end") or (d.get("machine") or {}).get("loadavg_after")
    if la and end:
        return f"load average {la[0]:.1f} → {end[0]:.1f} on {cpus} CPUs"
    if la:
        return f"load average {la[0]:.1f} on {cpus} CPUs"
    return ""


def kill_alternatives(results: str, out: str) -> str | None:
    """Owner SIGKILLed -> last member dead, per alternative (compare.json)."""
    d = _load(results, "compare")
    if not d or "alternatives" not in d:
        return None
    plt = _plt()
    rows = [r for r in d["alternatives"]]
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.4))
    labels = []
    finite = [x for r in rows if r.get("available") for x in
              ((r.get("owner_sigkill") or {}).get("last_death_ms") or {}).get("all", [])]
    xmax = max(finite) * 3 if finite else 1000
    xmin = max(min(finite) / 2, 0.1) if finite else 1
    for y, r in enumerate(reversed(rows)):
        labels.append(r["name"])
        if not r.get("available"):
            ax.text(xmin, y, "  cannot run here: " + r.get("reason", "")[len("cannot run here: "):][:70],
                    va="center", fontsize=7, color=BASE_COLOR)
            continue
        k = r.get("owner_sigkill") or {}
        ld = k.get("last_death_ms") or {}
        color = TETHER_COLOR if r.get("tether") else ALT_COLOR
        if k.get("trials_with_survivors"):
            order = ("child", "bg", "daemon", "nohup", "ignorer", "hopper", "sleeps")
            sr = k.get("survived_roles", {})
            roles = "everything" if set(sr) >= set(order) else ", ".join(
                r for r in order if r in sr)
            ax.barh(y, xmax - xmin, left=xmin, height=0.5, color=LEAK_COLOR, alpha=0.25)
            ax.text(xmin, y, f"  {k['survivors_max']} survive ({k['trials_with_survivors']}/"
                             f"{k['trials']} trials): {roles}"[:95], va="center", fontsize=7,
                    color=LEAK_COLOR)
            continue
        xs = ld.get("all", [])
        if xs:
            ax.boxplot([xs], positions=[y], widths=0.5, showfliers=False, **_horizontal(),
                       medianprops={"color": color}, boxprops={"color": color},
                       whiskerprops={"color": color}, capprops={"color": color})
            ax.scatter(xs, [y] * len(xs), s=7, color=color, alpha=0.6, zorder=3)
            ax.text(xmax, y, f"p50 {ld['p50']:.0f} / p99 {ld['p99']:.0f} ms", va="center",
                    ha="right", fontsize=7)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xscale("log")
    _plain_log(ax.xaxis)
    ax.set_xlim(xmin, xmax)
    ax.set_xlabel("owner SIGKILLed → last process of the tree gone (ms, log scale); "
                  "red: processes still alive after "
                  f"{d['params']['deadline_s']:g} s")
    ax.set_title(f"Same adversarial tree ({d['params']['sleeps'] + 6} processes) under each "
                 f"alternative — {_load_note(d)}", fontsize=9)
    return _save(plt, fig, out, "kill_alternatives.png")


def kill_mechanisms(results: str, out: str) -> str | None:
    """Kill latency per mechanism and tree size, beside unshare (kill_latency.json)."""
    d = _load(results, "kill_latency")
    if not d or "results" not in d:
        return None
    plt = _plt()
    sizes = [s for s in (str(x) for x in d.get("sizes", [])) if s in d["results"]]
    kinds: list[str] = []  # the same columns in every panel
    for s in sizes:
        for k in d["results"][s]:
            if k not in kinds:
                kinds.append(k)
    if not sizes or not kinds:
        return None
    fig, axes = plt.subplots(1, len(sizes), figsize=(2.6 * len(sizes) + 1.5, 3.8), squeeze=False)
    axes = list(axes[0])
    for ax, s in zip(axes, sizes, strict=True):
        data, leaks = [], []
        for x, k in enumerate(kinds, start=1):
            row = d["results"][s].get(k) or {}
            if row.get("all_ms"):
                data.append((x, row["all_ms"], BASE_COLOR if k.startswith("unshare") else TETHER_COLOR))
            elif row.get("survivors_total"):
                leaks.append((x, row["survivors_total"], row.get("trials")))
        if data:
            bp = ax.boxplot([v for _, v, _ in data], positions=[x for x, _, _ in data],
                            showfliers=True, widths=0.6, flierprops={"markersize": 2})
            for i, (_, _, c) in enumerate(data):
                for part in ("boxes", "medians"):
                    bp[part][i].set_color(c)
        ax.set_yscale("log")
        _plain_log(ax.yaxis)
        lo, hi = ax.get_ylim()
        for x, n, t in leaks:
            ax.text(x, (lo * hi) ** 0.5, f"{n} survivors\nin {t} trials", rotation=90,
                    ha="center", va="center", fontsize=7, color=LEAK_COLOR)
        ax.set_xticks(range(1, len(kinds) + 1), kinds, rotation=45, ha="right")
        ax.set_xlim(0.4, len(kinds) + 0.6)
        ax.set_title(f"{s} process{'es' if s != '1' else ''}")
    axes[0].set_ylabel("owner SIGKILL → last member gone (ms)")
    fig.suptitle("Kill latency per mechanism and tree size (bench/kill_latency.py); grey: the "
                 "kernel's own PID-namespace teardown\n(unshare --pid --fork --kill-child, SIGKILLed "
                 f"itself) — {_load_note(d)}", fontsize=9)
    return _save(plt, fig, out, "kill_mechanisms.png")


def spawn_overhead(results: str, out: str) -> str | None:
    """Spawn+wait of /bin/true as a ratio to plain Popen (compare.json, spawn.json)."""
    cmp_ = _load(results, "compare")
    sp = _load(results, "spawn")
    panels = []
    if cmp_ and "alternatives" in cmp_:
        rows = [(r["name"], r["spawn"]["ratio"], r.get("tether")) for r in cmp_["alternatives"]
                if r.get("available") and "ratio" in (r.get("spawn") or {})]
        if rows:
            panels.append(("vs the alternatives (compare.py)", rows, _load_note(cmp_)))
    if sp and "mechanisms" in sp:
        rows = [(f"tether:{m}" if m != "auto" else f"tether:auto ({sp.get('auto')})", r["ratio"],
                 True) for m, r in sp["mechanisms"].items() if "ratio" in r]
        if rows:
            panels.append(("per mechanism (spawn.py)", rows, _load_note(sp)))
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    axes = list(axes[0])
    for ax, (title, rows, note) in zip(axes, panels, strict=True):
        names = [r[0] for r in rows]
        vals = [r[1] for r in rows]
        cols = [TETHER_COLOR if r[2] else ALT_COLOR for r in rows]
        ax.barh(range(len(rows))[::-1], vals, color=cols)
        ax.set_yticks(range(len(rows))[::-1], names)
        ax.axvline(1.0, color=BASE_COLOR, lw=1, ls="--")
        for i, v in zip(range(len(rows))[::-1], vals, strict=True):
            ax.text(v, i, f" {v:.2f}×", va="center", fontsize=7)
        ax.set_xlabel("median spawn+wait of /bin/true ÷ plain Popen, same run")
        ax.set_title(f"{title}\n{note}", fontsize=9)
        ax.set_xlim(0, max(vals) * 1.2)
    return _save(plt, fig, out, "spawn_overhead.png")


def capture_time(results: str, out: str) -> str | None:
    """Process-table capture time against process count (capture.json)."""
    d = _load(results, "capture")
    if not d or "levels" not in d:
        return None
    plt = _plt()
    lv = sorted(d["levels"], key=lambda x: x["processes"])
    xs = [x["processes"] for x in lv]
    has_cpu = all("cpu_median_ms" in x.get("tether", {}) for x in lv)
    panels = [("median_ms", "min_ms", "max_ms", "wall clock")]
    if has_cpu:
        panels.append(("cpu_median_ms", "cpu_min_ms", "cpu_median_ms", "CPU time of the reader"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 3.6), squeeze=False)
    axes = list(axes[0])
    for ax, (med, lo_k, hi_k, what) in zip(axes, panels, strict=True):
        for key, label, color, ls in (("tether", "tether identity.capture()", TETHER_COLOR, "-"),
                                      ("psutil", "psutil.process_iter()", ALT_COLOR, "-"),
                                      ("syscall_floor", "open/read/close of each stat file only",
                                       BASE_COLOR, ":")):
            ys = [x.get(key, {}).get(med) for x in lv]
            if any(y is None for y in ys):
                continue
            ax.plot(xs, ys, marker="o", color=color, ls=ls, label=f"{label}, median")
            lo = [x[key].get(lo_k, y) for x, y in zip(lv, ys, strict=True)]
            hi = [x[key].get(hi_k, y) for x, y in zip(lv, ys, strict=True)]
            ax.fill_between(xs, lo, hi, color=color, alpha=0.12)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log(ax.xaxis)
        _plain_log(ax.yaxis)
        ax.set_xlabel("processes on the machine")
        ax.set_ylabel(f"one full capture (ms, {what})")
        ax.legend(fontsize=7)
    fig.suptitle(f"Process-table capture — {_load_note(d)}", fontsize=9)
    return _save(plt, fig, out, "capture.png")


FIGURES_FNS: list[Callable[[str, str], str | None]] = [
    kill_alternatives, kill_mechanisms, spawn_overhead, capture_time,
]


def draw_all(results: str = RESULTS, out: str = FIGURES) -> list[str]:
    os.makedirs(out, exist_ok=True)
    made = []
    for fn in FIGURES_FNS:
        try:
            path = fn(results, out)
        except Exception as exc:  # noqa: BLE001 - one bad result file must not stop the others
            print(f"  figure {fn.__name__}: failed: {type(exc).__name__}: {exc}")
            continue
        if path:
            print(f"  figure {os.path.relpath(path)}")
            made.append(path)
        else:
            print(f"  figure {fn.__name__}: skipped (its results file is missing)")
    return made


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--out", default=FIGURES)
    a = ap.parse_args()
    draw_all(a.results, a.out)
