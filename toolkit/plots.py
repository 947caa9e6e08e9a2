"""Plots of loads and policy comparisons (matplotlib, imported lazily).

Every function draws on the ``ax`` it is given (or on a fresh :class:`~matplotlib.figure.Figure`
it creates without touching pyplot's global state) and returns the Figure.  None of them
calls ``show()`` or saves a file, and none of them runs anything: whatever needs running
(``session.verify()``, :func:`toolkit.compare_policies`) is passed in.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import pandas as pd

from .rendering import DECISION_COLOURS
from .vocab import Decision

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .loader import Session
    from .model import Program

WRONG_COLOUR = "#cc0000"
_DECISION_ORDER = [d.value for d in Decision]
_DECISION_LETTER = {"loaded": "L", "shared": "S", "declined": "D", "private": "P", "refused": "R"}
# Saturated variants of the table colours, for lines and markers (the table ones are pastel backgrounds).
_STRONG = {"loaded": "#6aa84f", "shared": "#3d85c6", "declined": "#f1c232", "private": "#999999", "refused": "#cc0000"}


def _axes(ax: "Axes | None", figsize: tuple[float, float]) -> tuple["Figure", "Axes"]:
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def format_bytes(n: float) -> str:
    """``16384`` -> ``"16 KiB"``."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _wrong_from(verification: pd.DataFrame | None) -> set[str]:
    if verification is None or not len(verification):
        return set()
    v = verification
    return set(v[v["ran"].astype(bool) & ~v["ok"].astype(bool)]["method"])


# ------------------------------------------------------------------ collision matrix


def collision_matrix_data(decisions: pd.DataFrame, method_order: Sequence[str] | None = None) -> pd.DataFrame:
    """methods x constant keys (FQN, or internal name when there is none) -> decision, "" if absent.

    Columns are in order of first appearance, so the first method's constants come first.
    """
    if method_order is None:
        method_order = list(dict.fromkeys(decisions["method"])) if len(decisions) else []
    keys: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    for r in decisions.to_dict("records"):
        key = str(r["fqn"]) or str(r["name"])
        if key not in keys:
            keys.append(key)
        cells[(r["method"], key)] = str(getattr(r["decision"], "value", r["decision"]))
    data = [[cells.get((m, k), "") for k in keys] for m in method_order]
    return pd.DataFrame(data, index=pd.Index(list(method_order), name="method"), columns=pd.Index(keys, name="constant"))


