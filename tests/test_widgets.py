"""The explorer: its state and callbacks in plain pytest, and the ipywidgets view without a kernel."""

from __future__ import annotations

import html
import threading
from pathlib import Path

import pandas as pd
import pytest
from conftest import require

from toolkit.core.policies import POLICIES
from toolkit.explorer import ALL, ExplorerState, grid_frame, safe_file_name
from toolkit.reports.collision import read_report

pytestmark = pytest.mark.slow  # every test here loads a (cached) sample program


@pytest.fixture
def state(built_sample, tmp_path):
    prog = built_sample("total_collision")
    # build= returns the session's program: no compile, whatever sample is chosen
    st = ExplorerState(sample="total_collision", policy="name-only", build=lambda name, **kw: prog, export_dir=tmp_path)
    heard: list[str] = []
    st.observe(lambda change: heard.append(change["name"]))
    st.heard = heard
    yield st
    st.close()


def test_load_fills_session_verification_report_and_progress(state):
    assert state.load() is True
    assert state.error is None and not state.busy
    assert state.session.status == "loaded" and state.progress == 1.0 and state.phase == "done"
    assert state.report.wrong_methods == ["decode"] and state.verdict.wrong_methods == ["decode"]
    assert state.message == state.verdict.headline() and "wrong: decode" in state.message
    assert state.verification["ok"].tolist() == [True, False]
    for what in ("busy", "progress", "message", "session", "verdict", "rows", "selected"):
        assert what in state.heard
    # progress only moves forward during one action
    assert state.selected == ("decode", "_tensor_constant0")  # the first collision is preselected
    figs = state.figures()
    assert set(figs) == {"collision matrix", "timeline", "memory"}


def test_filters_and_their_options(state):
    state.load()
    assert state.filter_options() == {
        "method": ["prefill", "decode"],
        "decision": ["loaded", "shared"],
        "reason": ["first_seen", "name_hit_unchecked"],
    }
    assert not state.filtered and state.total_decisions == 2
    state.set_filters(decision="loaded")
    rows = state.rows
    assert rows["decision"].astype(str).tolist() == ["loaded"] and state.filtered
    assert state.selected == ("prefill", "_tensor_constant0")  # the selection follows the filter
    state.set_filters(decision=ALL, method="decode")
    assert state.rows["method"].tolist() == ["decode"]
    state.set_filters(reason="first_seen")
    assert len(state.rows) == 0 and state.selected is None
    with pytest.raises(ValueError, match="no decision 'refused'"):
        state.set_filters(decision="refused")


def test_selected_constant_field_by_field_comparison(state):
    state.set(policy="fingerprint")
    assert state.load()
    state.select("decode", "_tensor_constant0")
    d = state.selected_decision()
    assert d["decision"] == "declined" and d["reason_code"] == "content_mismatch"
    comp = state.selected_comparison()
    assert list(comp.columns) == ["field", "cached", "new", "equal"]
    eq = dict(zip(comp["field"], comp["equal"]))
    assert eq["dtype"] and eq["sizes"] and eq["strides"] and not eq["digest"]  # equal metadata, other data
    state.select("prefill", "_tensor_constant0")
    assert len(state.selected_comparison()) == 0  # a miss: nothing to compare
    with pytest.raises(ValueError):
        state.select("decode", "nope")


def test_inputs_are_validated(state):
    with pytest.raises(TypeError, match="unknown explorer input 'colour'"):
        state.set(colour="red")
    with pytest.raises(ValueError, match="unknown policy"):
        state.set(policy="share-everything")
    with pytest.raises(ValueError, match="unknown sample"):
        state.set(sample="nope")
    with pytest.raises(ValueError, match="unknown program_from"):
        state.set(program_from="url")
    with pytest.raises(ValueError, match="unknown policy"):
        state.policy = "nope"  # a trait set directly is validated too
    state.set(policy="verify-always", device="cpu")
    assert state.policy == "verify-always" and "#21706" in state.policy_summary


def test_errors_are_recorded_not_raised(state, tmp_path):
    assert state.load()
    first = state.session
    state.set(program_from="path", path=str(tmp_path / "missing"))
    assert state.load() is False
    assert state.error.startswith("could not open the program") and "does not exist" in state.error
    # a user's mistake (a ToolkitError): its message once, no traceback; the status line says what failed
    assert state.error_detail == "" and "error" in state.heard and state.outcome == "failed"
    assert state.message == "could not open the program (see below)"
    assert state.session is first  # the previous results stay
    state.set(path="  ")
    assert state.load() is False and "enter the path" in state.error
    state.set(program_from="sample")
    assert state.load() is True and state.error is None


def test_a_crashing_loader_becomes_a_message(built_sample):
    prog = built_sample("total_collision")

    def boom(*a, **k):
        raise RuntimeError("segfault avoided\nsecond line")

    st = ExplorerState(build=lambda name, **kw: prog, load=boom)
    assert st.load() is False
    assert st.error == "could not load the program: RuntimeError: segfault avoided"
    assert "Traceback" in st.error_detail and "segfault avoided" in st.error_detail  # unexpected: the traceback kept
    assert st.session is None and not st.busy


def test_a_second_action_while_busy_is_refused(built_sample):
    prog = built_sample("total_collision")
    gate, entered = threading.Event(), threading.Event()

    def slow_build(name, **kw):
        entered.set()
        gate.wait(30)
        return prog

    st = ExplorerState(build=slow_build)
    t = threading.Thread(target=st.load)
    t.start()
    assert entered.wait(30)
    assert st.busy and st.load() is False and st.compare() is False
    gate.set()
    t.join(60)
    assert not st.busy and st.session is not None
    st.close()


def test_export_csv_round_trips(state, tmp_path):
    assert state.export_csv(tmp_path / "r.csv") is False and "load a program first" in state.error
    state.load()
    target = tmp_path / "r.csv"
    assert state.export_csv(target) is True and state.exported == target
    pd.testing.assert_frame_equal(read_report(target).frame, state.report.frame)
    assert state.export_csv(tmp_path / "no" / "such" / "dir.csv") is False
    assert "does not exist" in state.error
    assert state.default_export_name() == "total_collision-name-only-collisions.csv"
    assert state.default_export_path() == str(state.export_dir / "total_collision-name-only-collisions.csv")


def test_compare_all_policies(state):
    state.load()
    assert state.compare() is True
    c = state.comparison.frame
    assert len(c) == len(POLICIES) and set(c["policy"]) >= {"fingerprint", "name-only"}
    assert c.set_index("policy").loc["name-only", "wrong_methods"] == ["decode"]
    outcome = state.comparison.verdicts()["name-only"].outcome
    assert c.set_index("policy").loc["name-only", "outcome"] == "wrong" == outcome
    assert "wrong under" in state.message and "name-only" in state.message.split("wrong under")[1]
    assert set(state.comparison.memory()["policy"]) == set(c["policy"])
    figs = state.figures()
    assert {"policy trade-off", "memory by policy"} <= set(figs)


def test_compare_loads_each_policy_once(state, monkeypatch):
    """The comparison frame, the memory per method, the sessions and their verdicts come from one
    load and one verification per policy."""
    from toolkit.engine import verification
    from toolkit.engine.session import Session

    state.load()
    loads, verifies = [], []
    real_load, real_verify = Session.load, verification.verify_session

    def counting_load(self, *a, **kw):
        loads.append(self.policy.name.value)
        return real_load(self, *a, **kw)

    def counting_verify(session, *a, **kw):
        verifies.append(session.policy.name.value)
        return real_verify(session, *a, **kw)

    monkeypatch.setattr(Session, "load", counting_load)
    monkeypatch.setattr(verification, "verify_session", counting_verify)
    assert state.compare() is True
    assert sorted(loads) == sorted(state.comparison.frame["policy"]) and len(loads) == len(POLICIES)
    assert sorted(verifies) == sorted(loads)
    assert set(state.comparison.sessions) == set(loads)
    # the kept sessions are closed (no device memory held) and still answer
    s = state.comparison.session("name-only")
    assert not s.methods and len(s.decisions) == 2
    mem = state.comparison.memory().set_index(["policy", "method"])["device_bytes"]
    assert mem.loc[("no-sharing", "decode")] == 16384 and mem.loc[("name-only", "decode")] == 0


