"""A load's timeline: which method did which step when, and for how long, with its decisions as ticks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from toolkit.core.vocab import Decision, EventKind
from toolkit.display.palette import BAND, BAND_EDGE, DECISION_MARKS, INK, STEP_COLOURS, WRONG_MARK
from toolkit.plots.figure import figure_and_axes, plain_text, wrapped_title

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from toolkit.engine.session import Session

MIN_SPAN_FRACTION = 0.005  # of the time axis: the narrowest a timed step is drawn
TICK_WIDTH = 2.0  # points: a decision's tick
# event kind -> (label, colour) for events that carry a duration ("seconds")
_SPANS = {
    EventKind.CONTAINER_CREATED: ("create container", STEP_COLOURS[EventKind.CONTAINER_CREATED]),
    EventKind.BLOB_UPLOADED: ("upload whole blob", STEP_COLOURS[EventKind.BLOB_UPLOADED]),
    EventKind.CONSTANT_UPLOADED: ("upload one constant", STEP_COLOURS[EventKind.CONSTANT_UPLOADED]),
}


def event_timeline(
    session_or_events: "Session | pd.DataFrame",
    *,
    ax: "Axes | None" = None,
    title: str | None = None,
    predicted: bool | None = None,
) -> "Figure":
    """Which method did which step when, and for how long.

    One row per method: a light bar spans the whole method load, coloured bars the timed
    steps (container creation, blob upload, per-constant uploads), and thin ticks the
    decisions, coloured like the collision matrix, each kind of decision in a lane of its
    own (so a burst of decisions reads as a strip, not a blob); the legend counts them.  A
    failed method is marked with a cross.  A timed step is drawn at least
    :data:`MIN_SPAN_FRACTION` of the axis wide (a short upload in a long load is still seen).
    ``predicted`` (default: a session whose runtime cannot run, a dry run): the axis says the
    times are the analysis's, nothing was loaded.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if isinstance(session_or_events, pd.DataFrame):
        ev, default_title = session_or_events, "load timeline"
    else:
        ev = session_or_events.events
        if predicted is None:
            predicted = not session_or_events.runtime.can_run
        what = "dry run (predicted) timeline" if predicted else "load timeline"
        default_title = f"{session_or_events.program.name}: {what} ({session_or_events.policy.name.value})"
    methods = list(dict.fromkeys(ev["method"])) if len(ev) else []
    fig, ax = figure_and_axes(ax, (8.0, 1.6 + 0.7 * max(len(methods), 1)))
    y = {m: i for i, m in enumerate(methods)}
    end_s = float(ev["time_s"].max()) if len(ev) else 0.0
    scale, unit = (1000.0, "ms") if end_s < 1.0 else (1.0, "s")
    min_span = end_s * scale * MIN_SPAN_FRACTION
    decided = ev[ev["kind"] == "decided"] if len(ev) and "decision" in ev else ev.iloc[:0]
    kinds = [d.value for d in Decision if d in set(decided["decision"].astype(str))] if len(decided) else []
    # lanes of the decision ticks inside a method's row, one per kind present
    lane = {d: (-0.3 + 0.6 * (k + 0.5) / len(kinds)) for k, d in enumerate(kinds)}
    lane_height = min(0.6 / max(len(kinds), 1), 0.3)
    starts = {}
    ticks: dict[str, tuple[list[float], list[float]]] = {}
    used = [c for c in ("kind", "method", "time_s", "seconds", "decision") if c in ev.columns]
    for r in ev[used].to_dict("records"):  # only the columns read: a large load stays fast
        kind, m, t = r["kind"], r["method"], float(r["time_s"]) * scale
        if kind == "load_started":
            starts[m] = t
        elif kind == "method_loaded" or kind == "load_failed":
            t0 = starts.get(m, t)
            ax.broken_barh([(t0, max(t - t0, 1e-9))], (y[m] - 0.4, 0.8), facecolors=BAND, edgecolor=BAND_EDGE, zorder=1)
            if kind == "load_failed":
                ax.plot([t], [y[m]], marker="X", color=WRONG_MARK, markersize=10, linestyle="none", zorder=4)
        elif kind in _SPANS:
            secs = float(r.get("seconds") or 0.0) * scale
            ax.broken_barh(
                [(t - secs, max(secs, min_span, 1e-9))], (y[m] - 0.25, 0.5), facecolors=_SPANS[kind][1], zorder=2
            )
        elif kind == "decided":
            d = str(r.get("decision"))
            xs, ys = ticks.setdefault(d, ([], []))
            xs.append(t)
            ys.append(y[m] + lane.get(d, 0.0))
    marker_pts = 72 * lane_height * (fig.get_figheight() - 1.6) / max(len(methods), 1) * 0.9
    for d, (xs, ys) in ticks.items():
        ax.plot(
            xs,
            ys,
            marker="|",
            markersize=max(4.0, min(marker_pts, 12.0)),
            markeredgewidth=TICK_WIDTH,
            linestyle="none",
            color=DECISION_MARKS.get(d, INK),
            zorder=3,
        )
    ax.set_yticks(range(len(methods)))
    ax.set_yticklabels([plain_text(m) for m in methods])
    ax.set_ylim(len(methods) - 0.4 if methods else 1, -0.6)
    ax.set_xlabel(
        f"time into the dry run's analysis ({unit}): a prediction, nothing was loaded or run"
        if predicted
        else f"time since the load began ({unit})"
    )
    ax.set_xlim(left=0)
    kinds_seen = set(ev["kind"]) if len(ev) else set()
    handles = [Patch(facecolor=BAND, edgecolor=BAND_EDGE, label="method load")]
    handles += [Patch(facecolor=c, label=lbl) for k, (lbl, c) in _SPANS.items() if k in kinds_seen]
    handles += [
        Line2D(
            [],
            [],
            marker="|",
            markersize=9,
            markeredgewidth=1.5,
            linestyle="none",
            color=DECISION_MARKS[d],
            label=f"decided: {d} ({len(ticks[d][0])})",
        )
        for d in kinds
    ]
    if "load_failed" in kinds_seen:
        handles.append(Line2D([], [], marker="X", linestyle="none", color=WRONG_MARK, label="load failed"))
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    wrapped_title(ax, plain_text(title if title is not None else default_title))
    return fig
