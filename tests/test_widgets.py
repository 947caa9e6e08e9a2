"""The explorer: its state and callbacks in plain pytest, and the ipywidgets view without a kernel."""

from __future__ import annotations

import threading

import pandas as pd
import pytest
from conftest import require

from toolkit.report import read_report
from toolkit.widgets import ALL, ExplorerState

pytestmark = pytest.mark.slow  # every test here loads a (cached) sample program


@pytest.fixture
def state(built_sample):
    prog = built_sample("total_collision")
    # build= returns the session's program: no compile, whatever sample is chosen
    st = ExplorerState(sample="total_collision", policy="name-only", build=lambda name, **kw: prog)
    heard: list[str] = []
    st.subscribe(heard.append)
    st.heard = heard
    yield st
    st.close()


def test_load_fills_session_verification_report_and_progress(state):
    assert state.load() is True
    assert state.error is None and not state.busy
    assert state.session.status == "loaded" and state.progress == 1.0 and state.phase == "done"
    assert state.report.wrong_methods == ["decode"]
    assert "WRONG OUTPUT in decode" in state.message
    assert state.verification["ok"].tolist() == [True, False]
    for what in ("busy", "progress", "session", "filters", "selection"):
        assert what in state.heard
    # progress only moves forward during one action
    assert state.selected == ("decode", "_tensor_constant0")  # the first collision is preselected
    figs = state.figures()
    assert set(figs) == {"collision matrix", "timeline", "memory"}


def test_filters_and_their_options(state):
    state.load()
    assert state.filter_options() == {"method": ["prefill", "decode"], "decision": ["loaded", "shared"],
                                      "reason": ["first_seen", "name_hit_unchecked"]}
    state.set_filters(decision="loaded")
    rows = state.filtered_decisions()
    assert rows["decision"].astype(str).tolist() == ["loaded"]
    assert state.selected == ("prefill", "_tensor_constant0")  # the selection follows the filter
    state.set_filters(decision=ALL, method="decode")
    assert state.filtered_decisions()["method"].tolist() == ["decode"]
    state.set_filters(reason="first_seen")
    assert len(state.filtered_decisions()) == 0 and state.selected is None
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
    with pytest.raises(ValueError, match="unknown policy"):
        state.set(policy="share-everything")
    with pytest.raises(ValueError, match="unknown sample"):
        state.set(sample="nope")
    with pytest.raises(ValueError, match="unknown source"):
        state.set(source="url")
    state.set(policy="verify-always", device="cpu")
    assert state.policy == "verify-always" and "#21706" in state.policy_summary


def test_errors_are_recorded_not_raised(state, tmp_path):
    assert state.load()
    first = state.session
    state.set(source="path", path=str(tmp_path / "missing"))
    assert state.load() is False
    assert state.error.startswith("could not open the program") and "does not exist" in state.error
    assert "Traceback" in state.error_detail and "error" in state.heard
    assert state.session is first  # the previous results stay
    state.set(path="  ")
    assert state.load() is False and "enter the path" in state.error
    state.set(source="sample")
    assert state.load() is True and state.error is None


def test_a_crashing_loader_becomes_a_message(built_sample):
    prog = built_sample("total_collision")

    def boom(*a, **k):
        raise RuntimeError("segfault avoided\nsecond line")

    st = ExplorerState(build=lambda name, **kw: prog, load=boom)
    assert st.load() is False
    assert st.error == "could not load the program: RuntimeError: segfault avoided"
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
    assert state.default_export_path() == "total_collision-name-only-collisions.csv"


def test_compare_all_policies(state):
    state.load()
    assert state.compare() is True
    c = state.comparison
    assert len(c) == 7 and set(c["policy"]) >= {"fingerprint", "name-only"}
    assert c.set_index("policy").loc["name-only", "wrong_methods"] == ["decode"]
    assert set(state.comparison_memory["policy"]) == set(c["policy"])
    figs = state.figures()
    assert {"policy trade-off", "memory by policy"} <= set(figs)


