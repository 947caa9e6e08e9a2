"""Interactive figures carry a static image: the plotly collision matrix's display data also holds a
PNG (the matplotlib matrix of the same cells), drawn once and only when the figure is displayed."""

from __future__ import annotations

import base64

import pandas as pd
import pytest
from conftest import require

require("matplotlib", extra="plots")
require("plotly", extra="plots")

import plotly.io as pio  # noqa: E402

import toolkit  # noqa: E402
from toolkit import plots  # noqa: E402
from toolkit.plots.figure import figure_png  # noqa: E402
from toolkit.plots.interactive import PLOTLY_MIME  # noqa: E402
from toolkit.plots.matrix_view import LONG_MATRIX  # noqa: E402


@pytest.fixture(autouse=True)
def for_an_export(monkeypatch):
    monkeypatch.setenv("CONSTSHARE_STATIC_FIGURES", "1")


def test_live_figures_carry_no_image_unless_asked(monkeypatch):
    """JupyterLab's plotly renderer would draw the PNG instead of the interactive figure."""
    monkeypatch.delenv("CONSTSHARE_STATIC_FIGURES")
    fig = plots.interactive_collision_matrix(
        toolkit.dry_run(toolkit.build_sample("total_collision"), "name-only").session
    )
    assert PNG_MIME not in fig._repr_mimebundle_() and fig.static_png() is not None  # drawable, not sent


from toolkit.plots.static import PNG_MIME, STATIC_DPI, InteractiveFigure, with_static_image  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DECISIONS = pd.DataFrame(
    [
        ("prefill", "_tensor_constant0", "_tensor_constant0", "loaded"),
        ("decode", "_tensor_constant0", "_tensor_constant0", "shared"),
        ("decode", "w", "layers.0.w", "declined"),
    ],
    columns=["method", "name", "fqn", "decision"],
)


@pytest.fixture
def jupyter_renderer():
    """plotly's renderer as a Jupyter kernel picks it (plotly's own mime type only)."""
    old = pio.renderers.default
    pio.renderers.default = "plotly_mimetype"
    yield
    pio.renderers.default = old


def png_of(bundle) -> bytes:
    return base64.b64decode(bundle[PNG_MIME])


def test_the_matrix_bundle_holds_plotly_and_the_matplotlib_png(jupyter_renderer):
    fig = plots.interactive_collision_matrix(DECISIONS, wrong_methods=["decode"], title="t")
    assert isinstance(fig, InteractiveFigure)
    bundle = fig._repr_mimebundle_()
    assert set(bundle) == {PLOTLY_MIME, PNG_MIME, "text/plain"}
    assert bundle[PLOTLY_MIME]["data"][0]["type"] == "heatmap"
    static = plots.collision_matrix(DECISIONS, wrong_methods=["decode"], title="t")
    assert png_of(bundle) == figure_png(static, dpi=STATIC_DPI)  # the same cells, drawn by matplotlib
    other = plots.collision_matrix(DECISIONS, title="t")  # no wrong method: another picture
    assert png_of(bundle) != figure_png(other, dpi=STATIC_DPI)


def test_a_long_matrix_carries_its_png_too(jupyter_renderer):
    rows = [
        (m, f"layers.{i}.w", f"layers.{i}.w", d)
        for i in range(LONG_MATRIX + 5)
        for m, d in (("prefill", "loaded"), ("decode", "shared"))
    ]
    fig = plots.interactive_collision_matrix(pd.DataFrame(rows, columns=DECISIONS.columns), only_colliding=False)
    assert fig.data[0].meta["long"] is True
    assert png_of(fig._repr_mimebundle_()).startswith(PNG_MAGIC)


def test_the_png_is_drawn_once_and_only_when_displayed(jupyter_renderer):
    calls = []

    def draw():
        calls.append(1)
        return plots.collision_matrix(DECISIONS)

    fig = with_static_image(plots.interactive_collision_matrix(DECISIONS), draw)
    plots.plotly_bundle(fig)  # the explorer's display data: plotly's own, no drawing
    assert calls == []
    first, second = fig._repr_mimebundle_(), fig._repr_mimebundle_()
    assert calls == [1] and first[PNG_MIME] == second[PNG_MIME]
    assert fig.static_png() == png_of(first)


def test_displaying_publishes_the_whole_bundle(jupyter_renderer, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.append((objs, kw)))
    plots.interactive_collision_matrix(DECISIONS)._ipython_display_()
    [(objs, kw)] = shown
    assert kw.get("raw") is True and {PLOTLY_MIME, PNG_MIME} <= set(objs[0])


def test_without_a_plotly_renderer_the_image_and_text_remain():
    old = pio.renderers.default
    pio.renderers.default = ""
    try:
        bundle = plots.interactive_collision_matrix(DECISIONS, title="my matrix")._repr_mimebundle_()
    finally:
        pio.renderers.default = old
    assert set(bundle) == {PNG_MIME, "text/plain"} and "my matrix" in bundle["text/plain"]


def test_the_text_fallback_is_the_title_as_plain_text(jupyter_renderer):
    fig = plots.interactive_collision_matrix(DECISIONS, title="a <b> & c " + "long words " * 30)
    assert "<br>" in fig.layout.title.text  # plotly wraps it
    text = fig._repr_mimebundle_()["text/plain"]
    assert "<br>" not in text and "a <b> & c long words" in text
    hyphens = plots.interactive_collision_matrix(DECISIONS, title="x" * 30 + " decline-on-mismatch " * 8)
    assert "decline-on-mismatch " * 7 in hyphens._repr_mimebundle_()["text/plain"] + " "


def test_include_and_exclude_pick_mime_types(jupyter_renderer):
    fig = plots.interactive_collision_matrix(DECISIONS)
    assert set(fig._repr_mimebundle_(include=[PNG_MIME])) == {PNG_MIME}
    assert PNG_MIME not in fig._repr_mimebundle_(exclude=[PNG_MIME])


def test_a_figure_without_a_drawing_has_no_png(jupyter_renderer):
    fig = InteractiveFigure()
    assert fig.static_png() is None and PNG_MIME not in fig._repr_mimebundle_()
    copy = with_static_image(pio.from_json(fig.to_json()), lambda: plots.collision_matrix(DECISIONS))
    assert isinstance(copy, InteractiveFigure) and copy.static_png().startswith(PNG_MAGIC)
