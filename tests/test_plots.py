"""Plots: each returns a Figure, draws on a given ax, never touches pyplot or the disk."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from conftest import require

require("matplotlib", extra="plots")

from matplotlib.figure import Figure  # noqa: E402

from toolkit import load_program  # noqa: E402
from toolkit import plots  # noqa: E402


def decisions(rows):
    return pd.DataFrame(rows, columns=["method", "name", "fqn", "decision"])


SYNTH = decisions([
    ("prefill", "_tensor_constant0", "_tensor_constant0", "loaded"),
    ("prefill", "w", "layers.0.w", "loaded"),
    ("decode", "_tensor_constant0", "_tensor_constant0", "shared"),
    ("decode", "b", "", "private"),
    ("decode", "w", "layers.0.w", "declined"),
])


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
    assert "\u2717 decode (wrong)" in labels and labels["\u2717 decode (wrong)"] == plots.WRONG_COLOUR
    assert labels["prefill"] != plots.WRONG_COLOUR
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
    comp = pd.DataFrame([
        {"policy": "no-sharing", "loaded": True, "wrong_methods": [], "not_runnable": [], "device_bytes": 4096},
        {"policy": "name-only", "loaded": True, "wrong_methods": ["decode"], "not_runnable": [], "device_bytes": 2048},
        {"policy": "decline", "loaded": True, "wrong_methods": "['decode']", "not_runnable": "[]",
         "device_bytes": 2048},  # as read back from a CSV
        {"policy": "refuse", "loaded": False, "wrong_methods": [], "not_runnable": [], "device_bytes": 1024},
    ])
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
    assert plots.format_bytes(0) == "0 B"
    assert plots.format_bytes(16384) == "16 KiB"
    assert plots.format_bytes(1536) == "1.5 KiB"
    assert plots.format_bytes(3 * 1024 ** 3) == "3 GiB"


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
    frame = plots.memory_frame(sessions)
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
    assert "upload whole blob" in legend and "decided: shared" in legend
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
    code = ("import sys, toolkit, toolkit.report, toolkit.plots, toolkit.widgets; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'ipywidgets'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