def collision_matrix(session_or_decisions: "Session | pd.DataFrame", *, verification: pd.DataFrame | None = None,
                     wrong_methods: Iterable[str] = (), only_colliding: bool = False, ax: "Axes | None" = None,
                     title: str | None = None) -> "Figure":
    """Methods (rows, load order) x constant names (columns), each cell coloured by decision.

    Methods whose output was wrong (``verification`` rows that ran and failed, plus
    ``wrong_methods``) are labelled in red with a cross.  An empty cell: the method has no
    constant of that name (or its load never got there).  ``only_colliding`` keeps only the
    names that more than one method holds (the only ones sharing can touch).
    """
    from matplotlib.patches import Patch, Rectangle

    if isinstance(session_or_decisions, pd.DataFrame):
        decisions, order, default_title = session_or_decisions, None, "constant decisions"
    else:
        s = session_or_decisions
        decisions = s.decisions
        order = [m.name for m in s.program.methods]
        default_title = f"{s.program.name}: {s.policy.name.value}"
    wrong = _wrong_from(verification) | set(wrong_methods)
    grid = collision_matrix_data(decisions, order)
    if only_colliding:
        grid = grid.loc[:, (grid != "").sum(axis=0) > 1]
    n_rows, n_cols = grid.shape
    fig, ax = _axes(ax, (min(3.0 + 0.55 * max(n_cols, 1), 18.0), 1.6 + 0.45 * max(n_rows, 1)))
    label_cells = n_cols <= 16
    for i, m in enumerate(grid.index):
        for j, k in enumerate(grid.columns):
            d = grid.iat[i, j]
            face = DECISION_COLOURS.get(d, "white")
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=face, edgecolor="#888888", linewidth=0.6))
            if d and label_cells:
                ax.text(j + 0.5, i + 0.5, _DECISION_LETTER.get(d, d[:1].upper()), ha="center", va="center",
                        fontsize=9, color="#222222")
        if m in wrong:
            ax.add_patch(Rectangle((0, i), max(n_cols, 1), 1, fill=False, edgecolor=WRONG_COLOUR, linewidth=2.0))
    ax.set_xlim(0, max(n_cols, 1))
    ax.set_ylim(max(n_rows, 1), 0)
    ax.set_xticks([j + 0.5 for j in range(n_cols)])
    ax.set_xticklabels([_short(k) for k in grid.columns], rotation=45 if n_cols > 3 else 0,
                       ha="right" if n_cols > 3 else "center", fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(n_rows)])
    ax.set_yticklabels([f"\u2717 {m} (wrong)" if m in wrong else m for m in grid.index])
    for lbl, m in zip(ax.get_yticklabels(), grid.index):
        if m in wrong:
            lbl.set_color(WRONG_COLOUR)
            lbl.set_fontweight("bold")
    ax.tick_params(length=0)
    for sp in ax.spines.values():
        sp.set_visible(False)
    present = [d for d in _DECISION_ORDER if (grid == d).any().any()]
    handles = [Patch(facecolor=DECISION_COLOURS[d], edgecolor="#888888",
                     label=f"{_DECISION_LETTER[d]} {d}" if label_cells else d) for d in present]
    if wrong:
        handles.append(Patch(facecolor="white", edgecolor=WRONG_COLOUR, linewidth=2, label="wrong output"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_title(title if title is not None else default_title, fontsize=10)
    if not n_cols:
        ax.text(0.5, 0.5, "no constants decided", ha="center", va="center", transform=ax.transAxes)
    return fig


def _short(key: str, width: int = 36) -> str:
    return key if len(key) <= width else "\u2026" + key[-(width - 1):]


# ------------------------------------------------------------------ memory


def minimum_device_bytes(program: "Program") -> int:
    """Constant bytes a perfect loader needs: the memory floor M of :func:`toolkit.analysis.memory_floor`
    (each distinct content once per device, plus one copy per method of every mutated buffer)."""
    from .analysis import memory_floor

    return memory_floor(program).total_bytes


def _as_sessions(sessions: "Session | Mapping[str, Session] | Sequence[Session]") -> list["Session"]:
    if isinstance(sessions, Mapping):
        return list(sessions.values())
    if isinstance(sessions, (list, tuple)):
        return list(sessions)
    return [sessions]  # one Session


def memory_frame(sessions: "Session | Mapping[str, Session] | Sequence[Session]") -> pd.DataFrame:
    """One row per (policy, method): constant bytes that method's load put on its device."""
    from .tables import memory_by_policy_frame

    return memory_by_policy_frame(_as_sessions(sessions))


def memory_by_policy(sessions: "Session | Mapping[str, Session] | Sequence[Session] | pd.DataFrame", *,
                     ax: "Axes | None" = None, minimum: int | None = None, title: str | None = None) -> "Figure":
    """Stacked bars: constant bytes per method, one bar per policy, against the minimum a
    perfect loader would need (dashed line).

    ``sessions`` are loads of one program, or a :func:`memory_frame` of them (then pass
    ``minimum`` yourself; with sessions it defaults to :func:`minimum_device_bytes`).
    """
    sessions = getattr(sessions, "sessions", sessions)  # a PolicyComparison: its sessions
    if isinstance(sessions, pd.DataFrame):
        frame, program_name, floor = sessions, None, minimum
        status = {p: "loaded" if g["loaded"].all() else "failed" for p, g in frame.groupby("policy", sort=False)}
    else:
        ss = _as_sessions(sessions)
        if not ss:
            raise ValueError("memory_by_policy needs at least one session")
        frame, program_name = memory_frame(ss), ss[0].program.name
        floor = minimum if minimum is not None else minimum_device_bytes(ss[0].program)
        status = {s.policy.name.value: s.status for s in ss}
    labels = list(dict.fromkeys(frame["policy"]))
    methods = list(dict.fromkeys(frame["method"]))
    fig, ax = _axes(ax, (max(5.0, 1.1 * len(labels) + 3.0), 3.8))
    cmap = _method_colours(methods)
    bottoms = [0.0] * len(labels)
    for m in methods:
        vals = [float(frame[(frame["policy"] == p) & (frame["method"] == m)]["device_bytes"].sum()) for p in labels]
        ax.bar(range(len(labels)), vals, bottom=bottoms, color=cmap[m], edgecolor="white", label=m, width=0.65)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i, (p, total) in enumerate(zip(labels, bottoms)):
        st = status.get(p, "loaded")
        note = format_bytes(total) + ("" if st == "loaded" else f"\n({st})")
        ax.text(i, total, note, ha="center", va="bottom", fontsize=8)
    if floor is not None:
        ax.axhline(floor, color="#444444", linestyle="--", linewidth=1.2,
                   label=f"minimum (unique content): {format_bytes(floor)}")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30 if len(labels) > 3 else 0, ha="right" if len(labels) > 3 else "center",
                       fontsize=8)
    ax.set_ylabel("constant bytes on device")
    top = max(bottoms + [floor or 0]) or 1
    ax.set_ylim(0, top * 1.3)
    _bytes_axis(ax.yaxis, top * 1.3)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    default = f"{program_name}: device memory per method and policy" if program_name else "device memory per method and policy"
    ax.set_title(title if title is not None else default, fontsize=10)
    return fig


def _bytes_axis(axis, top: float) -> None:
    """Ticks at binary-round byte counts (1, 2, 4 ... KiB) with readable labels."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    step = 2.0 ** max(0, math.ceil(math.log2(max(top, 1.0) / 6.0)))
    axis.set_major_locator(MultipleLocator(step))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: format_bytes(v)))


def _method_colours(methods: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


# ------------------------------------------------------------------ timeline

# event kind -> (label, colour) for events that carry a duration ("seconds")
_SPANS = {
    "container_created": ("create container", "#8e7cc3"),
    "blob_uploaded": ("upload whole blob", "#e69138"),
    "constant_uploaded": ("upload one constant", "#45818e"),
}


def event_timeline(session_or_events: "Session | pd.DataFrame", *, ax: "Axes | None" = None,
                   title: str | None = None) -> "Figure":
    """Which method did which step when, and for how long.

    One row per method: a light bar spans the whole method load, coloured bars the timed
    steps (container creation, blob upload, per-constant uploads), and markers the
    decisions, coloured like the collision matrix.  A failed method is marked with a cross.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if isinstance(session_or_events, pd.DataFrame):
        ev, default_title = session_or_events, "load timeline"
    else:
        ev = session_or_events.events
        default_title = f"{session_or_events.program.name}: load timeline ({session_or_events.policy.name.value})"
    methods = list(dict.fromkeys(ev["method"])) if len(ev) else []
    fig, ax = _axes(ax, (8.0, 1.6 + 0.55 * max(len(methods), 1)))
    y = {m: i for i, m in enumerate(methods)}
    scale, unit = _time_unit(float(ev["time_s"].max()) if len(ev) else 0.0)
    starts = {}
    for r in ev.to_dict("records"):
        kind, m, t = r["kind"], r["method"], float(r["time_s"]) * scale
        if kind == "load_started":
            starts[m] = t
        elif kind == "method_loaded" or kind == "load_failed":
            t0 = starts.get(m, t)
            ax.broken_barh([(t0, max(t - t0, 1e-9))], (y[m] - 0.4, 0.8), facecolors="#eeeeee", edgecolor="#bbbbbb",
                           zorder=1)
            if kind == "load_failed":
                ax.plot([t], [y[m]], marker="X", color=WRONG_COLOUR, markersize=10, linestyle="none", zorder=4)
        elif kind in _SPANS:
            secs = float(r.get("seconds") or 0.0) * scale
            ax.broken_barh([(t - secs, max(secs, 1e-9))], (y[m] - 0.25, 0.5), facecolors=_SPANS[kind][1], zorder=2)
        elif kind == "decided":
            d = str(r.get("decision"))
            ax.plot([t], [y[m]], marker="o", markersize=6, linestyle="none", color=_STRONG.get(d, "black"),
                    markeredgecolor="white", zorder=3)
    ax.set_yticks(range(len(methods)))
    ax.set_yticklabels(methods)
    ax.set_ylim(len(methods) - 0.4 if methods else 1, -0.6)
    ax.set_xlabel(f"time since the load began ({unit})")
    ax.set_xlim(left=0)
    kinds_seen = set(ev["kind"]) if len(ev) else set()
    handles = [Patch(facecolor="#eeeeee", edgecolor="#bbbbbb", label="method load")]
    handles += [Patch(facecolor=c, label=lbl) for k, (lbl, c) in _SPANS.items() if k in kinds_seen]
    dec_seen = set(ev.loc[ev["kind"] == "decided", "decision"].astype(str)) if "decision" in ev else set()
    handles += [Line2D([], [], marker="o", linestyle="none", color=_STRONG[d], label=f"decided: {d}")
                for d in _DECISION_ORDER if d in dec_seen]
    if "load_failed" in kinds_seen:
        handles.append(Line2D([], [], marker="X", linestyle="none", color=WRONG_COLOUR, label="load failed"))
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title if title is not None else default_title, fontsize=10)
    return fig