# ------------------------------------------------------------------ the ipywidgets view


def _matrix_figure(ex) -> dict:
    """The plotly figure the Overview shows (its FigureWidget's figure, as a dict)."""
    (fig,) = ex.matrix.children
    return fig.to_dict()


def _grid_text(ex) -> str:
    """Every cell of the Decisions grid (itables' frame of HTML cells), one string."""
    return " ".join(ex.grid.df.astype(str).to_numpy().ravel().tolist())


@pytest.fixture
def explorer(built_sample, tmp_path):
    require("ipywidgets", extra="notebook")
    require("itables", extra="notebook")
    from toolkit.explorer import Explorer

    prog = built_sample("total_collision")
    ex = Explorer(
        ExplorerState(sample="total_collision", build=lambda name, **kw: prog, export_dir=tmp_path), background=False
    )
    yield ex
    ex.close()


def test_the_policy_dropdown_names_each_policy_with_its_executorch_releases(explorer):
    from toolkit.core.policies import POLICIES
    from toolkit.core.policies.releases import executorch_releases

    labels = {value: label for label, value in explorer.policy.options}
    assert list(labels) == list(POLICIES)
    for policy, label in labels.items():
        assert label.startswith(policy + " · ") and label.endswith(executorch_releases(policy))
    assert "ExecuTorch 1.5.x" in labels["fqn-weight-cache"] and labels["fingerprint"].endswith("ours")


def test_view_load_renders_table_plots_and_summary(explorer):
    ex = explorer
    ex.policy.value = "name-only"
    assert ex.state.policy == "name-only" and "name-only" in ex.policy_info.value
    ex.load_button.click()
    assert ex.state.error is None
    cells = _grid_text(ex)
    assert "_tensor_constant0" in cells and ">shared \u2717<" in cells  # decode's share: the culprit
    # the one count, in the grid's info line (after the grid's own search too)
    assert ex.grid._dt_args["language"]["info"] == "rows _START_-_END_ · _TOTAL_ of 2 decisions"
    assert ex.grid._dt_args["language"]["infoFiltered"] == "(filtered)"  # after a space, when the grid is searched
    assert ">wrong<" in ex.verification.value and ex.state.verdict.headline() in ex.summary.value.replace("&#x27;", "'")
    assert _matrix_figure(ex)["data"][0]["type"] == "heatmap" and bytes(ex.timeline.value).startswith(b"\x89PNG")
    assert "data:image/png;base64," in ex.matrix_png.value  # the matplotlib matrix, for PNG export
    assert "wrong: decode" in ex.status.value and ex.progress.value == 1.0
    assert ex.constant.value == ("decode", "_tensor_constant0")
    assert "cached vs new" in ex.constant_detail.value
    assert not ex.load_button.disabled and ex.load_button.description == "Load"


def test_view_filters_and_selection(explorer):
    ex = explorer
    ex.load_button.click()
    ex.filter_decision.value = "loaded"
    assert ex.state.filter_decision == "loaded"
    language = ex.grid._dt_args["language"]
    assert language["info"] == "rows _START_-_END_ · _TOTAL_ of 2 decisions (filtered)"
    assert language["infoFiltered"] == ""  # "(filtered)" once, whether the grid's search narrows it more or not
    assert len(ex.grid.df) == 1
    assert [v for _l, v in ex.constant.options] == [("prefill", "_tensor_constant0")]
    ex.filter_decision.value = ALL
    ex.constant.value = ("decode", "_tensor_constant0")
    assert ex.state.selected == ("decode", "_tensor_constant0")
    assert "digest" in ex.constant_detail.value and "NO" in ex.constant_detail.value  # fingerprint: digests differ


def test_view_shows_errors_in_the_widget(explorer, tmp_path):
    ex = explorer
    ex.program_from.value = "path"
    assert ex.path.layout.display is None and ex.sample.layout.display == "none"
    ex.path.value = str(tmp_path / "nope")
    ex.load_button.click()  # must not raise
    assert ex.error.layout.display is None
    assert "could not open the program" in ex.error.value and "<details>" not in ex.error.value  # no traceback
    assert "could not open the program (see below)" in ex.status.value and "does not exist" not in ex.status.value
    assert ex.progress.bar_style == "danger"
    ex.program_from.value = "sample"
    ex.load_button.click()
    assert ex.error.layout.display == "none"


def test_view_export(explorer, tmp_path):
    ex = explorer
    ex.load_button.click()
    ex.export_path.value = str(tmp_path / "out.csv")
    ex.export_button.click()
    assert (tmp_path / "out.csv").is_file()
    assert "download" in ex.export_result.value and "data:text/csv;base64," in ex.export_result.value


def test_view_background_action_and_progress(explorer):
    ex = explorer
    ex.background = True
    ex.load_button.click()
    ex.wait(120)
    assert ex.state.session is not None and "_tensor_constant0" in _grid_text(ex)
    assert not ex.load_button.disabled


def test_view_compare_renders_tradeoff(explorer):
    ex = explorer
    ex.load_button.click()
    ex.compare_button.click()
    assert bytes(ex.tradeoff.value).startswith(b"\x89PNG")
    assert bytes(ex.memory_policies.value).startswith(b"\x89PNG")
    assert "verify-always" in ex.comparison.value
    assert ">outcome<" in ex.comparison.value and ">wrong<" in ex.comparison.value  # each policy's verdict


def test_view_close_leaves_no_widgets(built_sample):
    ipywidgets = require("ipywidgets", extra="notebook")
    from ipywidgets.widgets.widget import _instances

    from toolkit.explorer import Explorer

    prog = built_sample("total_collision")
    before = set(_instances)
    ex = Explorer(ExplorerState(build=lambda name, **kw: prog), background=False)
    assert len(set(_instances) - before) > 20
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    ex.close()
    assert set(_instances) - before == set()
    assert isinstance(ex.widget, ipywidgets.VBox)


# ------------------------------------------------------------------ issue 12: the culprit, honest state


def test_decisions_say_whether_content_differs(state):
    assert state.load()
    rows = state.rows
    assert "same_content" in rows.columns
    same = dict(zip(rows["method"], rows["same_content"]))
    assert pd.isna(same["prefill"]) and same["decode"] == False  # noqa: E712 (no entry / other bytes)
    assert state.selected == ("decode", "_tensor_constant0")  # the culprit is where the view starts
    kind, sentence = state.content_verdict()  # the verdict's finding, confirmed by blame
    assert kind == "culprit" and sentence.startswith("content differs: decode runs on prefill/_tensor_constant0")
    assert sentence.endswith("blame: culprit: breaks standalone")
    state.select("prefill", "_tensor_constant0")
    assert state.content_verdict()[0] == "none"
    state.set(policy="fingerprint")
    assert state.load()
    state.select("decode", "_tensor_constant0")
    kind, sentence = state.content_verdict()
    assert kind == "caught" and "declined" in sentence and "content differs" in sentence


def test_three_methods_bad_share_marked_apart_from_the_good_one(built_sample):
    prog = built_sample("three_methods")
    st = ExplorerState(sample="three_methods", policy="decline-on-mismatch", build=lambda name, **kw: prog)
    try:
        assert st.load()
        rows = st.rows
        grid = grid_frame(rows, st.verdict).assign(method_=rows["method"].tolist(), fqn_=rows["fqn"].tolist())
        cell = {(m, f): d for m, f, d in zip(grid["method_"], grid["fqn_"], grid["decision"])}
        bad, good = cell[("probe", "proj.weight")], cell[("encode_again", "proj.weight")]
        assert "cs-culprit" in bad and "\u2717" in bad and "title=" in bad
        assert "cs-d-shared" in good and "cs-culprit" not in good and "\u2717" not in good
        assert st.selected == (
            "probe",
            next(
                n for m, n, f in zip(rows["method"], rows["name"], rows["fqn"]) if m == "probe" and f == "proj.weight"
            ),
        )
    finally:
        st.close()


