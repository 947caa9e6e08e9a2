"""Plots: each returns a Figure, draws on a given ax, never touches pyplot or the disk."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from conftest import require

require("matplotlib", extra="plots")

from matplotlib.figure import Figure  # noqa: E402

from toolkit import (  # noqa: E402
    load_program,
    plots,  # noqa: E402
)
from toolkit.display.cells import format_bytes  # noqa: E402
from toolkit.display.content import culprit_mask  # noqa: E402
from toolkit.display.palette import CULPRIT_FACE, DECISION_COLOURS, WRONG_MARK  # noqa: E402
from toolkit.engine.frames import memory_by_policy_frame  # noqa: E402
from toolkit.plots.groups import layer_groups, long_rows, matrix_groups  # noqa: E402
from toolkit.plots.interactive import HOVER_ROOM, LONG_ROW_PX, MAX_PLOTLY_WIDTH, MODEBAR_WIDTH  # noqa: E402
from toolkit.plots.matrix import LONG_LABEL_PT  # noqa: E402
from toolkit.plots.matrix_view import MAX_MATRIX_COLUMNS  # noqa: E402
from toolkit.plots.timeline import MIN_SPAN_FRACTION, TICK_WIDTH  # noqa: E402


def decisions(rows):
    return pd.DataFrame(rows, columns=["method", "name", "fqn", "decision"])


SYNTH = decisions(
    [
        ("prefill", "_tensor_constant0", "_tensor_constant0", "loaded"),
        ("prefill", "w", "layers.0.w", "loaded"),
        ("decode", "_tensor_constant0", "_tensor_constant0", "shared"),
        ("decode", "b", "", "private"),
        ("decode", "w", "layers.0.w", "declined"),
    ]
)


def test_collision_matrix_data_is_methods_by_constants():
    grid = plots.collision_matrix_data(SYNTH, ["prefill", "decode", "never_loaded"])
    assert list(grid.index) == ["prefill", "decode", "never_loaded"]
    assert list(grid.columns) == ["_tensor_constant0", "layers.0.w", "b"]  # FQN, else the internal name
    assert grid.loc["decode", "_tensor_constant0"] == "shared"
    assert grid.loc["prefill", "b"] == "" and set(grid.loc["never_loaded"]) == {""}


def test_collision_matrix_marks_wrong_methods():
    fig = plots.collision_matrix(SYNTH, wrong_methods=["decode"], title="t")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    labels = {t.get_text(): t.get_color() for t in ax.get_yticklabels()}
    assert "\u2717 decode (wrong)" in labels and labels["\u2717 decode (wrong)"] == WRONG_MARK
    assert labels["prefill"] != WRONG_MARK
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "S shared" in legend and "D declined" in legend and "wrong output" in legend
    assert plots.figure_png(fig).startswith(b"\x89PNG")


def test_collision_matrix_can_keep_only_colliding_names():
    fig = plots.collision_matrix(SYNTH, only_colliding=True)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["_tensor_constant0", "layers.0.w"]  # "b" is held by one method only


def test_plots_draw_on_the_given_axes():
    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    assert plots.collision_matrix(SYNTH, ax=ax2) is fig
    comp = pd.DataFrame([{"policy": "a", "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 10}])
    assert plots.policy_tradeoff(comp, ax=ax1) is fig
    assert len(fig.axes) == 2 and ax2.get_title() == "constant decisions"


def test_policy_tradeoff_groups_policies_on_one_point():
    comp = pd.DataFrame(
        [
            {"policy": "no-sharing", "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 4096},
            {
                "policy": "name-only",
                "loaded": True,
                "wrong_methods": ["decode"],
                "not_runnable": [],
                "device_bytes": 2048,
            },
            {
                "policy": "decline",
                "loaded": True,
                "wrong_methods": "['decode']",
                "not_runnable": "[]",
                "device_bytes": 2048,
            },  # as read back from a CSV
            {"policy": "refuse", "loaded": False, "wrong_methods": [], "not_runnable": [], "device_bytes": 1024},
        ]
    )
    fig = plots.policy_tradeoff(comp, minimum=2048)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "name-only\ndecline" in texts
    assert "refuse\n(load refused)" in texts
    assert any(t.startswith("minimum 2 KiB") for t in texts)


def test_minimum_bytes_counts_content_once_and_mutated_buffers_per_method(built_sample):
    prog = built_sample("mutated_buffer")
    # proj.weight (16x16 fp32) once, prefill's mutated kv (4x16 fp32) privately, decode's
    # read-only kv once more (other uses may share it): 1024 + 256 + 256
    assert plots.minimum_device_bytes(prog) == 1024 + 256 + 256


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(16384) == "16 KiB"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3 GiB"


@pytest.fixture(scope="module")
def sessions(built_sample):
    prog = built_sample("total_collision")
    ss = {p: load_program(prog, p) for p in ("no-sharing", "name-only", "fingerprint")}
    yield ss
    for s in ss.values():
        s.close()


@pytest.mark.slow
def test_memory_by_policy_stacks_methods_against_the_minimum(sessions):
    fig = plots.memory_by_policy(sessions)
    ax = fig.axes[0]
    heights = [round(p.get_height()) for p in ax.patches]
    # bars are drawn method by method: prefill for 3 policies, then decode for 3 policies
    assert heights == [16384, 16384, 16384, 16384, 0, 16384]
    floor = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert floor and floor[0].get_ydata()[0] == 32768  # two distinct 64x64 float32 tables
    frame = memory_by_policy_frame(sessions.values())
    assert list(frame.columns) == ["policy", "method", "device_bytes", "loaded"] and len(frame) == 6
    # the same plot from the plain frame
    ax2 = plots.memory_by_policy(frame, minimum=32768).axes[0]
    assert [round(p.get_height()) for p in ax2.patches] == heights


@pytest.mark.slow
def test_event_timeline_and_matrix_of_a_session(sessions):
    s = sessions["name-only"]
    fig = plots.event_timeline(s)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["prefill", "decode"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "upload whole blob" in legend and "decided: shared (1)" in legend
    m = plots.collision_matrix(s, verification=s.verify())
    assert "\u2717 decode (wrong)" in [t.get_text() for t in m.axes[0].get_yticklabels()]
    assert m.axes[0].get_title() == "total_collision: name-only"


def test_plots_never_use_pyplot_or_write_files(tmp_path):
    code = """