def test_compare_loads_each_policy_once(state, monkeypatch):
    """The comparison frame, the memory per method and the sessions come from one load per policy."""
    from toolkit.loader import Session

    state.load()
    loads, verifies = [], []
    real_load, real_verify = Session.load, Session.verify

    def counting_load(self, *a, **kw):
        loads.append(self.policy.name.value)
        return real_load(self, *a, **kw)

    def counting_verify(self, *a, **kw):
        verifies.append(self.policy.name.value)
        return real_verify(self, *a, **kw)

    monkeypatch.setattr(Session, "load", counting_load)
    monkeypatch.setattr(Session, "verify", counting_verify)
    assert state.compare() is True
    assert sorted(loads) == sorted(state.comparison["policy"]) and len(loads) == 7
    assert sorted(verifies) == sorted(loads)
    assert set(state.compared_sessions) == set(loads)
    # the kept sessions are closed (no device memory held) and still answer
    s = state.compared_sessions["name-only"]
    assert not s.methods and len(s.decisions) == 2
    mem = state.comparison_memory.set_index(["policy", "method"])["device_bytes"]
    assert mem.loc[("no-sharing", "decode")] == 16384 and mem.loc[("name-only", "decode")] == 0


# ------------------------------------------------------------------ the ipywidgets view


@pytest.fixture
def explorer(built_sample):
    require("ipywidgets", extra="notebook")
    from toolkit.widgets import Explorer

    prog = built_sample("total_collision")
    ex = Explorer(ExplorerState(sample="total_collision", build=lambda name, **kw: prog), background=False)
    yield ex
    ex.close()


def test_view_load_renders_table_plots_and_summary(explorer):
    ex = explorer
    ex.policy.value = "name-only"
    assert ex.state.policy == "name-only" and "name-only" in ex.policy_info.value
    ex.load_button.click()
    assert ex.state.error is None
    assert "_tensor_constant0" in ex.decisions.value and ">shared<" in ex.decisions.value
    assert "WRONG" in ex.verification.value
    assert bytes(ex.matrix.value).startswith(b"\x89PNG") and bytes(ex.timeline.value).startswith(b"\x89PNG")
    assert "WRONG OUTPUT in decode" in ex.status.value and ex.progress.value == 1.0
    assert ex.constant.value == ("decode", "_tensor_constant0")
    assert "cached vs new" in ex.constant_detail.value
    assert not ex.load_button.disabled and ex.load_button.description == "Load"


def test_view_filters_and_selection(explorer):
    ex = explorer
    ex.load_button.click()
    ex.filter_decision.value = "loaded"
    assert ex.state.filter_decision == "loaded"
    assert "1 of 2 decisions" in ex.decisions.value
    assert [v for _l, v in ex.constant.options] == [("prefill", "_tensor_constant0")]
    ex.filter_decision.value = ALL
    ex.constant.value = ("decode", "_tensor_constant0")
    assert ex.state.selected == ("decode", "_tensor_constant0")
    assert "digest" in ex.constant_detail.value and "NO" in ex.constant_detail.value  # fingerprint: digests differ


def test_view_shows_errors_in_the_widget(explorer, tmp_path):
    ex = explorer
    ex.source.value = "path"
    assert ex.path.layout.display is None and ex.sample.layout.display == "none"
    ex.path.value = str(tmp_path / "nope")
    ex.load_button.click()  # must not raise
    assert ex.error.layout.display is None
    assert "could not open the program" in ex.error.value and "<details>" in ex.error.value
    assert ex.progress.bar_style == "danger"
    ex.source.value = "sample"
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
    assert ex.state.session is not None and "_tensor_constant0" in ex.decisions.value
    assert not ex.load_button.disabled


def test_view_compare_renders_tradeoff(explorer):
    ex = explorer
    ex.load_button.click()
    ex.compare_button.click()
    assert bytes(ex.tradeoff.value).startswith(b"\x89PNG")
    assert bytes(ex.memory_policies.value).startswith(b"\x89PNG")
    assert "verify-always" in ex.comparison.value


def test_view_close_leaves_no_widgets(built_sample):
    ipywidgets = require("ipywidgets", extra="notebook")
    from ipywidgets.widgets.widget import _instances

    from toolkit.widgets import Explorer

    prog = built_sample("total_collision")
    before = set(_instances)
    ex = Explorer(ExplorerState(build=lambda name, **kw: prog), background=False)
    assert len(set(_instances) - before) > 20
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    ex.close()
    assert set(_instances) - before == set()
    assert isinstance(ex.widget, ipywidgets.VBox)
