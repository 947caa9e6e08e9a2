"""Plots of the load path and the dry run, drawn from the newest CSVs the benchmarks wrote (no measurement here).

    python benchmarks/reports/plot_results.py [--results benchmarks/results]

Each plot is written beside the CSV it is drawn from (the same name, ``.png``) and titled with the
machine and date of its figures:

* ``default_path/<date>-<machine>.png``: GB/s of each load setting of ``default_path.py`` (every run a
  dot, the median a bar) against the pinned-copy and page-locking rates of the same run, with the goal
  lines (0.5 x pinned copy, 0.9 x page locking);
* ``staging_profile/<date>-<machine>.png``: ``probes/staging_profile.py``'s rates per stage (first and
  second batch, from locked pages, hashed and not, reading alone, the pinned copy);
* ``scaling/<date>-<machine>.png``: ``scaling.py``'s µs per decision of the dry run against K for both
  policies (and both toolkits of a ``--base`` run), with the 20 µs goal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

import _common  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

ORDER = [  # default_path.py's settings, top to bottom, and their bar colours
    ("default", "#4c72b0"),
    ("default, pinned slots", "#5f80ba"),
    ("default, host digest", "#6f8fc4"),
    ("default, sealed copy", "#8da0cb"),
    ("default, 4 MiB slots", "#9cadd6"),
    ("default, 8 MiB slots", "#a2b3da"),
    ("default, 64 MiB slots", "#a9b9dd"),
    ("integrity off", "#55a868"),
    ("integrity off, pipelined", "#99c794"),
    ("page locking", "#bbb"),
    ("pinned copy", "#888"),
]


def newest(results: Path, benchmark: str) -> Path:
    """The benchmark's newest CSV (``<YYYY-MM-DD>-<machine>[-<tag>].csv``: the date sorts first)."""
    found = sorted(p for p in (results / benchmark).glob("????-??-??-*.csv") if not p.stem.endswith("-methods"))
    if not found:
        raise SystemExit(f"no CSV under {results / benchmark}")
    return found[-1]


def _where(frame: pd.DataFrame) -> str:
    row = frame.iloc[0]
    return (
        f"{row.get('gpu', '')} host, {row.get('host_cpus', '?')} cores, torch {row.get('torch', '?')}, "
        f"{row['date_utc']} UTC"
    )


def _save(fig, ax, title: str, out: Path) -> Path:
    """Title, layout, write, close: the end of every plot here."""
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def _bars(ax, labels, fontsize: int = 10) -> None:
    """Horizontal bars read top-down in ``labels``' order."""
    ax.set_yticks(range(len(labels)), labels, fontsize=fontsize)
    ax.invert_yaxis()


def default_path(csv: Path) -> Path:
    f = pd.read_csv(csv)
    f = f[f["run"] >= 0]
    known = dict(ORDER)
    order = [(s, c) for s, c in ORDER if s in set(f["setting"])]
    order[-2:-2] = [(s, "#999") for s in dict.fromkeys(f["setting"]) if s not in known]  # a setting added later
    med = f.groupby("setting")["GBps"].median()
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(order) + 0.8))
    ax.barh(range(len(order)), [med[s] for s, _ in order], color=[c for _, c in order])
    for i, (s, _) in enumerate(order):
        ax.plot(f[f["setting"] == s]["GBps"], [i] * int((f["setting"] == s).sum()), "k.", ms=6)
        right = max(med[s], f[f["setting"] == s]["GBps"].max())  # beside the bar and its runs' dots
        ax.text(right + 0.8, i, f"{med[s]:.1f} GB/s", va="center", fontsize=8)
    ax.axvline(0.5 * med["pinned copy"], color="#c44e52", ls="--", lw=1)
    ax.text(0.5 * med["pinned copy"], 0.5, " goal: 0.5 x pinned copy", color="#c44e52", fontsize=8)
    ax.axvline(0.9 * med["page locking"], color="#dd8452", ls=":", lw=1)
    ax.text(0.9 * med["page locking"], len(order) - 2.5, " goal: 0.9 x page locking", color="#dd8452", fontsize=8)
    _bars(ax, [s for s, _ in order])
    ax.set_xlabel("GB/s (uploaded bytes / seconds of the whole load, fresh process; dots: runs, bars: medians)")
    uploaded = f[f["setting"] == "default"]["bytes"].iloc[0] / 1e9
    files = f["file_bytes"].iloc[0] / 1e9
    return _save(
        fig,
        ax,
        f"Default load path, {files:.1f} GB program, {uploaded:.2f} GB uploaded\n{_where(f)}",
        csv.with_suffix(".png"),
    )


def staging_profile(csv: Path) -> Path:
    f = pd.read_csv(csv)
    # rates of bytes moved: a first use's row (allocating tensors: no byte moves) would dwarf the scale
    f = f[f["GBps"].notna() & ~f["what"].str.contains("allocated")].copy()
    f["label"] = f.apply(
        lambda r: (
            r["what"].replace(", torch may hand back cached blocks", "")
            + (f" ({int(r['threads'])} thr, {int(r['chunk_mib'])} MiB)" if pd.notna(r.get("threads")) else "")
        ),
        axis=1,
    )
    blob = f["bytes"].max() / 1e9
    fig, ax = plt.subplots(figsize=(11, 0.3 * len(f) + 1.4))
    ax.barh(range(len(f)), f["GBps"], color="#4c72b0")
    _bars(ax, f["label"], fontsize=7)
    ax.set_xlabel("GB/s")
    return _save(
        fig,
        ax,
        f"Verified staging by stage (staging_profile.py, {blob:.2f} GB blob)\n{_where(f)}",
        csv.with_suffix(".png"),
    )


def dry_run(csv: Path) -> Path:
    f = pd.read_csv(csv)
    # run_analysis[...]: what scaling.py called the metric in the CSVs written before it was dry_run[...]
    f = f[f["metric"].str.match(r"(dry_run|run_analysis)\[[^\]]+\]$")]
    both = f["toolkit"].nunique() > 1
    fig, ax = plt.subplots(figsize=(7, 4))
    for (who, metric), g in f.groupby(["toolkit", "metric"]):
        g = g.sort_values("constants_per_method")
        policy = metric.split("[", 1)[1].rstrip("]")
        ax.plot(
            g["constants_per_method"],
            g["value"],
            "o-" if who == "this" else "o--",
            label=f"{policy} ({'this checkout' if who == 'this' else '--base'})" if both else policy,
        )
    ax.axhline(20, color="#c44e52", ls="--", lw=1, label="goal: 20 µs")
    ax.set_xscale("log")
    ax.set_xlabel(f"constants per method ({int(f['methods'].iloc[0])} methods)")
    ax.set_ylabel("µs per decision, every event recorded (CPU time)")
    row = f.iloc[0]
    ax.legend(fontsize=7)
    return _save(
        fig,
        ax,
        f"Dry run per decision (scaling.py)\n{row['cpu_model']}, {row['host_cpus']} cores, "
        f"Python {row['python']}, {row['date_utc']} UTC",
        csv.with_suffix(".png"),
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=_common.RESULTS)
    args = ap.parse_args(argv)
    for benchmark, draw in (("default_path", default_path), ("staging_profile", staging_profile), ("scaling", dry_run)):
        print(f"wrote {draw(newest(args.results, benchmark))}")


if __name__ == "__main__":
    main()