def test_compile_progress_moves_per_method(built_sample):
    prog = built_sample("total_collision")
    seen: list[tuple[str, float, str]] = []

    def cold_build(name, *, on_method=None, **kw):
        for i, m in enumerate(["prefill", "decode", "extra"]):
            on_method(m, i, 3)  # what build_sample does before compiling each method
        return prog

    st = ExplorerState(build=cold_build)
    st.observe(lambda _change: seen.append((st.phase, st.progress, st.message)), names="message")
    try:
        assert st.load()
        compile_steps = [(f, msg) for ph, f, msg in seen if ph == "compile"]
        assert [f for f, _m in compile_steps] == pytest.approx([0.05, 0.2, 0.35])
        assert "'prefill' (1 of 3)" in compile_steps[0][1] and "'extra' (3 of 3)" in compile_steps[2][1]
        fractions = [f for _ph, f, _m in seen]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0  # only forward, to the end
    finally:
        st.close()


def test_real_cold_build_reports_each_method(tmp_path, monkeypatch):
    """build_sample's on_method really fires per compiled method (a fresh cache: a real compile)."""
    from toolkit.build.samples import build_sample

    calls = []
    build_sample("no_constants", cache_dir=tmp_path, progress=False, on_method=lambda *a: calls.append(a))
    assert [(i, n) for _m, i, n in calls] == [(i, len(calls)) for i in range(len(calls))] and calls


def test_results_are_marked_stale(state, built_sample):
    assert state.load() and not state.stale and state.stale_reason == ""
    state.set(policy="fingerprint")
    assert state.stale and "press Load" in state.stale_reason and "'name-only'" in state.stale_reason
    state.set(policy="name-only")
    assert not state.stale  # back to what is on screen
    gate, entered = threading.Event(), threading.Event()
    prog = built_sample("total_collision")

    def slow_build(name, **kw):
        entered.set()
        gate.wait(30)
        return prog

    state._build = slow_build
    state.set(sample="three_methods")
    t = threading.Thread(target=state.load)
    t.start()
    assert entered.wait(30)
    assert state.stale and state.stale_reason.startswith("loading sample 'three_methods'")
    assert "still those of sample 'total_collision'" in state.stale_reason
    gate.set()
    t.join(60)
    assert not state.stale
    state.set(program_from="path", path="/nonexistent/program")
    assert state.load() is False
    assert state.stale and state.stale_reason.startswith("the last load failed")


def test_refused_load_is_an_outcome_of_failure(built_sample):
    prog = built_sample("partial_collision_shape")
    st = ExplorerState(policy="refuse-on-mismatch", build=lambda name, **kw: prog)
    try:
        assert st.load() is True  # the refusal is a result: its decisions say why
        assert st.verdict.failed_stage is not None and st.outcome == st.verdict.outcome == "failed"
        assert st.phase == "failed" and "load failed: " in st.message and st.message == st.verdict.headline()
        st.set(policy="fingerprint")
        assert st.load() and st.outcome == "ok"
    finally:
        st.close()


@pytest.mark.parametrize(
    "hostile",
    ["../x", "/abs/dir/victim", "..", "a/../../b", "\\\\server\\share", "$x$", "con:\x00name", "", ".hidden", "-rf"],
)
def test_safe_file_name_is_a_plain_name(hostile):
    import re

    name = safe_file_name(hostile)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) and ".." not in name.replace("...", "")
    assert "/" not in name and "\\" not in name and not name.startswith(("-", "."))


def test_default_export_stays_in_the_folder_and_never_overwrites(built_sample, tmp_path):
    """Issue 13.4: a program named like a path cannot choose where the default CSV goes."""
    import dataclasses

    prog = dataclasses.replace(built_sample("total_collision"), name="../../victim")
    folder = tmp_path / "exports"
    folder.mkdir()
    victim = tmp_path / "victim-name-only-collisions.csv"
    st = ExplorerState(policy="name-only", build=lambda name, **kw: prog, export_dir=folder)
    try:
        assert st.load() and st.session.program.name == "../../victim"
        assert st.default_export_name() == "victim-name-only-collisions.csv"
        assert Path(st.default_export_path()).parent == folder.resolve()
        assert st.export_csv() is True
        first = folder / "victim-name-only-collisions.csv"
        assert st.exported == first and first.is_file() and not victim.exists()
        assert str(first) in st.export_message and Path(st.exported).is_absolute()
        before = first.read_bytes()
        first.write_text("mine")  # a file the user cares about
        assert st.export_csv() is True and st.exported == folder / "victim-name-only-collisions-2.csv"
        assert first.read_text() == "mine"  # the default never overwrites
        assert st.export_csv("victim-name-only-collisions.csv") is False  # an explicit existing name: refused
        assert "already exists" in st.error and first.read_text() == "mine" and st.export_ok is False
        assert st.export_csv("victim-name-only-collisions.csv", overwrite=True) is True  # asked: replaced
        assert first.read_bytes() == before
        assert st.export_csv(folder) is False and "is a folder" in st.error
    finally:
        st.close()


def test_sample_description_is_rendered_not_raw_markdown(state):
    assert "`" in __import__("toolkit.build.samples", fromlist=["x"]).sample_module("total_collision").DESCRIPTION
    assert "`" not in state.sample_description and "_tensor_constant0" in state.sample_description
    h = state.sample_description_html
    assert "<code>_tensor_constant0</code>" in h and "`" not in h


# ------------------------------------------------------------------ the view: issue 12


def test_view_grid_is_bounded_and_a_click_selects(explorer):
    ex = explorer
    ex.policy.value = "name-only"
    ex.load_button.click()
    opts = ex.grid._dt_args
    assert opts["paging"] and opts["pageLength"] == 50 and opts["select"]["style"] == "single"
    assert "max-height: 360px; overflow: auto" in ex.title.value  # the page of rows scrolls inside a bounded box
    assert opts["layout"]["topStart"] == "search"
    # cells arrive as HTML (not escaped again by itables), after every update too
    assert '<span class=\\"cs-tag cs-culprit\\"' in opts["data_json"]
    keys = ex._grid_keys
    assert keys == [("decode", "_tensor_constant0"), ("prefill", "_tensor_constant0")]  # the culprit first
    assert ex.grid.selected_rows == [0]  # the state's selection shows in the grid
    assert "function" in opts["drawCallback"] and "scrollTop" in opts["drawCallback"]  # brought into view
    assert opts["keys_to_be_evaluated"] == [["drawCallback"]]
    ex.grid.selected_rows = [1]  # what a click on the second row sends
    assert ex.state.selected == ("prefill", "_tensor_constant0")
    assert "prefill / _tensor_constant0" in ex.constant_detail.value
    assert ex.constant.value == ("prefill", "_tensor_constant0")
    ex.constant.value = ("decode", "_tensor_constant0")  # the picker beside it moves the grid too
    assert ex.grid.selected_rows == [0]
    ex.filter_method.value = "decode"
    assert ex._grid_keys == [("decode", "_tensor_constant0")] and len(ex.grid.df) == 1


def test_view_detail_says_content_differs_with_short_digests(explorer):
    ex = explorer
    ex.policy.value = "name-only"
    ex.load_button.click()
    d = ex.state.selected_decision()
    detail = ex.constant_detail.value
    assert "content differs: decode runs on prefill/_tensor_constant0" in detail.replace("&#x27;", "'")
    assert "constshare-verdict-culprit" in detail and "culprit: breaks standalone" in detail
    new, cached = d["digest"], d["cached_digest"]
    assert new != cached
    # shortened in the cells, in full on hover
    assert f">{new}<" not in detail and f'title="{new}' in detail and f">{new[:12]}\u2026<" in detail
    assert ">NO<" in detail


