"""An interactive (plotly) figure that also carries a static image, so it shows wherever a notebook is read.

JupyterLab draws plotly's own mime type; nbconvert's HTML and PDF exports, GitHub and any viewer
without plotly's renderer draw the PNG that travels in the same display bundle.  plotly's own
static export (kaleido) needs a Chrome it downloads at run time, so the PNG is drawn with
matplotlib instead, by a function the figure's maker passes (the same cells, drawn statically),
and only when the figure is first displayed: a figure nobody displays costs no drawing.
"""

from __future__ import annotations

import base64
import html
import os
from typing import TYPE_CHECKING, Any, Callable

import plotly.graph_objects as go

from toolkit.plots.figure import figure_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOTLY_MIME = "application/vnd.plotly.v1+json"
# JupyterLab's plotly renderer draws a bundle's PNG instead of the interactive figure when one is there, so
# the PNG is added only where the notebook is run for an export (nbconvert, GitHub, a PDF): this variable = 1
STATIC_IMAGES_ENV = "CONSTSHARE_STATIC_FIGURES"


def static_images_wanted() -> bool:
    """Whether displayed figures carry their static image (``CONSTSHARE_STATIC_FIGURES=1``)."""
    return os.environ.get(STATIC_IMAGES_ENV, "") == "1"


PNG_MIME = "image/png"
STATIC_DPI = 100  # the PNG's pixels per inch (matplotlib's default: the same size as the inline backend's)


class InteractiveFigure(go.Figure):
    """A plotly ``Figure`` whose notebook display also carries a static PNG.

    ``draw`` returns a matplotlib Figure of the same content; it is called once, on the first
    display (or :meth:`static_png`).  Everything else is a plain plotly figure: ``update_layout``,
    ``to_json``, ``show`` and :func:`~toolkit.plots.interactive.plotly_bundle` behave as usual.
    """

    def __init__(self, *args: Any, draw: "Callable[[], Figure] | None" = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._draw = draw
        self._png: bytes | None = None

    def static_png(self) -> bytes | None:
        """The static image as PNG bytes (drawn once, then kept); None when the figure has no drawing."""
        if self._png is None and self._draw is not None:
            self._png = figure_png(self._draw(), dpi=STATIC_DPI)
        return self._png

    def _repr_mimebundle_(self, include=None, exclude=None, validate=True, **kwargs) -> dict[str, Any]:
        """plotly's display data for its default renderer, plus the PNG and a line of text: a reader
        picks the richest type it can draw (JupyterLab plotly's, nbconvert and GitHub the PNG)."""
        import plotly.io as pio

        bundle: dict[str, Any] = {}
        if pio.renderers.render_on_display and pio.renderers.default:
            bundle.update(super()._repr_mimebundle_(include, exclude, validate, **kwargs) or {})
        png = self.static_png() if static_images_wanted() else None
        if png is not None:
            bundle.setdefault(PNG_MIME, base64.b64encode(png).decode("ascii"))
        # the title as plain text: plotly's line breaks and entities undone
        text = (
            (self.layout.title.text or "").replace("-<br>", "-").replace("<br>", " ")
        )  # wrapped at a hyphen or a space
        title = " ".join(html.unescape(text).split())
        bundle.setdefault("text/plain", f"<interactive figure: {title}>" if title else "<interactive figure>")
        if include:
            bundle = {k: v for k, v in bundle.items() if k in include}
        if exclude:
            bundle = {k: v for k, v in bundle.items() if k not in exclude}
        return bundle

    def _ipython_display_(self) -> None:
        # plotly's own hook publishes its renderer's data only: publish the whole bundle instead
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)


def with_static_image(fig: go.Figure, draw: "Callable[[], Figure]") -> InteractiveFigure:
    """``fig`` as an :class:`InteractiveFigure` whose static image ``draw`` makes (a copy of ``fig``
    when it is a plain plotly figure, ``fig`` itself when it already is one)."""
    if isinstance(fig, InteractiveFigure):
        fig._draw, fig._png = draw, None
        return fig
    return InteractiveFigure(fig, draw=draw)
