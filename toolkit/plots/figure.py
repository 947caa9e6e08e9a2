"""What every plot shares: a figure to draw on, a title that wraps, program text drawn literally, a
byte-count axis, long names shortened, and the figure as PNG bytes.

A plot draws on the ``ax`` it is given, or on a fresh :class:`~matplotlib.figure.Figure` made here
without touching pyplot's global state; matplotlib is imported only when something is drawn.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from toolkit.display.cells import cell_text, format_bytes, one_line

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def plain_text(text: Any) -> str:
    """``text`` as matplotlib should draw it literally, on one line: hidden characters and line breaks
    escaped (:func:`~toolkit.display.cells.one_line`, so two names that differ only in them are drawn
    apart), and every ``$`` escaped, so a name like ``$x^2$`` is neither parsed as mathtext nor typeset."""
    return one_line(cell_text(text)).replace("$", "\\$")


def figure_and_axes(ax: "Axes | None", figsize: tuple[float, float]) -> tuple["Figure", "Axes"]:
    """``ax`` and its figure; without one, a fresh constrained-layout Figure of ``figsize`` and its axes."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def wrapped_title(ax: "Axes", text: str) -> None:
    """A title that wraps at the figure's edges rather than being cut."""
    ax.set_title(text, fontsize=10, wrap=True)


def bytes_axis(axis, top: float) -> None:
    """Ticks at binary-round byte counts (1, 2, 4 ... KiB) with readable labels."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    step = 2.0 ** max(0, math.ceil(math.log2(max(top, 1.0) / 6.0)))
    axis.set_major_locator(MultipleLocator(step))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: format_bytes(v)))


def short_key(key: str, width: int = 48) -> str:
    """A constant's name cut from its start to ``width`` characters (the end of a name tells names apart)."""
    return key if len(key) <= width else "\u2026" + key[-(width - 1) :]


def figure_png(fig: "Figure", dpi: int = 100) -> bytes:
    """The figure rendered as PNG bytes (for widgets and tests); writes no file."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