def test_view_stale_banner_and_grey_tabs(explorer):
    ex = explorer
    ex.load_button.click()
    assert ex.stale_banner.layout.display == "none" and "constshare-stale" not in ex.tabs._dom_classes
    ex.policy.value = "name-only"
    assert ex.stale_banner.layout.display is None and "press Load" in ex.stale_banner.value
    assert "constshare-stale" in ex.tabs._dom_classes
    ex.load_button.click()
    assert ex.stale_banner.layout.display == "none" and "constshare-stale" not in ex.tabs._dom_classes


def test_view_bar_colour_follows_the_outcome(explorer, built_sample):
    ex = explorer
    ex.policy.value = "fingerprint"
    ex.load_button.click()
    assert ex.progress.bar_style == "success"
    ex.policy.value = "name-only"
    ex.load_button.click()
    assert ex.progress.bar_style == "warning"  # loaded, but an output is wrong
    refused = built_sample("partial_collision_shape")
    ex.state._build = lambda name, **kw: refused
    ex.policy.value = "refuse-on-mismatch"
    ex.load_button.click()
    assert ex.state.verdict.failed_stage is not None
    assert ex.progress.bar_style == "danger"  # a refused load is red, never green
    assert "load failed: " in ex.status.value


def test_view_export_result_replaced_and_absolute(explorer, tmp_path):
    ex = explorer
    ex.load_button.click()
    ex.export_button.click()  # the default: a sanitised name in the export folder
    written = ex.state.exported
    assert written.parent == tmp_path.resolve() and written.is_absolute()
    assert f"<code>{written}</code>" in ex.export_result.value and "download" in ex.export_result.value
    assert str(written) in ex.export_path.placeholder or ex.export_path.placeholder.endswith("-2.csv")
    ex.export_path.value = str(tmp_path / "no" / "such" / "x.csv")
    ex.export_button.click()
    assert "wrote" not in ex.export_result.value and "does not exist" in ex.export_result.value
    assert "constshare-error" in ex.export_result.value
    assert ex.error.layout.display == "none"  # not at the top: next to the button
    ex.export_path.value = "mine.csv"  # relative: in the export folder
    ex.export_button.click()
    assert (tmp_path / "mine.csv").is_file() and "wrote" in ex.export_result.value
    ex.export_button.click()  # again: refused, the file is kept
    assert "already exists" in ex.export_result.value
    ex.export_overwrite.value = True
    ex.export_button.click()
    assert "wrote" in ex.export_result.value


def test_view_has_no_broken_images(explorer):
    ex = explorer
    images = [ex.timeline, ex.memory, ex.tradeoff, ex.memory_policies]
    assert all(im.layout.display == "none" and not bytes(im.value) for im in images)
    assert ex.matrix.layout.display == "none" and not ex.matrix.children and not ex.matrix_png.value
    ex.load_button.click()
    for im in (ex.timeline, ex.memory):
        assert im.layout.display is None and bytes(im.value).startswith(b"\x89PNG")
    assert ex.matrix.layout.display is None and len(ex.matrix.children) == 1
    assert ex.tradeoff.layout.display == "none" and ex.memory_policies.layout.display == "none"


def test_view_sample_info_is_rendered_markdown(explorer):
    assert "<code>" in explorer.sample_info.value and "`" not in explorer.sample_info.value


# ------------------------------------------------------------------ a dry run without loading

PTE = Path(__file__).parent / "fixtures" / "executorch-1.5.1-cuda" / "shared_ok" / "prog.pte"


@pytest.fixture
def no_real_load(monkeypatch):
    """Session.load calls by runtime (the dry run's vs AOTInductor's); any AOTI method made fails."""
    from toolkit.engine.session import Session
    from toolkit.runtimes.aoti import AotiRuntime

    calls: list[str] = []
    real_load, real_verify = Session.load, Session.verify

    def counting_load(self, *a, **kw):
        calls.append(self.runtime.name)
        return real_load(self, *a, **kw)

    def refuse(*a, **kw):
        raise AssertionError("a dry run made an AOTInductor method")

    def verify(self, *a, **kw):
        assert self.runtime.can_run, "a dry run asked Session.verify()"
        return real_verify(self, *a, **kw)

    monkeypatch.setattr(Session, "load", counting_load)
    monkeypatch.setattr(Session, "verify", verify)
    monkeypatch.setattr(AotiRuntime, "create", refuse)
    return calls


def test_dry_run_input_is_validated_and_marks_results_stale(state):
    from traitlets import TraitError

    with pytest.raises(TraitError, match="'dry_run' trait .* expected a boolean"):
        state.set(dry_run="yes")
    assert state.load()
    assert not state.is_dry_run and state.banner == ""
    state.set(dry_run=True)
    assert state.stale and "a dry run of" in state.describe_inputs(state.inputs())


def test_dry_run_of_a_cuda_pte_on_a_cpu(tmp_path, no_real_load):
    st = ExplorerState(program_from="path", path=str(PTE), dry_run=True, export_dir=tmp_path)
    assert st.load() is True, st.error
    assert no_real_load == ["dry run"]
    assert st.is_dry_run and st.session.status == "loaded" and st.error is None
    assert len(st.session.decisions) == 6 and set(st.session.decisions["method"]) == {"decode", "prefill"}
    assert st.banner.startswith("DRY RUN: a prediction") and "'shared_ok'" in st.banner  # named after its folder
    assert "dry run (a prediction" in st.message
    v = st.verification
    assert v["reason"].tolist() == ["not run (dry run)"] * 2 and not v["ran"].any()
    assert st.report.frame["verify_reason"].eq("not run (dry run)").all()
    assert set(st.figures()) == {"collision matrix", "timeline", "memory"}
    # the dry run's memory is the loader's accounting, per method
    assert st.session.method_results["device_bytes"].sum() == st.session.device_bytes > 0
    assert st.export_csv() is True
    assert st.exported.name == "shared_ok-fingerprint-dry-run-collisions.csv" and "a dry run" in st.export_message
    assert read_report(st.exported).frame["verify_reason"].eq("not run (dry run)").all()
    st.close()


def test_real_load_of_a_cuda_pte_on_a_cpu_suggests_the_dry_run(tmp_path):
    st = ExplorerState(program_from="path", path=str(PTE), export_dir=tmp_path)
    if st.load():  # a CUDA machine loads it: nothing to suggest
        pytest.skip("this machine can load the CUDA program")
    assert "could not load the program" in st.error and "tick “dry run”" in st.error
    st.set(dry_run=True)
    assert st.load() is True and st.error is None and st.is_dry_run
    st.close()


def test_dry_compare_runs_every_policy_without_loading(tmp_path, no_real_load):
    st = ExplorerState(program_from="path", path=str(PTE), dry_run=True, export_dir=tmp_path)
    assert st.compare() is True, st.error
    assert no_real_load == ["dry run"] * len(POLICIES)
    c = st.comparison.frame
    assert list(c["policy"]) == list(POLICIES) and all(v.predicted for v in st.comparison.verdicts().values())
    assert set(st.comparison.sessions) == set(POLICIES)
    assert all(not s.runtime.can_run for s in st.comparison.sessions.values())
    assert st.comparison_banner.startswith("DRY RUN of every policy")
    assert set(st.comparison.memory()["policy"]) == set(POLICIES)
    assert "prediction" in st.message
    st.close()