def _time_unit(max_s: float) -> tuple[float, str]:
    if max_s < 1.0:
        return 1000.0, "ms"
    return 1.0, "s"


# ------------------------------------------------------------------ policy comparison


def _count(v: Any) -> int:
    if isinstance(v, (list, tuple, set, frozenset)):
        return len(v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return 0
    text = str(v).strip("[]() ")
    return len([x for x in text.split(",") if x.strip()]) if text else 0


def policy_tradeoff(comparison: "pd.DataFrame | Any", *, ax: "Axes | None" = None, minimum: int | None = None,
                    title: str | None = None) -> "Figure":
    """Correctness vs memory, one point per policy (:func:`toolkit.compare_policies`' result or its frame).

    x: constant bytes on the device; y: methods whose output is wrong or that cannot run.
    Policies landing on the same point share one label.  A failed load (refused) is drawn
    hollow: it is safe, but the program does not load.  ``minimum`` draws the
    perfect-loader floor (:func:`minimum_device_bytes`).
    """
    comparison = getattr(comparison, "frame", comparison)  # a PolicyComparison, or its frame
    fig, ax = _axes(ax, (7.0, 4.2))
    pts: dict[tuple[float, int, bool], list[str]] = {}
    for r in comparison.to_dict("records"):
        bad = _count(r.get("wrong_methods")) + _count(r.get("not_runnable"))
        key = (float(r["device_bytes"]), bad, bool(r["loaded"]))
        pts.setdefault(key, []).append(str(r["policy"]))
    rank: dict[tuple[float, int, bool], int] = {}  # position of a point among those on its row, by x
    for key in sorted(pts, key=lambda k: (k[1], k[0])):
        rank[key] = sum(1 for other in rank if other[1] == key[1])
    for (x, bad, loaded), names in pts.items():
        colour = "#3d85c6" if bad == 0 and loaded else (WRONG_COLOUR if bad else "#999999")
        ax.scatter([x], [bad], s=90, zorder=3, color=colour if loaded else "white", edgecolors=colour, linewidths=2)
        label = "\n".join(names) + ("" if loaded else "\n(load refused)")
        above = rank[(x, bad, loaded)] % 2 == 0  # neighbours on one row alternate above / below
        ax.annotate(label, (x, bad), textcoords="offset points", xytext=(8, 5 if above else -5), fontsize=8,
                    va="bottom" if above else "top")
    if minimum is not None:
        ax.axvline(minimum, color="#444444", linestyle="--", linewidth=1.0)
        ax.annotate(f"minimum {format_bytes(minimum)}", (minimum, 0), textcoords="offset points", xytext=(4, -14),
                    fontsize=8, color="#444444")
    ys = [k[1] for k in pts] or [0]
    ax.set_ylim(-0.9, max(ys) + 0.9)
    ax.set_yticks(range(0, max(ys) + 1))
    xs = [k[0] for k in pts] + ([minimum] if minimum is not None else [])
    hi = max(xs) if xs else 1.0
    ax.set_xlim(0, hi * 1.45 if hi else 1.0)
    _bytes_axis(ax.xaxis, hi * 1.45 if hi else 1.0)
    ax.set_xlabel("constant bytes on device (lower is better)")
    ax.set_ylabel("methods wrong or not runnable\n(lower is better)")
    ax.grid(True, alpha=0.3)
    ax.set_title(title if title is not None else "correctness vs memory, one point per policy", fontsize=10)
    return fig


def figure_png(fig: "Figure", dpi: int = 100) -> bytes:
    """The figure rendered as PNG bytes (for widgets and tests); writes no file."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
