"""Plots of issue 25's figures, drawn from the CSVs the benchmarks wrote (no measurement here).

    python benchmarks/plot_issue25.py [--results benchmarks/results/2026-12-02/issue25]

Writes, beside the CSVs, each titled with the machine and date of its figures:

* ``default_path_h200.png``: GB/s of each load setting of ``default_path.py`` (every run a dot, the
  median a bar) against the pinned-copy and page-locking rates of the same run, with the target lines
  (0.5 x pinned copy, 0.9 x page locking);
* ``staging_profile_h200.png``: ``staging_profile.py``'s rates per stage (first and second batch,
  hashed and not, reading alone, the pinned copy);
* ``dry_run_per_decision.png``: ``scaling.py --base``'s µs per decision against K for both toolkits
  and both policies, with the 20 µs target.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _common
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

DEFAULT = _common.RESULTS / "2026-12-02" / "issue25"


def _where(frame: pd.DataFrame) -> str:
    row = frame.iloc[0]
    return f"{row.get('gpu', '')} host, {row.get('host_cpus', '?')} cores, torch {row.get('torch', '?')}, {row['date_utc']} UTC"


def _save(fig, ax, title: str, out: Path) -> Path:
    """Title, layout, write, close: the end of every plot here."""
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _bars(ax, labels, fontsize: int = 10) -> None:
    """Horizontal bars read top-down in ``labels``' order."""
    ax.set_yticks(range(len(labels)), labels, fontsize=fontsize)
    ax.invert_yaxis()


def default_path(results: Path) -> Path:
    f = pd.read_csv(results / "default_path_h200_staging.csv")
    f = f[f["run"] >= 0]
    order = [
        "default",
        "default, sealed copy",
        "integrity off",
        "integrity off, pipelined",
        "page locking",
        "pinned copy",
    ]
    order = [s for s in order if s in set(f["setting"])]
    med = f.groupby("setting")["GBps"].median()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.barh(
        range(len(order)), [med[s] for s in order], color=["#4c72b0", "#8da0cb", "#55a868", "#99c794", "#bbb", "#888"]
    )
    for i, s in enumerate(order):
        ax.plot(f[f["setting"] == s]["GBps"], [i] * int((f["setting"] == s).sum()), "k.", ms=6)
        ax.text(med[s] + 0.6, i, f"{med[s]:.1f} GB/s", va="center", fontsize=8)
    ax.axvline(0.5 * med["pinned copy"], color="#c44e52", ls="--", lw=1)
    ax.text(0.5 * med["pinned copy"], 1.5, " target 1: 0.5 x pinned copy", color="#c44e52", fontsize=8)
    ax.axvline(0.9 * med["page locking"], color="#dd8452", ls=":", lw=1)
    ax.text(0.9 * med["page locking"], 3.5, " target 2: 0.9 x page locking", color="#dd8452", fontsize=8)
    _bars(ax, order)
    ax.set_xlabel("GB/s (uploaded bytes / seconds of the whole load, fresh process; dots: runs, bars: medians)")
    return _save(
        fig, ax, f"Default load path, 4.3 GB program, 2.44 GB uploaded\n{_where(f)}", results / "default_path_h200.png"
    )


def staging_profile(results: Path) -> Path:
    f = pd.read_csv(results / "staging_profile_h200.csv")
    f = f[f["GBps"].notna()].copy()
    f["label"] = f.apply(
        lambda r: (
            r["what"].replace(", torch may hand back cached blocks", "")
            + (f" ({int(r['threads'])} thr, {int(r['chunk_mib'])} MiB)" if pd.notna(r.get("threads")) else "")
        ),
        axis=1,
    )
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(f) + 1.2))
    ax.barh(range(len(f)), f["GBps"], color="#4c72b0")
    _bars(ax, f["label"], fontsize=7)
    ax.set_xlabel("GB/s")
    return _save(
        fig,
        ax,
        f"Verified staging by stage (staging_profile.py, 2.15 GB blob)\n{_where(f)}",
        results / "staging_profile_h200.png",
    )


def dry_run(results: Path) -> Path:
    f = pd.read_csv(results / "scaling_dryrun_ab.csv")
    f = f[f["metric"].str.match(r"run_analysis\[[^\]]+\]$")]
    fig, ax = plt.subplots(figsize=(7, 4))
    for (who, metric), g in f.groupby(["toolkit", "metric"]):
        g = g.sort_values("constants_per_method")
        ax.plot(
            g["constants_per_method"],
            g["value"],
            "o-" if who == "this" else "o--",
            label=f"{metric.removeprefix('run_analysis').strip('[]')} ({'this change' if who == 'this' else 'main 0552943'})",
        )
    ax.axhline(20, color="#c44e52", ls="--", lw=1, label="target: 20 µs")
    ax.set_xscale("log")
    ax.set_xlabel("constants per method (2 methods)")
    ax.set_ylabel("µs per decision, every event recorded (CPU time)")
    row = f.iloc[0]
    ax.legend(fontsize=7)
    return _save(
        fig,
        ax,
        f"Dry run per decision (scaling.py --base)\n{row['cpu_model']}, {row['host_cpus']} cores, "
        f"Python {row['python']}, {row['date_utc']} UTC",
        results / "dry_run_per_decision.png",
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=DEFAULT)
    args = ap.parse_args(argv)
    for draw in (default_path, staging_profile, dry_run):
        print(f"wrote {draw(args.results)}")


if __name__ == "__main__":
    main()