def test_dry_run_of_a_sample_predicts_the_culprit(built_sample, tmp_path, no_real_load):
    prog = built_sample("total_collision")
    st = ExplorerState(
        sample="total_collision", policy="name-only", dry_run=True, build=lambda name, **kw: prog, export_dir=tmp_path
    )
    assert st.load() is True, st.error
    assert no_real_load == ["dry run"]
    assert st.is_dry_run and st.outcome == "wrong" and "(predicted): wrong: decode" in st.message
    d = st.session.decisions.set_index(["method", "name"])["decision"].astype(str)
    assert d.loc[("decode", "_tensor_constant0")] == "shared"
    assert st.selected == ("decode", "_tensor_constant0")  # the predicted culprit is preselected
    assert st.verification["reason"].eq("not run (dry run)").all()
    assert st.compare() is True
    assert no_real_load == ["dry run"] * (1 + len(POLICIES))
    c = st.comparison.frame.set_index("policy")
    assert c.loc["name-only", "wrong_methods"] == ["decode"] and c.loc["fingerprint", "wrong_methods"] == []
    assert c.loc["name-only", "outcome"] == "wrong" and c.loc["fingerprint", "outcome"] == "ok"  # the predictions
    assert {"policy trade-off", "memory by policy"} <= set(st.figures())
    assert st.export_csv(tmp_path / "dry.csv") is True
    st.close()


def test_path_source_takes_pte_pt2_and_names_them(tmp_path):
    st = ExplorerState(program_from="path", path="")
    assert st.load() is False and ".pte" in st.error and ".pt2" in st.error and "manifest.json" in st.error
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    st.set(path=str(other))
    assert st.load() is False and "is not a program" in st.error and ".pte" in st.error


def test_view_dry_run_banner_verification_and_compare(tmp_path, no_real_load):
    require("ipywidgets", extra="notebook")
    from toolkit.explorer import Explorer

    ex = Explorer(ExplorerState(program_from="path", path=str(PTE), export_dir=tmp_path), background=False)
    try:
        assert ".pte" in ex.path.placeholder and ex.dry_banner.layout.display == "none"
        ex.dry_run.value = True
        assert ex.state.dry_run and ex.load_button.description == "Dry run"
        ex.load_button.click()
        assert ex.state.error is None and no_real_load == ["dry run"]
        assert ex.dry_banner.layout.display is None and "DRY RUN: a prediction" in ex.dry_banner.value
        # the banner once, its head bold and the rest plain; the summary a table of facts, in units
        assert (ex.dry_banner.value + ex.summary.value).count("DRY RUN") == 1
        assert "<b>DRY RUN: a prediction, not a load.</b> The decisions" in ex.dry_banner.value
        assert "predicted (dry run: nothing loaded or run)" in ex.summary.value and ">loaded<" not in ex.summary.value
        assert "KiB would be on the device" in ex.summary.value and "<pre>" not in ex.summary.value
        assert "not run (dry run)" in ex.verification.value and ">wrong<" not in ex.verification.value
        assert ">prediction<" in ex.verification.value and ">ok<" in ex.verification.value
        assert _matrix_figure(ex)["data"][0]["type"] == "heatmap" and bytes(ex.timeline.value).startswith(b"\x89PNG")
        assert bytes(ex.memory.value).startswith(b"\x89PNG")
        ex.compare_button.click()
        assert no_real_load == ["dry run"] * (1 + len(POLICIES))
        assert "DRY RUN of every policy" in ex.comparison.value
        assert bytes(ex.tradeoff.value).startswith(b"\x89PNG")
        ex.export_button.click()
        assert "dry-run" in ex.export_result.value and "download" in ex.export_result.value
        ex.dry_run.value = False
        assert ex.load_button.description == "Load" and ex.state.stale
    finally:
        ex.close()


# ------------------------------------------------------------------ issue 12: blame and the interactive matrix


def test_load_blames_the_wrong_method_and_names_its_culprit(state):
    assert state.load()
    (culprit,) = state.verdict.culprits
    assert (culprit.method, culprit.name) == ("decode", "_tensor_constant0") and culprit.broken == ("standalone",)
    assert culprit.problem == "content differs" and culprit.evidence.startswith("cached ")
    assert "culprits: decode/_tensor_constant0" in state.message and state.blame_note == ""
    # the decisions carry blame's verdict (session.blame() fills the culprit column)
    rows = state.rows.set_index(["method", "name"])
    assert rows.loc[("decode", "_tensor_constant0"), "culprit"] == "standalone"
    assert rows.loc[("prefill", "_tensor_constant0"), "culprit"] == ""


def test_a_right_load_runs_no_blame(state, monkeypatch):
    from toolkit.engine.session import Session

    def no_blame(*a, **kw):
        raise AssertionError("blame ran on a load whose methods are right")

    monkeypatch.setattr(Session, "blame", no_blame)
    state.set(policy="fingerprint")
    assert state.load()
    assert state.verdict.culprits == [] and "culprit" not in state.message and state.blame_note == ""


def test_a_failed_blame_is_a_note_and_its_findings_stay_not_tested(state, monkeypatch):
    from toolkit.engine.session import Session
    from toolkit.explorer import findings_summary

    def broken(*a, **kw):
        raise RuntimeError("no memory left")

    monkeypatch.setattr(Session, "blame", broken)
    assert state.load() is True and state.error is None and state.outcome == "wrong"
    assert state.blame_note == "blame could not run: RuntimeError: no memory left" and state.blame_note in state.message
    assert [c.blame for c in state.verdict.constants] == ["not tested"]
    assert findings_summary(state.verdict) == "1 constant run on other data: 1 not tested (no blame experiment)"
    assert state.content_verdict()[0] == "not tested"


def test_verification_row_of_the_wrong_method_names_its_culprit_with_evidence(state):
    from toolkit.display.findings import verification_html

    assert state.load()
    out = verification_html(state.verification, state.verdict)
    wrong_row = next(r for r in out.split("<tr") if ">decode<" in r)
    right_row = next(r for r in out.split("<tr") if ">prefill<" in r)
    assert "_tensor_constant0 (content differs; culprit: breaks standalone)" in wrong_row and ">wrong<" in wrong_row
    assert "_tensor_constant0" not in right_row and ">ok<" in right_row


def test_view_marks_blamed_rows_and_says_why(explorer):
    from toolkit.display.findings import FINDINGS_COLUMN

    ex = explorer
    ex.policy.value = "name-only"
    ex.load_button.click()
    assert FINDINGS_COLUMN in ex.verification.value
    assert "_tensor_constant0 (content differs; culprit: breaks standalone)" in ex.verification.value
    assert "1 constant run on other data: 1 culprit (undoing the share fixes the method)" in ex.decisions.value
    assert "1 culprit (undoing the share fixes the method)" in ex.summary.value
    col = ex.grid.df["blame"].tolist()  # the culprit's row first
    assert "culprit: breaks standalone" in col[0] and "cs-culprit" in col[0]
    assert 'title="breaks standalone: cached' in col[0]  # the evidence on hover
    assert col[1] == "<span></span>"  # prefill's own constant runs on its own data
    ex.state.select("decode", "_tensor_constant0")
    assert "culprit: breaks standalone" in ex.constant_detail.value
    ex.state.select("prefill", "_tensor_constant0")
    assert "culprit:" not in ex.constant_detail.value and "constshare-verdict-none" in ex.constant_detail.value
    # an honest load: no blame column, no findings
    ex.policy.value = "fingerprint"
    ex.load_button.click()
    assert "blame" not in ex.grid.df.columns and FINDINGS_COLUMN not in ex.verification.value


def _verdict_of_three_findings():
    from toolkit.core.verdict import ConstantFinding, MethodVerdict, Verdict
    from toolkit.core.vocab import BlameStatus, DataProblem, MethodOutcome

    def finding(method, name, blame, note, broken=()):
        return ConstantFinding(
            method,
            name,
            name,
            DataProblem.CONTENT_DIFFERS,
            f"cached x from 'a', own {name}",
            f"a/{name}",
            blame,
            note,
            broken,
        )

    methods = (
        MethodVerdict("a", MethodOutcome.OK),
        MethodVerdict("b", MethodOutcome.WRONG),
        MethodVerdict("c", MethodOutcome.OK),
    )
    return Verdict(
        "p",
        "name-only",
        False,
        methods,
        (
            finding("b", "w0", BlameStatus.CULPRIT, "breaks standalone", ("standalone",)),
            finding("b", "w1", BlameStatus.HARMLESS, "undoing it fixes nothing: the culprits are elsewhere"),
            finding(
                "c", "w1", BlameStatus.HARMLESS, "the method verifies ok: the difference does not reach its outputs"
            ),
            # a share blame tried that has no known difference, and undoing it fixes nothing: it runs on equal data
            ConstantFinding("b", "w2", "w2", None, "equal", "a/w2", BlameStatus.HARMLESS, "undoing it fixes nothing"),
        ),
    )


