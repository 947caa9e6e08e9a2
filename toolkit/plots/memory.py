"""Device memory per policy: constant bytes per method, one stacked bar per policy, against the
minimum a perfect loader would need."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pandas as pd

from toolkit.display.cells import format_bytes
from toolkit.display.palette import FLOOR_MARK, METHOD_COLOURMAP, PAPER
from toolkit.engine.frames import memory_by_policy_frame
from toolkit.plots.figure import bytes_axis, figure_and_axes, plain_text, wrapped_title

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from toolkit.core.model import Program
    from toolkit.engine.session import Session


def minimum_device_bytes(program: "Program") -> int:
    """Constant bytes a perfect loader needs: the memory floor M of :func:`toolkit.workflows.dry_run.memory_floor`
    (each distinct content once per device, plus one copy per method of every mutated buffer)."""
    from toolkit.workflows.dry_run import memory_floor

    return memory_floor(program).total_bytes


def _as_sessions(sessions: "Session | Mapping[str, Session] | Sequence[Session]") -> list["Session"]:
    if isinstance(sessions, Mapping):
        return list(sessions.values())
    if isinstance(sessions, (list, tuple)):
        return list(sessions)
    return [sessions]  # one Session


def memory_by_policy(
    sessions: "Session | Mapping[str, Session] | Sequence[Session] | pd.DataFrame",
    *,
    ax: "Axes | None" = None,
    minimum: int | None = None,
    title: str | None = None,
) -> "Figure":
    """Stacked bars: constant bytes per method, one bar per policy, against the minimum a
    perfect loader would need (dashed line).

    ``sessions`` are loads of one program (or a policy comparison), or a
    :func:`toolkit.engine.frames.memory_by_policy_frame` of them (then pass
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
        frame, program_name = memory_by_policy_frame(ss), ss[0].program.name
        floor = minimum if minimum is not None else minimum_device_bytes(ss[0].program)
        status = {s.policy.name.value: getattr(s, "load_outcome", s.status) for s in ss}  # kept after close
    labels = list(dict.fromkeys(frame["policy"]))
    methods = list(dict.fromkeys(frame["method"]))
    fig, ax = figure_and_axes(ax, (max(6.5, 1.1 * len(labels) + 4.0), 3.8))
    cmap = _method_colours(methods)
    bottoms = [0.0] * len(labels)
    for m in methods:
        vals = [float(frame[(frame["policy"] == p) & (frame["method"] == m)]["device_bytes"].sum()) for p in labels]
        ax.bar(
            range(len(labels)), vals, bottom=bottoms, color=cmap[m], edgecolor=PAPER, label=plain_text(m), width=0.65
        )
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i, (p, total) in enumerate(zip(labels, bottoms)):
        st = status.get(p, "loaded")
        note = format_bytes(total) + ("" if st == "loaded" else f"\n({st})")
        # on a white ground: the dashed minimum line may pass right behind it
        ax.text(
            i,
            total,
            note,
            ha="center",
            va="bottom",
            fontsize=8,
            zorder=5,
            bbox={"facecolor": PAPER, "edgecolor": "none", "pad": 1.0, "alpha": 0.85},
        )
    if floor is not None:
        ax.axhline(
            floor,
            color=FLOOR_MARK,
            linestyle="--",
            linewidth=1.2,
            label=f"minimum (unique content): {format_bytes(floor)}",
        )
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(
        [plain_text(x) for x in labels],
        rotation=30 if len(labels) > 3 else 0,
        ha="right" if len(labels) > 3 else "center",
        fontsize=8,
    )
    ax.set_ylabel("constant bytes on device")
    top = max(bottoms + [floor or 0]) or 1
    ax.set_ylim(0, top * 1.3)
    bytes_axis(ax.yaxis, top * 1.3)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    default = (
        f"{program_name}: device memory per method and policy"
        if program_name
        else "device memory per method and policy"
    )
    wrapped_title(ax, plain_text(title if title is not None else default))
    return fig


def _method_colours(methods: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps[METHOD_COLOURMAP]
    return {m: cmap(i % 10) for i, m in enumerate(methods)}