import sys, pandas as pd
from toolkit import plots
d = pd.DataFrame([("a", "x", "x", "shared")], columns=["method", "name", "fqn", "decision"])
plots.figure_png(plots.collision_matrix(d))
c = pd.DataFrame([{"policy": "p", "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 1}])
plots.figure_png(plots.policy_tradeoff(c))
print("matplotlib.pyplot" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "False"
    assert list(tmp_path.iterdir()) == []


def test_import_toolkit_needs_neither_matplotlib_nor_ipywidgets():
    # plots and widgets import them lazily, inside the functions that draw or display
    code = (
        "import sys, toolkit, toolkit.reports.collision, toolkit.plots, toolkit.explorer; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'ipywidgets'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ plots that read at real sizes


def _drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _texts(fig):
    """Every visible, non-empty text of the figure: annotations, titles, axis and tick labels."""
    out = []
    for ax in fig.axes:
        cands = list(ax.texts) + [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        lo, hi = sorted(ax.get_xlim())
        cands += [t for t in ax.get_xticklabels() if lo - 1e-9 <= t.get_position()[0] <= hi + 1e-9]
        lo, hi = sorted(ax.get_ylim())
        cands += [t for t in ax.get_yticklabels() if lo - 1e-9 <= t.get_position()[1] <= hi + 1e-9]
        out += [t for t in cands if t.get_visible() and t.get_text().strip()]
    return out


def _overlaps(boxes):
    bad = []
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            (ta, a), (tb, b) = boxes[i], boxes[j]
            w, h = min(a.x1, b.x1) - max(a.x0, b.x0), min(a.y1, b.y1) - max(a.y0, b.y0)
            if w > 0.5 and h > 0.5:
                bad.append((ta, tb))
    return bad


def _check_tradeoff_figure(fig):
    r = _drawn(fig)
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in _texts(fig)]
    assert not _overlaps(boxes), _overlaps(boxes)
    fb = fig.bbox
    for ax in fig.axes:
        frame = ax.get_window_extent(r)
        for t in ax.texts:  # the point labels and the minimum marker's, inside the plot
            b = t.get_window_extent(r)
            assert frame.x0 - 1 <= b.x0 and b.x1 <= frame.x1 + 1 and frame.y0 - 1 <= b.y0 and b.y1 <= frame.y1 + 1, (
                t.get_text()
            )
        # and clear of every point marker
        for coll in ax.collections:
            for x, y in coll.get_offsets():
                cx, cy = ax.transData.transform((x, y))
                for t in ax.texts:
                    b = t.get_window_extent(r)
                    assert not (b.x0 + 1 < cx < b.x1 - 1 and b.y0 + 1 < cy < b.y1 - 1), (t.get_text(), x, y)
    for text, b in boxes:  # nothing cut at the figure's edges
        assert fb.x0 - 1 <= b.x0 and b.x1 <= fb.x1 + 1 and fb.y0 - 1 <= b.y0 and b.y1 <= fb.y1 + 1, text


@pytest.fixture(scope="module")
def every_sample_compared(built_sample):
    from toolkit import compare_policies
    from toolkit.build.samples import sample_names

    out = {}
    for name in sample_names():
        prog = built_sample(name)
        out[name] = (compare_policies(prog), plots.minimum_device_bytes(prog))
    return out


@pytest.mark.slow
def test_policy_tradeoff_labels_never_overlap_on_every_sample(every_sample_compared):
    for name, (comparison, floor) in every_sample_compared.items():
        _check_tradeoff_figure(plots.policy_tradeoff(comparison, minimum=floor, title=f"{name}: correctness vs memory"))
    # three side by side, as notebook 03 draws them: placed once the shared layout is final
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    for ax, name in zip(fig.subplots(1, 3), ["three_methods", "total_collision", "mutated_buffer"]):
        comparison, floor = every_sample_compared[name]
        plots.policy_tradeoff(comparison.frame, minimum=floor, ax=ax, title=name)
    _check_tradeoff_figure(fig)


def test_policy_tradeoff_crowded_points_keep_apart():
    """Points a hair apart (513.3 vs 512.3 KiB), many names, the minimum right between them."""
    names = [
        "no-sharing",
        "name-only",
        "refuse-on-mismatch",
        "decline-on-mismatch",
        "verify-always",
        "fingerprint",
        "content-dedup",
    ]
    comp = pd.DataFrame(
        [
            {"policy": names[0], "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 1_050_000},
            {
                "policy": names[1],
                "loaded": True,
                "wrong_methods": ["decode"],
                "not_runnable": [],
                "device_bytes": 525_000,
            },
            {"policy": names[2], "loaded": False, "wrong_methods": [], "not_runnable": [], "device_bytes": 524_800},
            {
                "policy": names[3],
                "loaded": True,
                "wrong_methods": ["decode"],
                "not_runnable": ["x"],
                "device_bytes": 525_300,
            },
            {"policy": names[4], "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 1_050_000},
            {"policy": names[5], "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 525_600},
            {"policy": names[6], "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 525_400},
        ]
    )
    _check_tradeoff_figure(plots.policy_tradeoff(comp, minimum=524_600))


def test_titles_wrap_instead_of_being_cut():
    frame = pd.DataFrame([{"policy": "fingerprint", "method": "prefill", "device_bytes": 525_000, "loaded": True}])
    long = "a_program_with_a_rather_long_name_indeed: device memory per method and policy"
    fig = plots.memory_by_policy(frame, minimum=524_000, title=long)
    r = _drawn(fig)
    title = fig.axes[0].title
    b, fb = title.get_window_extent(r), fig.bbox
    assert fb.x0 <= b.x0 and b.x1 <= fb.x1 and b.y1 <= fb.y1, (b, fb)
    assert title.get_wrap()


def _wide_decisions(n: int, methods=("encoder", "decoder")) -> pd.DataFrame:
    rows = []
    for m in methods:
        for i in range(n):
            fqn = f"model.layers.{i}.encoder_attn_layer_norm.weight"
            rows.append(
                {
                    "method": m,
                    "name": fqn.replace(".", "_"),
                    "fqn": fqn,
                    "decision": "loaded" if m == methods[0] else "shared",
                }
            )
    rows.append({"method": methods[0], "name": "only_here", "fqn": "only.here.in.the.encoder", "decision": "loaded"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("n", [1, 2, 3, 12, 30])
def test_collision_matrix_labels_are_not_cut(n):
    fig = plots.collision_matrix(_wide_decisions(n), wrong_methods=["decoder"])
    r = _drawn(fig)
    fb = fig.bbox
    ax = fig.axes[0]
    # neighbouring names never run into each other: level ones by their boxes, slanted ones
    # (parallel lines) by the distance between their baselines against the text's height
    labels = ax.get_xticklabels()
    angle = labels[0].get_rotation() if labels else 0
    if angle == 0:
        ticks = [(t.get_text(), t.get_window_extent(r)) for t in labels]
        assert not _overlaps(ticks), _overlaps(ticks)
    else:
        import math

        xs = [ax.transData.transform((x, 0))[0] for x in ax.get_xticks()]
        gap = min((b - a for a, b in zip(xs, xs[1:])), default=1e9) * math.sin(math.radians(angle))
        assert gap >= r.points_to_pixels(labels[0].get_fontsize()), (gap, angle)
    for t in ax.get_xticklabels() + ax.get_yticklabels() + [ax.title]:
        b = t.get_window_extent(r)
        assert fb.x0 - 1 <= b.x0 and b.x1 <= fb.x1 + 1 and fb.y0 - 1 <= b.y0 and b.y1 <= fb.y1 + 1, t.get_text()
    assert all("\u2026" not in t.get_text() for t in ax.get_xticklabels())  # whole names, not cut


def test_collision_matrix_keeps_only_colliding_names_when_large():
    big = _wide_decisions(45)
    ax = plots.collision_matrix(big).axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == 45 and "only.here.in.the.encoder" not in labels
    assert "45 of 46 names" in ax.get_title()
    ax = plots.collision_matrix(big, only_colliding=False).axes[0]
    assert len(ax.get_xticklabels()) == 46


def test_collision_matrix_marks_shared_cells_of_other_content():
    d = pd.DataFrame(
        [
            {
                "method": "encode",
                "name": "w",
                "fqn": "proj.weight",
                "decision": "loaded",
                "digest": "a" * 64,
                "cached_digest": "",
            },
            {
                "method": "probe",
                "name": "w",
                "fqn": "proj.weight",
                "decision": "shared",
                "digest": "b" * 64,
                "cached_digest": "a" * 64,
                "data_problem": "content differs",
            },
            {
                "method": "again",
                "name": "w",
                "fqn": "proj.weight",
                "decision": "shared",
                "digest": "a" * 64,
                "cached_digest": "a" * 64,
            },
        ]
    )
    assert plots.culprit_cells(d) == {("probe", "proj.weight")}
    ax = plots.collision_matrix(d).axes[0]
    faces = {(round(p.get_x()), round(p.get_y())): p.get_facecolor() for p in ax.patches if p.get_fill()}
    from matplotlib.colors import to_rgba

    assert faces[(0, 1)] == to_rgba(CULPRIT_FACE)  # probe: red
    assert faces[(0, 2)] == to_rgba(DECISION_COLOURS["shared"])  # again: an honest share, blue
    texts = {(t.get_position()[1]): t.get_text() for t in ax.texts}
    assert texts[1.5] == "S\u2717" and texts[2.5] == "S"
    assert "\u2717 runs on other data" in [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.slow
def test_event_timeline_decisions_are_thin_ticks_in_lanes(sessions):
    ax = plots.event_timeline(sessions["name-only"]).axes[0]
    ticks = [ln for ln in ax.get_lines() if ln.get_marker() == "|"]
    assert len(ticks) == 2  # loaded and shared, one line each
    lanes = {round(float(y) % 1, 3) for ln in ticks for y in ln.get_ydata()}
    assert len(lanes) == 2  # each kind in a lane of its own: markers of two kinds never sit on each other
    assert all(ln.get_markersize() <= 12 for ln in ticks)


# ------------------------------------------------------------------ names with $...$

EVIL = r"$\notacommand{x$"  # invalid mathtext: matplotlib raises when it parses it


def test_dollar_names_are_drawn_as_typed_everywhere():
    d = decisions([("m$1$", EVIL, EVIL, "loaded"), ("m$2$", EVIL, EVIL, "shared")])
    png = plots.figure_png(plots.collision_matrix(d, wrong_methods=["m$2$"], title=f"prog {EVIL}"))
    assert png.startswith(b"\x89PNG")
    ev = pd.DataFrame(
        [
            {"seq": 0, "time_s": 0.0, "kind": "load_started", "method": EVIL, "decision": None, "seconds": None},
            {"seq": 1, "time_s": 0.001, "kind": "decided", "method": EVIL, "decision": "loaded", "seconds": None},
            {"seq": 2, "time_s": 0.002, "kind": "method_loaded", "method": EVIL, "decision": None, "seconds": None},
        ]
    )
    assert plots.figure_png(plots.event_timeline(ev, title=EVIL)).startswith(b"\x89PNG")
    mem = pd.DataFrame([{"policy": "fingerprint", "method": EVIL, "device_bytes": 10, "loaded": True}])
    assert plots.figure_png(plots.memory_by_policy(mem, minimum=10, title=EVIL)).startswith(b"\x89PNG")
    comp = pd.DataFrame([{"policy": EVIL, "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 1}])
    assert plots.figure_png(plots.policy_tradeoff(comp, title=EVIL)).startswith(b"\x89PNG")
    assert plots.plain_text("a $b$ c") == r"a \$b\$ c"


def test_dollar_text_is_shown_literally():
    fig = plots.collision_matrix(decisions([("m", "$x$", "$x$", "loaded")]), title="$x$")
    r = _drawn(fig)
    ax = fig.axes[0]
    label = ax.get_xticklabels()[0]
    # drawn as the four characters "$x$", not as a typeset italic x
    assert label._get_layout(r)[1][0][0] == "$x$" or not label._preprocess_math(label.get_text())[1]
    assert not ax.title._preprocess_math(ax.title.get_text())[1]


def test_plots_of_a_real_dollar_named_program(built_sample, tmp_path):
    """A program whose name holds ``$...$`` (the manifest is untrusted): every plot of its session."""
    import dataclasses

    prog = dataclasses.replace(built_sample("total_collision"), name=EVIL)
    s = load_program(prog, "name-only")
    try:
        for fig in (
            plots.collision_matrix(s, verification=s.verify()),
            plots.event_timeline(s),
            plots.memory_by_policy(s),
        ):
            assert plots.figure_png(fig).startswith(b"\x89PNG")
    finally:
        s.close()


def test_collision_matrix_of_thousands_of_names_is_capped_culprits_first():
    import time

    rows = []
    for i in range(3000):
        rows.append(
            {
                "method": "a",
                "name": f"c{i}",
                "fqn": f"c{i}",
                "decision": "loaded",
                "digest": "a" * 64,
                "cached_digest": "",
            }
        )
        bad = i % 97 == 5
        rows.append(
            {
                "method": "b",
                "name": f"c{i}",
                "fqn": f"c{i}",
                "decision": "shared",
                "digest": ("b" if bad else "a") * 64,
                "cached_digest": "a" * 64,
                "data_problem": "content differs" if bad else "",
            }
        )
    d = pd.DataFrame(rows)
    t0 = time.perf_counter()
    fig = plots.collision_matrix(d)
    plots.figure_png(fig)
    assert time.perf_counter() - t0 < 30
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]  # a long matrix: a row per name (no groups here)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]  # a column per method
    culprits = [f"c{i}" for i in range(3000) if i % 97 == 5]
    assert len(labels) == MAX_MATRIX_COLUMNS and set(culprits) <= set(labels)
    assert labels == sorted(labels, key=lambda k: int(k[1:]))  # load order kept
    assert "120 of 3,000 names: the culprits first" in ax.get_title()


# ------------------------------------------------------------------ the interactive matrix


def _plotly():
    return require("plotly", extra="notebook")


def _content_rows(n_names: int, bad_every: int = 0) -> pd.DataFrame:
    rows = []
    for i in range(n_names):
        rows.append(
            {
                "method": "encoder",
                "name": f"c{i}",
                "fqn": f"layers.{i}.w",
                "decision": "loaded",
                "reason_code": "first_seen",
                "reason": "first time this name is seen",
                "digest": "a" * 64,
                "cached_digest": "",
            }
        )
        bad = bool(bad_every) and i % bad_every == 1
        rows.append(
            {
                "method": "decoder",
                "name": f"c{i}",
                "fqn": f"layers.{i}.w",
                "decision": "shared",
                "reason_code": "name_hit_unchecked",
                "reason": "the name is in the cache: shared unchecked",
                "digest": ("b" if bad else "a") * 64,
                "cached_digest": "a" * 64,
                "data_problem": "content differs" if bad else "",
            }
        )
    rows.append(
        {
            "method": "encoder",
            "name": "solo",
            "fqn": "only.in.the.encoder",
            "decision": "loaded",
            "reason_code": "first_seen",
            "reason": "first time",
            "digest": "c" * 64,
            "cached_digest": "",
        }
    )
    return pd.DataFrame(rows)


def test_interactive_matrix_hover_gives_decision_and_reason():
    _plotly()
    d = _content_rows(3, bad_every=2)
    fig = plots.interactive_collision_matrix(d, wrong_methods=["decoder"])
    heat = fig.data[0]
    assert list(heat.y) == ["encoder", "decoder"] and list(heat.x) == [
        "layers.0.w",
        "layers.1.w",
        "layers.2.w",
        "only.in.the.encoder",
    ]
    hover = heat.customdata
    assert "decision: <b>loaded</b>" in hover[0][0] and "reason: <b>first_seen</b>" in hover[0][0]
    assert "first time this name is seen" in hover[0][0]
    assert "decision: <b>shared</b> \u2717 <b>content differs</b>" in hover[1][1]  # c1: the culprit
    assert "same content as the cached tensor: <b>NO</b>" in hover[1][1]
    assert "content differs" not in hover[1][0] and "same content as the cached tensor: yes" in hover[1][0]
    assert "has no constant of this name" in hover[1][3]  # the decoder has no only.in.the.encoder
    assert "output is WRONG" in hover[1][0]
    assert heat.hovertemplate == "%{customdata}<extra></extra>"


def test_interactive_matrix_marks_culprits_red_like_the_png():
    _plotly()
    d = _content_rows(3, bad_every=2)
    fig = plots.interactive_collision_matrix(d, wrong_methods=["decoder"])
    heat = fig.data[0]
    # the colour of a cell: its category's band of the discrete colour scale
    scale = [c for _pos, c in heat.colorscale]
    colour = [[scale[2 * int(v)] for v in row] for row in heat.z]
    assert colour[1][1] == CULPRIT_FACE and colour[1][0] == DECISION_COLOURS["shared"]
    assert colour[0][0] == DECISION_COLOURS["loaded"] and colour[1][3] == "#ffffff"
    assert heat.text[1][1] == "S\u2717" and heat.text[1][0] == "S"
    # the PNG's culprits are the same cells
    assert plots.culprit_cells(d) == {("decoder", "layers.1.w")}
    assert "\u2717 runs on other data" in [t.name for t in fig.data[1:]]  # in the legend
    ticks = fig.layout.yaxis.ticktext
    assert "wrong" in ticks[1] and WRONG_MARK in ticks[1] and "wrong" not in ticks[0]
    assert any(s.line.color == WRONG_MARK for s in fig.layout.shapes)  # the wrong row outlined


def test_interactive_matrix_large_programs_show_only_the_colliding_names():
    _plotly()
    big = _content_rows(60)  # 61 names, 60 of them in both methods
    fig = plots.interactive_collision_matrix(big)
    assert len(fig.data[0].x) == 60 and "only.in.the.encoder" not in fig.data[0].x
    assert "60 of 61 names" in fig.layout.title.text
    assert len(plots.interactive_collision_matrix(big, only_colliding=False).data[0].x) == 61
    # the same selection as the matplotlib matrix
    png_labels = [t.get_text() for t in plots.collision_matrix(big).axes[0].get_xticklabels()]
    assert png_labels == list(fig.data[0].x)


def test_interactive_matrix_of_thousands_of_names_is_capped_culprits_first():
    _plotly()
    import time

    t0 = time.perf_counter()
    fig = plots.interactive_collision_matrix(_content_rows(5000, bad_every=97))
    bundle = plots.plotly_bundle(fig)
    elapsed = time.perf_counter() - t0
    assert elapsed < 20, elapsed
    heat = fig.data[0]
    assert heat.meta["long"] and list(heat.x) == ["encoder", "decoder"]  # long: a column per method
    shown = [j for j in heat.meta["rows"] if j >= 0]
    assert len(shown) == MAX_MATRIX_COLUMNS
    # a layer a name, one stem: nothing to group, each row its whole name
    assert len(fig.layout.yaxis.ticktext) == len(shown) and all(j >= 0 for j in heat.meta["rows"])
    assert {f"layers.{i}.w" for i in range(5000) if i % 97 == 1} <= set(fig.layout.yaxis.ticktext)
    assert fig.layout.width <= MAX_PLOTLY_WIDTH <= 1000  # fits a notebook's output area
    import json

    json.dumps(bundle)  # plain JSON: what the Output widget sends


def test_interactive_matrix_shows_names_as_typed():
    _plotly()
    d = decisions([("m<b>", "<i>x</i>", "$x$", "loaded"), ("m2", "<i>x</i>", "$x$", "shared")])
    fig = plots.interactive_collision_matrix(d, title="<script>alert(1)</script>")
    assert "<script>" not in fig.layout.title.text and "&lt;script&gt;" in fig.layout.title.text
    assert fig.data[0].customdata[0][0].startswith("<b>m&lt;b&gt; / ")
    assert "&lt;i&gt;x&lt;/i&gt;" in fig.data[0].customdata[0][0]
    assert not fig.data[0].x[0].startswith("$")  # a label between dollars would be typeset
    assert plots.plotly_text("$x$") == "\u200b$x$"


@pytest.mark.slow
def test_interactive_matrix_of_a_session(sessions):
    _plotly()
    s = sessions["name-only"]
    fig = plots.interactive_collision_matrix(s, verification=s.verify())
    assert s.program.name in fig.layout.title.text and "name-only" in fig.layout.title.text
    assert "reason: <b>name_hit_unchecked</b>" in fig.data[0].customdata[1][0]


# ------------------------------------------------------------------ readable matrices, honest timelines


def _layered_rows(
    layers: int,
    weights=(
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "post_attention_layernorm.weight",
    ),
) -> pd.DataFrame:
    rows = []
    for method, decision in (("prefill", "loaded"), ("decode", "shared")):
        for i in range(layers):
            for w in weights:
                rows.append(
                    {
                        "method": method,
                        "name": f"model_layers_{i}_{w.replace('.', '_')}",
                        "fqn": f"model.layers.{i}.{w}",
                        "decision": decision,
                        "reason_code": "x",
                        "reason": "y",
                    }
                )
    return pd.DataFrame(rows)


def test_interactive_matrix_groups_long_matrices_by_layer():
    _plotly()
    fig = plots.interactive_collision_matrix(_layered_rows(9), only_colliding=False)  # 45 names
    heat = fig.data[0]
    groups, labels = heat.x
    assert fig.layout.xaxis.type == "multicategory" and len(labels) == 45
    assert list(dict.fromkeys(groups)) == [f"model.layers.{i}" for i in range(9)]  # each layer once, in order
    assert all(not x.startswith("model.layers") and "\u2026" not in x for x in labels)  # readable, not cut
    assert max(len(x) for x in labels) <= len("post_attention_layernorm.weight")
    # a click on a cell names its constant: the internal name of that (method, column)
    j = labels.index("mlp.up_proj.weight", 5 * 3)
    assert heat.meta["names"][1][j] == "model_layers_3_mlp_up_proj_weight" and heat.meta["methods"][1] == "decode"
    assert layer_groups([f"layers.{i}.w" for i in range(30)]) is None  # one name a layer: nothing to group
    small = plots.interactive_collision_matrix(_layered_rows(2), only_colliding=False)  # 10 names: no grouping
    assert small.layout.xaxis.type == "category"


def test_interactive_matrix_of_one_column_keeps_the_hover_beside_it_and_the_title_off_the_toolbar():
    _plotly()
    one = decisions([("prefill", "_tensor_constant0", "", "loaded"), ("decode", "_tensor_constant0", "", "shared")])
    fig = plots.interactive_collision_matrix(one, title="a title long enough to run under the toolbar " * 4)
    assert fig.layout.margin.r >= HOVER_ROOM  # room for the hover label right of the one column
    assert fig.layout.width <= MAX_PLOTLY_WIDTH
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) > 1 and max(len(x) for x in lines) * 7 <= fig.layout.width - 40 - MODEBAR_WIDTH
    wide = plots.interactive_collision_matrix(_content_rows(60), only_colliding=False)  # 61 columns: wide
    assert wide.layout.margin.r < HOVER_ROOM  # a full-width matrix keeps its width for cells


def _timeline_events(seconds: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"kind": "load_started", "method": "m", "time_s": 0.0, "seconds": None, "decision": None},
            {"kind": "blob_uploaded", "method": "m", "time_s": 0.101, "seconds": seconds, "decision": None},
            {"kind": "decided", "method": "m", "time_s": 0.5, "seconds": None, "decision": "loaded"},
            {"kind": "method_loaded", "method": "m", "time_s": 2.0, "seconds": None, "decision": None},
        ]
    )


def test_event_timeline_draws_short_steps_visibly_and_says_when_it_is_a_prediction():
    from matplotlib.collections import PolyCollection

    ax = plots.event_timeline(_timeline_events(0.001)).axes[0]
    assert ax.get_xlabel() == "time since the load began (s)"
    blob = [c for c in ax.collections if isinstance(c, PolyCollection)][1]  # the method bar, then the upload
    x0, x1 = blob.get_paths()[0].vertices[:, 0].min(), blob.get_paths()[0].vertices[:, 0].max()
    assert x1 - x0 >= 2.0 * MIN_SPAN_FRACTION * 0.99  # 1 ms of 2 s: drawn wide enough to see
    ticks = [ln for ln in ax.get_lines() if ln.get_marker() == "|"]
    assert ticks and all(ln.get_markeredgewidth() >= TICK_WIDTH for ln in ticks)
    dry = plots.event_timeline(_timeline_events(0.001), predicted=True).axes[0]
    assert "dry run" in dry.get_xlabel() and "nothing was loaded" in dry.get_xlabel()
    assert "since the load began" not in dry.get_xlabel()


# ------------------------------------------------------------------ long matrices grouped


def test_matrix_groups_fqns_by_layer_else_by_the_layers_stem():
    keys = [f"model.layers.{i}.{w}" for i in range(3) for w in ("mlp.up.weight", "self_attn.q_proj.weight")]
    keys += ["model.embed_tokens.weight", "lm_head.weight"]
    order, groups, leaves = matrix_groups(keys)
    assert list(dict.fromkeys(groups)) == ["model.layers.0", "model.layers.1", "model.layers.2", "other"]
    assert leaves[:2] == ["mlp.up.weight", "self_attn.q_proj.weight"] and sorted(order) == list(range(len(keys)))
    assert [keys[j] for j in order][-2:] == ["model.embed_tokens.weight", "lm_head.weight"]
    # a layer a name (or nearly): by layer would not group; by the stem, every layer together
    many = [f"model.layers.{i}.mlp.weight" for i in range(40)] + [f"_tensor_constant{i}" for i in range(5)]
    assert layer_groups(many) is None
    order, groups, leaves = matrix_groups(many)
    assert list(dict.fromkeys(groups)) == ["model.layers.<i>", "_tensor_constant<i>"]
    assert leaves[0] == "0.mlp.weight" and leaves[-1] == "_tensor_constant4"  # a name ending in its number: whole
    assert matrix_groups([f"w{i}" for i in range(30)]) is None  # one stem: nothing to group
    rows = long_rows(many)
    assert rows[0] == ("model.layers.<i>", None) and rows[1] == ("0.mlp.weight", 0)
    assert rows[41] == ("_tensor_constant<i>", None) and len(rows) == len(many) + 2


def _llm_rows(layers: int = 40) -> pd.DataFrame:
    """Two methods of an LLM-like program: 3 weights a layer, decode sharing each, every 7th a culprit."""
    rows = []
    for i in range(layers):
        for w in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight"):
            fqn = f"model.layers.{i}.{w}"
            bad = (i * 3 + len(w)) % 7 == 0
            rows.append(
                {
                    "method": "prefill",
                    "name": fqn.replace(".", "_"),
                    "fqn": fqn,
                    "decision": "loaded",
                    "reason_code": "first_seen",
                    "reason": "first",
                    "data_problem": "",
                }
            )
            rows.append(
                {
                    "method": "decode",
                    "name": fqn.replace(".", "_"),
                    "fqn": fqn,
                    "decision": "shared",
                    "reason_code": "name_hit_unchecked",
                    "reason": "shared unchecked",
                    "data_problem": "content differs" if bad else "",
                }
            )
    return pd.DataFrame(rows)


def test_a_long_matplotlib_matrix_is_a_row_per_name_grouped_with_labels_that_do_not_overlap():
    d = _llm_rows(40)  # 120 names, 3 in each of 40 layers: grouped by layer, a header each
    fig = plots.collision_matrix(d, wrong_methods=["decode"])
    r = _drawn(fig)
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert len(rows) == 120 + 40 and rows[:2] == ["model.layers.0", "self_attn.q_proj.weight"]
    assert rows[-4:] == [
        "model.layers.39",
        "self_attn.q_proj.weight",
        "mlp.down_proj.weight",
        "post_attention_layernorm.weight",
    ]
    assert [t.get_fontweight() for t in ax.get_yticklabels()][:2] == ["bold", "normal"]
    assert all(t.get_fontsize() >= LONG_LABEL_PT for t in ax.get_yticklabels())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["prefill", "\u2717 decode (wrong)"]
    assert all("\u2026" not in t for t in rows)  # whole, not cut
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in ax.get_yticklabels() + ax.get_xticklabels()]
    assert not _overlaps(boxes), _overlaps(boxes)
    fb = fig.bbox
    for t in ax.get_xticklabels() + ax.get_yticklabels() + [ax.title]:
        b = t.get_window_extent(r)
        assert fb.x0 - 1 <= b.x0 and b.x1 <= fb.x1 + 1 and fb.y0 - 1 <= b.y0 and b.y1 <= fb.y1 + 1, t.get_text()
    # every cell keeps its letter; culprits marked
    letters = [t.get_text() for t in ax.texts]
    assert letters.count("L") == 120 and letters.count("S\u2717") == int(culprit_mask(d).sum())
    # 12 layers (36 names, wide, under 64): by layer, one column each
    assert len(plots.collision_matrix(_llm_rows(12)).axes[0].get_xticklabels()) == 36


def test_a_long_plotly_matrix_is_a_row_per_name_grouped_and_a_click_names_its_constant():
    _plotly()
    d = _llm_rows(40)
    fig = plots.interactive_collision_matrix(d, wrong_methods=["decode"])
    heat = fig.data[0]
    assert heat.meta["long"] and list(heat.x) == ["prefill", "decode"]
    ticks = list(fig.layout.yaxis.ticktext)
    assert len(ticks) == len(heat.z) == 160 and ticks[:2] == ["<b>model.layers.0</b>", "self_attn.q_proj.weight"]
    assert fig.layout.yaxis.tickfont.size >= 10 and fig.layout.height >= 160 * LONG_ROW_PX
    assert heat.z[0] == (None, None) or list(heat.z[0]) == [None, None]  # the header: a gap, no hover
    assert heat.meta["rows"][:5] == [-1, 0, 1, 2, -1]
    j = heat.meta["rows"][5]
    assert heat.meta["names"][1][j] == d[d["method"] == "decode"]["name"].tolist()[j]
    assert "\u2717 decode (wrong)" in fig.layout.xaxis.ticktext[1]
    assert fig.layout.width <= MAX_PLOTLY_WIDTH


def test_names_that_differ_only_in_hidden_characters_are_drawn_apart():
    """A zero-width space, a bidi control or a line break in a name is drawn as an escape, in the static
    and the interactive figures alike, so two constants that look the same are told apart."""
    from toolkit.plots.figure import plain_text
    from toolkit.plots.interactive import plotly_text

    for hidden in ("\u200b", "\u202e", "\n", "\x1b"):
        name = f"layer{hidden}.weight"
        for draw in (plain_text, plotly_text):
            assert draw(name) != draw("layer.weight"), (draw.__name__, repr(hidden))
            assert hidden not in draw(name), (draw.__name__, repr(hidden))
    assert plain_text("layer.weight") == "layer.weight" and plotly_text("layer.weight") == "layer.weight"