def test_findings_say_which_are_culprits_and_why_the_others_are_harmless():
    from toolkit.explorer import count_text, findings_summary

    v = _verdict_of_three_findings()
    assert findings_summary(v) == (
        "3 constants run on other data: 1 culprit (undoing the share fixes the method), 2 harmless (1: undoing it "
        "fixes nothing: the culprits are elsewhere; 1: the method verifies ok: the difference does not reach its "
        "outputs)"
    )
    assert findings_summary(v, {("b", "w1"), ("a", "w9")}) == (
        "1 constant run on other data: 1 harmless (undoing it fixes nothing: the culprits are elsewhere)"
    )
    assert findings_summary(v, {("a", "w9")}) == "" and findings_summary(None) == ""
    rows = pd.DataFrame(
        [
            {
                "method": m,
                "name": n,
                "decision": "shared" if m != "a" else "loaded",
                "data_problem": "" if m == "a" else "content differs",
            }
            for m, n in (("a", "w0"), ("b", "w0"), ("b", "w1"), ("c", "w1"))
        ]
    )
    blame = grid_frame(rows, v)["blame"].tolist()
    assert blame[0] == "<span></span>" and "\u2717 culprit: breaks standalone" in blame[1] and "cs-culprit" in blame[1]
    assert ">harmless<" in blame[2] and 'title="undoing it fixes nothing' in blame[2] and "cs-caught" in blame[2]
    assert 'title="the method verifies ok' in blame[3]
    assert "blame" not in grid_frame(rows).columns  # no verdict: nothing was tested
    assert count_text(1, 2, True) == "1 of 2 decisions (filtered)" and count_text(2, 2, False) == "2 of 2 decisions"
    assert count_text("_TOTAL_", 10_000, False) == "_TOTAL_ of 10,000 decisions"


def test_view_matrix_hover_says_decision_and_reason(explorer):
    ex = explorer
    ex.policy.value = "name-only"
    ex.load_button.click()
    fig = _matrix_figure(ex)
    heat = fig["data"][0]
    assert heat["y"] == ["prefill", "decode"] and heat["x"] == ["_tensor_constant0"]
    decode = heat["customdata"][1][0]
    assert "decision: <b>shared</b>" in decode and "content differs" in decode
    assert "reason: <b>name_hit_unchecked</b>" in decode and "blame: sharing it breaks <b>standalone</b>" in decode
    assert "first_seen" in heat["customdata"][0][0]
    assert heat["text"] == [["L"], ["S\u2717"]]  # the culprit marked in the cell, as in the PNG
    assert heat["hovertemplate"] == "%{customdata}<extra></extra>"


def test_verification_of_a_huge_program_names_a_few_culprits_and_counts_the_rest():
    from toolkit.core.verdict import ConstantFinding, MethodVerdict, Verdict
    from toolkit.core.vocab import BlameStatus, DataProblem, MethodOutcome
    from toolkit.display.findings import MAX_NAMED, verification_html

    v = pd.DataFrame(
        [
            {
                "method": m,
                "ran": True,
                "max_abs_err": err,
                "atol": 1e-3,
                "rtol": 1e-3,
                "ok": err == 0,
                "reason": "" if err == 0 else "output differs",
            }
            for m, err in (("a", 0.0), ("b", 9.0), ("c", 9.0))
        ]
    )
    verdict = Verdict(
        "p",
        "name-only",
        False,
        tuple(
            MethodVerdict(m, o)
            for m, o in (("a", MethodOutcome.OK), ("b", MethodOutcome.WRONG), ("c", MethodOutcome.WRONG))
        ),
        tuple(
            ConstantFinding(
                "b",
                f"w{i}",
                f"w{i}",
                DataProblem.CONTENT_DIFFERS,
                "differs",
                f"a/w{i}",
                BlameStatus.CULPRIT,
                "breaks standalone",
                ("standalone",),
            )
            for i in range(40)
        ),
    )
    out = verification_html(v, verdict)
    row_b = next(r for r in out.split("<tr") if ">b<" in r)
    # blame's finding said once for the 40 constants it was found for
    assert (
        f"w0, w1, w2, w3, w4, w5, w6, w7 ... and {40 - MAX_NAMED:,} more (content differs; culprit: breaks standalone)"
        in row_b
        and row_b.count("breaks standalone") == 1
    )
    assert "w39" not in row_b
    row_c = next(r for r in out.split("<tr") if ">c<" in r)
    assert ">wrong<" in row_c and "w0" not in row_c  # wrong, and no constant of it runs on other data


# ------------------------------------------------------------------ issue 22: what users touch


def test_grid_puts_culprits_first_and_toggles_culprits_only(state):
    from toolkit.explorer import CULPRIT_RANK, OTHER, interest_rank

    assert state.load()
    assert list(zip(state.rows["method"], state.rows["name"]))[0] == ("decode", "_tensor_constant0")
    assert interest_rank(state.session.decisions, state.verdict).tolist() == [OTHER, CULPRIT_RANK]
    state.set_filters(culprits_only=True)
    assert state.filtered and state.rows["method"].tolist() == ["decode"]
    assert state.selected == ("decode", "_tensor_constant0")
    state.set_filters(culprits_only=False)
    assert len(state.rows) == 2 and not state.filtered


def test_interest_rank_orders_culprits_findings_wrong_methods_collisions():
    from toolkit.explorer import COLLISION, CULPRIT_RANK, OF_A_WRONG_METHOD, OTHER, RUNS_ON_OTHER_DATA, interest_rank

    v = _verdict_of_three_findings()  # b/w0 culprit; b/w1, c/w1, b/w2 harmless; b wrong
    rows = pd.DataFrame(
        [
            ("a", "w0", "miss", ""),
            ("a", "w3", "hit", ""),
            ("b", "w9", "miss", ""),
            ("c", "w1", "hit", "content differs"),
            ("b", "w0", "hit", "content differs"),
        ],
        columns=["method", "name", "lookup", "data_problem"],
    )
    assert interest_rank(rows, v).tolist() == [OTHER, COLLISION, OF_A_WRONG_METHOD, RUNS_ON_OTHER_DATA, CULPRIT_RANK]


def test_grid_shows_the_fqn_with_the_internal_name_beside():
    rows = pd.DataFrame(
        [
            {
                "method": "encoder",
                "name": "model_model_layers_0_fc1_weight",
                "fqn": "model.model.layers.0.fc1.weight",
                "decision": "loaded",
                "reason_code": "first_seen",
            },
            {"method": "encoder", "name": "w", "fqn": "", "decision": "loaded", "reason_code": "first_seen"},
        ]
    )
    g = grid_frame(rows)
    assert list(g.columns) == ["method", "constant", "decision", "same content", "reason", "bytes", "shared from"]
    cell = g["constant"][0]
    assert cell.index("model.\u200bmodel.\u200blayers") < cell.index(">model_\u200bmodel_\u200blayers")  # FQN first
    assert 'class="cs-wrap cs-internal"' in cell and 'title="model.model.layers.0.fc1.weight"' in cell
    assert g["constant"][1] == '<span class="cs-wrap cs-fqn">w</span>'  # no FQN: the name alone


