"""Correctness against memory, one point per policy, its labels placed clear of each other when the
figure is drawn (the layout is final then)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from toolkit.display.cells import format_bytes
from toolkit.display.palette import CORRECT_MARK, FLOOR_MARK, NOT_LOADED_MARK, PAPER, WRONG_MARK
from toolkit.plots.figure import bytes_axis, figure_and_axes, plain_text, wrapped_title

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _count(v: Any) -> int:
    if isinstance(v, (list, tuple, set, frozenset)):
        return len(v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return 0
    text = str(v).strip("[]() ")
    return len([x for x in text.split(",") if x.strip()]) if text else 0


# label offsets (points) tried in turn: right, above/below right, left, above/below left,
# straight above / below; then the same farther out
_OFFSETS = [
    (8, 0, "left", "center"),
    (6, 7, "left", "bottom"),
    (6, -7, "left", "top"),
    (-8, 0, "right", "center"),
    (-6, 7, "right", "bottom"),
    (-6, -7, "right", "top"),
    (0, 9, "center", "bottom"),
    (0, -9, "center", "top"),
]
_CANDIDATES = [(dx * k, dy * k, ha, va) for k in (1, 2, 3, 4.5) for dx, dy, ha, va in _OFFSETS]


def _overlap(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _move(ann, dx: float, dy: float, ha: str, va: str) -> None:
    ann.xyann = (dx, dy)
    ann.set_horizontalalignment(ha)
    ann.set_verticalalignment(va)


def _label_placer():
    """An artist that places the point labels of a policy_tradeoff plot when it is drawn.

    Drawn before them (lowest zorder) once the figure's layout is final, it moves each label
    to the first offset around its point whose box stays inside the axes and clear of the
    labels placed so far, of every point marker, of the fixed texts (the minimum marker's
    label) and of the minimum line; if none is clear, to the one overlapping least.
    """
    from matplotlib.artist import Artist
    from matplotlib.transforms import Bbox

    class LabelPlacer(Artist):
        def __init__(self, labels, points, fixed, lines, marker_pts):
            super().__init__()
            self.labels, self.points, self.fixed, self.lines = labels, points, fixed, lines
            self.marker_pts = marker_pts
            self.set_zorder(-1e9)

        def draw(self, renderer):
            ax = self.axes
            px = renderer.points_to_pixels(1.0)
            frame = ax.get_window_extent(renderer)
            r = self.marker_pts * px
            obstacles = [t.get_window_extent(renderer) for t in self.fixed if t.get_text()]
            for x in self.lines:
                x_px = ax.transData.transform((x, 0))[0]
                obstacles.append(Bbox.from_extents(x_px - 1.5 * px, frame.y0, x_px + 1.5 * px, frame.y1))
            markers = []
            for x, y in self.points:
                cx, cy = ax.transData.transform((x, y))
                markers.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
            placed: list = []
            for ann in self.labels:
                best, best_cost = None, None
                for dx, dy, ha, va in _CANDIDATES:
                    _move(ann, dx, dy, ha, va)
                    box = ann.get_window_extent(renderer)
                    outside = (max(frame.x0 - box.x0, 0) + max(box.x1 - frame.x1, 0)) * box.height + (
                        max(frame.y0 - box.y0, 0) + max(box.y1 - frame.y1, 0)
                    ) * box.width
                    cost = outside * 4 + sum(_overlap(box, o) for o in placed + obstacles + markers)
                    if best_cost is None or cost < best_cost:
                        best, best_cost = (dx, dy, ha, va), cost
                    if cost == 0:
                        break
                _move(ann, *best)
                placed.append(ann.get_window_extent(renderer))

    return LabelPlacer


def policy_tradeoff(
    comparison: "pd.DataFrame | Any", *, ax: "Axes | None" = None, minimum: int | None = None, title: str | None = None
) -> "Figure":
    """Correctness vs memory, one point per policy (:func:`toolkit.compare_policies`' result or its frame).

    x: constant bytes on the device; y: methods whose output is wrong or that cannot run.
    Policies landing on the same point share one label.  A failed load (refused) is drawn
    hollow: it is safe, but the program does not load.  ``minimum`` draws the
    perfect-loader floor (:func:`~toolkit.plots.memory.minimum_device_bytes`) as a dashed line labelled at the
    top.  Labels are placed when the figure is drawn, clear of each other, of the points
    and of the minimum marker.
    """
    comparison = getattr(comparison, "frame", comparison)  # a PolicyComparison, or its frame
    fig, ax = figure_and_axes(ax, (7.0, 4.2))
    pts: dict[tuple[float, int, bool], list[str]] = {}
    for r in comparison.to_dict("records"):
        bad = _count(r.get("wrong_methods")) + _count(r.get("not_runnable"))
        key = (float(r["device_bytes"]), bad, bool(r["loaded"]))
        pts.setdefault(key, []).append(str(r["policy"]))
    labels = []
    marker_size = 90  # points^2
    for (x, bad, loaded), names in sorted(pts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        colour = CORRECT_MARK if bad == 0 and loaded else (WRONG_MARK if bad else NOT_LOADED_MARK)
        ax.scatter(
            [x], [bad], s=marker_size, zorder=3, color=colour if loaded else PAPER, edgecolors=colour, linewidths=2
        )
        label = "\n".join(plain_text(n) for n in names) + ("" if loaded else "\n(load refused)")
        labels.append(
            ax.annotate(
                label,
                (x, bad),
                textcoords="offset points",
                xytext=(8, 0),
                fontsize=8,
                va="center",
                ha="left",
                zorder=4,
                annotation_clip=False,
            )
        )
    fixed = []
    if minimum is not None:
        ax.axvline(minimum, color=FLOOR_MARK, linestyle="--", linewidth=1.0)
        fixed.append(
            ax.annotate(
                f"minimum {format_bytes(minimum)}",
                (minimum, 1.0),
                xycoords=("data", "axes fraction"),
                textcoords="offset points",
                xytext=(4, -4),
                ha="left",
                va="top",
                fontsize=8,
                color=FLOOR_MARK,
            )
        )
    ys = [k[1] for k in pts] or [0]
    ax.set_ylim(-0.9, max(ys) + 1.1)
    ax.set_yticks(range(0, max(ys) + 1))
    xs = [k[0] for k in pts] + ([minimum] if minimum is not None else [])
    hi = max(xs) if xs else 1.0
    ax.set_xlim(0, hi * 1.5 if hi else 1.0)
    bytes_axis(ax.xaxis, hi * 1.5 if hi else 1.0)
    ax.set_xlabel("constant bytes on device (lower is better)")
    ax.set_ylabel("methods wrong or not runnable\n(lower is better)")
    ax.grid(True, alpha=0.3)
    wrapped_title(ax, plain_text(title if title is not None else "correctness vs memory, one point per policy"))
    placer = _label_placer()(
        labels,
        [(k[0], k[1]) for k in pts],
        fixed,
        [minimum] if minimum is not None else [],
        math.sqrt(marker_size) / 2 + 1,
    )
    ax.add_artist(placer)
    return fig