def test_view_matrix_click_selects_the_constant_in_the_grid_and_detail(explorer):
    from toolkit.explorer import DECISIONS_TAB

    ex = explorer
    ex.policy.value = "name-only"
    ex.load_button.click()
    ex.state.set_filters(method="decode")  # hides prefill: the click clears the filters
    (fig,) = ex.matrix.children
    # what plotly's FigureWidget sends from the browser on a click on prefill's cell
    fig._js2py_pointsCallback = {
        "event_type": "plotly_click",
        "points": {"trace_indexes": [0], "point_indexes": [[0, 0]], "xs": ["_tensor_constant0"], "ys": ["prefill"]},
    }
    assert ex.state.selected == ("prefill", "_tensor_constant0") and not ex.state.filtered
    assert ex.grid.selected_rows == [ex._grid_keys.index(("prefill", "_tensor_constant0"))]
    assert "prefill / _tensor_constant0" in ex.constant_detail.value and ex.tabs.selected_index == DECISIONS_TAB


def test_view_culprits_only_toggle_and_rows_export(explorer, tmp_path):
    ex = explorer
    ex.policy.value = "name-only"
    ex.load_button.click()
    ex.culprits_only.value = True
    assert ex.state.culprits_only and ex._grid_keys == [("decode", "_tensor_constant0")]
    assert "(filtered)" in ex.grid._dt_args["language"]["info"]
    ex.export_rows_button.click()
    written = tmp_path / "total_collision-name-only-decisions-filtered.csv"
    assert written.is_file() and "wrote 1 row to" in ex.export_rows_result.value
    frame = read_report(written).frame  # the report's writer: it reads back as a report
    assert frame["name"].tolist() == ["_tensor_constant0"] and frame["method"].tolist() == ["decode"]
    ex.export_rows_button.click()  # never overwrites: numbered
    assert (tmp_path / "total_collision-name-only-decisions-filtered-2.csv").is_file()


def test_device_is_validated_and_cuda_without_cuda_is_a_message(built_sample, monkeypatch):
    require("ipywidgets", extra="notebook")
    from toolkit.core.errors import ToolkitError
    from toolkit.explorer import NO_CUDA, Explorer, devices

    with pytest.raises(ToolkitError, match="unknown device 'tpu'"):
        ExplorerState(device="tpu")
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    prog = built_sample("total_collision")
    ex = Explorer(build=lambda name, **kw: prog, device="cuda", background=False)  # no raw TraitError
    try:
        assert ("cuda (none here: dry run only)", "cuda") in ex.device.options and ex.device.value == "cuda"
        ex.state.set(device="cuda:1")  # a device the menu lacks is added, no TraitError
        assert ex.device.value == "cuda:1"
        ex.load_button.click()
        assert ex.state.error == f"could not load the program: {NO_CUDA}" and ex.state.error_detail == ""
        assert ex.state.message == "could not load the program (see below)"
    finally:
        ex.close()


def test_cuda_pte_on_a_cpu_says_the_dry_run_first_and_no_rebuild(tmp_path, monkeypatch):
    from toolkit.explorer import devices

    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    st = ExplorerState(program_from="path", path=str(PTE), export_dir=tmp_path)
    assert st.load() is False
    assert st.error.startswith("could not load the program: this program cannot be loaded here: tick “dry run”")
    assert "rebuild" not in st.error and "built for 'cuda'" in st.error
    st.close()


def test_dry_run_device_follows_the_program_and_its_csv_has_no_verification(tmp_path, no_real_load):
    st = ExplorerState(program_from="path", path=str(PTE), dry_run=True, device="cpu", export_dir=tmp_path)
    assert st.load() is True, st.error
    assert st.device == "cuda" and "device set to cuda" in st.message  # the menu says what the text says
    assert " on cuda:0" in st.banner and not st.stale
    assert st.export_csv() is True
    frame = read_report(st.exported).frame
    assert frame["method_ok"].isna().all()  # a prediction: neither ok nor wrong
    st.close()


def test_compare_colours_the_bar_by_the_chosen_policys_verdict(explorer):
    ex = explorer
    ex.policy.value = "name-only"
    ex.load_button.click()
    ex.compare_button.click()
    assert ex.state.outcome == "wrong" and "the chosen 'name-only': wrong" in ex.state.message
    assert ex.progress.bar_style == "warning"  # not green while the chosen policy is wrong
    assert "background-color: #f4cccc" in ex.comparison.value  # wrong_methods red


def test_comparison_errors_show_short_keys():
    from toolkit.explorer import comparison_display

    key = "ab" * 32
    out = comparison_display(pd.DataFrame({"policy": ["fqn-weight-cache"], "error": [f"no entry {key} in the cache"]}))
    assert out["error"][0] == f"no entry {key[:12]}\u2026 in the cache"


def test_a_large_export_is_linked_by_path_not_embedded(explorer, tmp_path, monkeypatch):
    from toolkit.explorer import markup

    monkeypatch.setattr(markup, "MAX_INLINE_EXPORT", 16)
    ex = explorer
    ex.load_button.click()
    ex.export_button.click()
    assert "base64" not in ex.export_result.value and "open it from the file browser" in ex.export_result.value
    assert str(ex.state.exported) in ex.export_result.value


def test_view_summary_is_a_table_in_units(explorer):
    ex = explorer
    ex.load_button.click()
    v = ex.summary.value
    assert "<pre>" not in v and ">status<" in v and ">loaded<" in v and "16 KiB" in v
    assert "with each method on its own blob" in v and "32,768" not in v


# ------------------------------------------------------------------ issue 22 leftovers: progress, Excel, names


@pytest.fixture(scope="module")
def synthetic_10k(tmp_path_factory):
    """A 10,000-constant synthetic program (2 methods x 5,000; its manifest only: a dry run's)."""
    from toolkit.build.synthetic import SyntheticSpec, write_synthetic

    return write_synthetic(
        SyntheticSpec(name="synthetic_10k", seed=12, methods=2, constants=5_000),
        tmp_path_factory.mktemp("syn") / "synthetic_10k",
    )


def test_the_bar_moves_during_a_10k_dry_run(synthetic_10k, tmp_path):
    require("ipywidgets", extra="notebook")
    from toolkit.explorer import DRAW_SPAN, Explorer

    ex = Explorer(
        ExplorerState(
            program_from="path",
            path=str(synthetic_10k),
            dry_run=True,
            policy="decline-on-mismatch",
            export_dir=tmp_path,
        ),
        background=False,
    )
    seen: list[tuple[float, str]] = []
    ex.progress.observe(lambda ch: seen.append((ch["new"], ex.state.phase)), names="value")
    statuses: list[str] = []
    ex.status.observe(lambda ch: statuses.append(html.unescape(ch["new"])), names="value")
    try:
        ex.load_button.click()
        assert ex.state.error is None and ex.state.is_dry_run
        values = [v for v, _p in seen]
        assert values == sorted(values) and values[-1] == 1.0  # never backwards, ends full
        between = sorted({round(v, 4) for v in values if 0 < v < 1})
        assert len(between) >= 6, seen  # not only 0 and 100 %: open, each method, the report, each figure
        # while the constants are predicted, the bar moves more than once, the status naming method and count
        assert len({v for v, p in seen if p == "analyze"}) >= 3, seen
        assert any("method 'method_0'" in t and "of 10,000 constants" in t for t in statuses), statuses[:5]
        assert any("method 'method_1', 10,000 of 10,000 constants" in t for t in statuses)
        # the figures after the prediction (seconds at this size) move it too
        assert len({v for v, p in seen if p == "draw" and DRAW_SPAN[0] <= v <= DRAW_SPAN[1]}) == 3, seen
        assert any("drawing the collision matrix" in t for t in statuses)
    finally:
        ex.close()


def test_the_excel_export_holds_exactly_the_filtered_rows(explorer, tmp_path):
    require("openpyxl", extra="notebook")
    ex = explorer
    ex.policy.value = "name-only"
    ex.load_button.click()
    ex.filter_decision.value = "shared"  # decode's culprit only
    ex.export_rows_excel_button.click()
    s = ex.state
    assert s.error is None and s.rows_export_file.suffix == ".xlsx"
    assert s.rows_export_file.name == "total_collision-name-only-decisions-filtered.xlsx"
    back = pd.read_excel(s.rows_export_file, sheet_name="decisions")
    assert list(zip(back["method"], back["name"])) == list(zip(s.rows["method"], s.rows["name"]))
    assert len(back) == 1 < s.total_decisions and back["decision"].tolist() == ["shared"]
    assert back["nbytes"].dtype.kind == "i" and back["collision"].dtype == bool  # typed cells, not text
    link = ex.export_rows_result.value
    assert "wrote 1 row to" in link
    assert "data:application/vnd.openxmlformats-officedocument.spreadsheetml.sheet;base64," in link
    # unfiltered, the same button: every row, numbered past the first file
    ex.filter_decision.value = ALL
    ex.export_rows_excel_button.click()
    every = pd.read_excel(s.rows_export_file)
    assert s.rows_export_file.name == "total_collision-name-only-decisions.xlsx" and len(every) == s.total_decisions
    ex.export_rows_excel_button.click()
    assert s.rows_export_file.name == "total_collision-name-only-decisions-2.xlsx"


def test_a_10k_dry_run_long_matrix_click_and_a_large_excel_export(synthetic_10k, tmp_path):
    require("ipywidgets", extra="notebook")
    require("openpyxl", extra="notebook")
    from toolkit.explorer import DECISIONS_TAB, MAX_INLINE_EXPORT, Explorer

    ex = Explorer(
        ExplorerState(
            program_from="path",
            path=str(synthetic_10k),
            dry_run=True,
            policy="decline-on-mismatch",
            export_dir=tmp_path,
        ),
        background=False,
    )
    try:
        ex.load_button.click()
        # the matrix of 120 names is long: a row per name (a header per group), a column per method
        (fig,) = ex.matrix.children
        heat = fig.data[0]
        assert heat.meta["long"] and list(heat.x) == ["method_0", "method_1"]
        header = heat.meta["rows"].index(-1)
        row = next(r for r, j in enumerate(heat.meta["rows"]) if j >= 0 and r > header)
        name = heat.meta["names"][1][heat.meta["rows"][row]]
        before = ex.state.selected
        ex.tabs.selected_index = 0
        fig._js2py_pointsCallback = {
            "event_type": "plotly_click",
            "points": {  # a header row: nothing
                "trace_indexes": [0],
                "point_indexes": [[header, 1]],
                "xs": ["method_1"],
                "ys": [header],
            },
        }
        assert ex.state.selected == before and ex.tabs.selected_index == 0
        fig._js2py_pointsCallback = {
            "event_type": "plotly_click",
            "points": {"trace_indexes": [0], "point_indexes": [[row, 1]], "xs": ["method_1"], "ys": [row]},
        }
        assert ex.state.selected == ("method_1", name) and ex.tabs.selected_index == DECISIONS_TAB
        ex.export_rows_excel_button.click()
        target = ex.state.rows_export_file
        assert target.stat().st_size > MAX_INLINE_EXPORT and len(pd.read_excel(target)) == 10_000
        page = ex.export_rows_result.value
        assert "base64" not in page and len(page) < 2_000 and "open it from the file browser" in page
        assert "wrote 10,000 rows" in page
    finally:
        ex.close()


def test_a_pte_is_called_by_its_folder_in_headline_and_exports(tmp_path, no_real_load):
    require("ipywidgets", extra="notebook")
    from executorch_fixtures import unpacked

    from toolkit.explorer import Explorer

    pte = unpacked("1.5.1", kind="cuda") / "total_collision" / "prog.pte"
    if not pte.is_file():
        pytest.fail(f"{pte} is missing: the committed 1.5.1 archive was not unpacked")
    ex = Explorer(
        ExplorerState(program_from="path", path=str(pte), dry_run=True, policy="name-only", export_dir=tmp_path),
        background=False,
    )
    try:
        ex.load_button.click()
        s = ex.state
        assert s.error is None and s.session.program.name == "total_collision"  # prog.pte: its folder's name
        assert s.program_label == "total_collision"
        head = s.verdict.headline(name=s.program_label)
        assert head.startswith("'total_collision' under 'name-only' (predicted): wrong")
        assert "'prog'" not in s.message and "'total_collision' under 'name-only'" in s.message
        summary = ex.summary.value.replace("&#x27;", "'")
        assert head in summary and "'prog' under" not in summary
        assert "total_collision-name-only-dry-run-collision-matrix.png" in ex.matrix_png.value
        assert _matrix_figure(ex)["layout"]["title"]["text"].startswith("total_collision: name-only")
        assert ex.state.export_csv() and s.exported.name == "total_collision-name-only-dry-run-collisions.csv"
        assert s.export_rows() and s.rows_export_file.name == "total_collision-name-only-dry-run-decisions.csv"
        assert not any("prog" in p.name for p in tmp_path.iterdir())
        assert s.compare() and "policies on 'total_collision'" in s.message and "'prog'" not in s.message
        assert s.figures(session=False)["policy trade-off"].axes[0].get_title().startswith("total_collision: ")
    finally:
        ex.close()


def _info_line(ex) -> str:
    """The grid's info line as DataTables draws it, unsearched: its _TOTAL_ the grid frame's rows."""
    return (
        ex.grid._dt_args["language"]["info"]
        .replace("rows _START_-_END_ · ", "")
        .replace("_TOTAL_", f"{len(ex.grid.df):,}")
        if len(ex.grid.df)
        else ex.grid._dt_args["language"]["infoEmpty"]
    )


def test_the_count_and_the_grid_agree_through_filters_culprits_and_a_policy_switch(explorer):
    ex = explorer
    s = ex.state

    def agree(rows: int, filtered: bool) -> None:
        assert len(ex.grid.df) == len(s.rows) == len(ex._grid_keys) == rows
        assert (
            ex.count
            == _info_line(ex)
            == f"{rows} of {s.total_decisions} decisions" + (" (filtered)" if filtered else "")
        )

    ex.policy.value = "name-only"
    ex.load_button.click()
    agree(2, False)
    ex.filter_decision.value = "loaded"
    agree(1, True)
    ex.culprits_only.value = True  # prefill's loaded row runs on its own data: none left
    agree(0, True)
    ex.filter_decision.value = ALL
    agree(1, True)  # decode's culprit
    ex.policy.value = "fingerprint"
    ex.load_button.click()  # the filters cleared, culprits only kept (its checkbox says so): no culprit now
    assert ex.culprits_only.value and s.culprits_only
    agree(0, True)
    ex.culprits_only.value = False
    agree(2, False)
    ex.filter_method.value = "decode"
    agree(1, True)
    ex.policy.value = "name-only"
    ex.load_button.click()
    assert ex.filter_method.value == ALL
    agree(2, False)


def test_a_real_load_moves_the_bar_over_its_constants_then_its_figures(state):
    from toolkit.explorer import DRAW_SPAN, LOAD_SPAN

    seen: list[tuple[float, str, str]] = []
    state.observe(lambda ch: seen.append((state.progress, state.phase, state.message)), names="progress")
    assert state.load() is True and state.error is None
    loading = [(p, m) for p, ph, m in seen if ph == "load"]
    assert loading and all(LOAD_SPAN[0] <= p <= LOAD_SPAN[1] for p, _m in loading), seen
    assert any("method 'decode', 2 of 2 constants" in m for _p, m in loading), loading
    assert [p for p, _ph, _m in seen] == sorted(p for p, _ph, _m in seen)  # never backwards
    assert [ph for _p, ph, _m in seen if ph in ("load", "verify", "blame", "report", "draw", "done")][-1] == "done"
    assert len({p for p, ph, _m in seen if ph == "draw" and DRAW_SPAN[0] <= p <= DRAW_SPAN[1]}) == 3
