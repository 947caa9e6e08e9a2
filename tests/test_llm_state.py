"""A real language model with a real KV cache (sample ``llama_static_cache``): transformers'
Llama layers over a static cache held as buffers of one module, exported as prefill/decode.
Greedy generation reproduces eager's tokens exactly when the cache is shared, under every
policy that shares it; blame names the cache when it is kept apart; the mutated buffers are
found in the exported graph without functionalizing it."""

from __future__ import annotations

import warnings

import pytest
import torch

import toolkit
from toolkit.build.builder import mutated_buffers
from toolkit.build.samples import sample_module, sample_names
from toolkit.engine.verification import read_sequence_reference

pytestmark = pytest.mark.slow  # builds (once, cached) and loads the sample

SAMPLE = "llama_static_cache"
CACHE = {"core.k_cache_0", "core.v_cache_0", "core.k_cache_1", "core.v_cache_1"}
STATE = CACHE | {"core.length"}  # and the counter decode_next reads
SEQUENCES = {"generate": "decode", "generate_next": "decode_next"}  # sequence -> its decode method
SHARING = [p for p in toolkit.POLICIES if p != "no-sharing"]


@pytest.fixture(scope="module")
def llm():
    return sample_module(SAMPLE)


def _export(module, args=(), kwargs=None):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        return torch.export.export(module.eval(), args, kwargs)


# -- the model itself ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["decode", "decode_next"])
def test_the_static_cache_gives_transformers_own_logits(llm, method):
    """Prefill + decodes through the cache equal one uncached transformers forward over the
    whole sequence: the cache really carries the keys and values (not a stub)."""
    steps = llm.greedy(method=method)
    core = llm.core()
    run = {"prefill": llm.Prefill(core), "decode": llm.Decode(core), "decode_next": llm.DecodeNext(core)}
    with torch.no_grad():
        outs = [run[m](*args) for m, args in steps]
        tokens = torch.cat([steps[0][1][0]] + [args[0] for _m, args in steps[1:]], dim=1)
        full = core.model(input_ids=tokens, use_cache=False).logits  # transformers' own forward, no cache
    stepwise = torch.cat([logits for logits, _t in outs], dim=1)
    assert torch.allclose(stepwise, full[:, : stepwise.shape[1]], atol=1e-5), float((stepwise - full).abs().max())
    # each decode's input is the token eager chose the step before
    chosen = [int(t) for _l, t in outs]
    assert [int(args[0]) for _m, args in steps[1:]] == chosen[:-1]
    assert len(set(chosen)) > 1  # a generation, not one repeated token
    assert core.length.tolist() == [llm.PROMPT_LEN + llm.DECODE_STEPS, llm.DECODE_STEPS]
    again = llm.greedy(method=method)  # seeded: the same steps every time
    assert [m for m, _a in again] == [m for m, _a in steps]
    assert all(torch.equal(x, y) for (_m, a1), (_n, a2) in zip(steps, again) for x, y in zip(a1, a2))
    # without the cache a decode sees nothing of the prompt: another answer
    empty = llm.core()
    with torch.no_grad():
        logits, _ = {"decode": llm.Decode, "decode_next": llm.DecodeNext}[method](empty)(*steps[1][1])
    assert not torch.allclose(logits, outs[1][0], atol=1e-3)


def test_mutated_buffers_are_read_from_the_graph_as_exported():
    """The builder's detection equals the functionalized signature on every sample, needs no
    functionalization, and follows writes through views."""
    for name in sample_names():
        for method, (module, args) in sample_module(name).methods().items():
            ep = _export(module, args)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore")
                functional = ep.run_decompositions({})
            assert mutated_buffers(ep) == set(functional.graph_signature.buffers_to_mutate.values()), (name, method)

    class Views(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", torch.zeros(4, 8))
            self.register_buffer("b", torch.zeros(4, 8))
            self.register_buffer("c", torch.ones(3))

        def forward(self, x, i):
            self.a[1:3] = x[:2]  # slice assignment
            self.b.view(32)[i] = 1.0  # index_put on a view
            return self.a.sum() + self.b.sum() + self.c.sum()

    ep = _export(Views(), (torch.randn(4, 8), torch.tensor([3])))
    assert mutated_buffers(ep) == {"a", "b"}  # c is only read


def test_transformers_exportable_static_cache_is_found_where_functionalizing_fails(llm):
    """transformers' own TorchExportableModuleWithStaticCache exports under this torch, but
    functionalizing it fails, and its cache tensors come out as positional lifted constants
    (``lifted_tensor_N``) rather than the buffers it registers: why the sample keeps its own
    static cache over transformers' layers.  The writes are still found."""
    from transformers import GenerationConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    cfg = llm.config()
    cfg.use_cache = True
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": 16}
    )
    module = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=16)
    ep = _export(module, (), {"input_ids": torch.zeros(1, 8, dtype=torch.long), "cache_position": torch.arange(8)})
    written = mutated_buffers(ep)
    assert written and all("lifted_tensor_" in w for w in written), written
    assert not set(ep.graph_signature.buffers) & written  # the registered key_cache_*/value_cache_* are not written
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        try:
            ep.run_decompositions({})
        except AssertionError as e:  # torch 2.13; a later torch may functionalize it
            assert "compiled_fn" in str(e)


# -- the built program -----------------------------------------------------------------------


def test_provenance_makes_the_cache_one_state_of_both_methods(built_sample):
    p = built_sample(SAMPLE)
    by = {m.name: {c.fqn: c for c in m.constants} for m in p.methods}
    assert set(by) == {"prefill", "decode", "decode_next"}
    assert set(by["prefill"]) == set(by["decode"]) == set(by["decode_next"]) and len(by["prefill"]) == 27
    for fqn, c in by["prefill"].items():  # every weight and every state buffer: one eager tensor
        assert c.storage and c.storage == by["decode"][fqn].storage == by["decode_next"][fqn].storage, fqn
    for m in by:
        assert {f for f, c in by[m].items() if c.mutated} == STATE, m
    state = p.state_buffers()
    assert {b.fqn for b in state} == STATE
    assert all(b.writers == ("prefill", "decode", "decode_next") for b in state)
    assert {q.name: [st.method for st in q.steps] for q in p.sequences} == {
        seq: ["prefill"] + [m] * 4 for seq, m in SEQUENCES.items()
    }


def _tokens(session, program, sequence: str) -> tuple[list[int], list[int]]:
    """(tokens the loaded program chose, eager's) at every step of ``sequence``, from the initial state."""
    steps = read_sequence_reference(program, sequence)
    session.reset_state()
    got = [int(session.run(m, inputs)[1].reshape(-1)[0]) for m, inputs, _ref in steps]
    want = [int(ref[1].reshape(-1)[0]) for _m, _i, ref in steps]
    session.reset_state()
    return got, want


def check_policy(program, policy: str, device=None):
    s = toolkit.load_program(program, policy, device=device)
    try:
        assert s.status == "loaded", s.error
        alone = s.verify()
        assert alone["ok"].all(), alone  # each method alone, from the empty cache
        d = s.decisions.set_index(["method", "fqn"])
        for sequence, decode in SEQUENCES.items():
            seq = s.verify(sequence=sequence)
            got, want = _tokens(s, program, sequence)
            state = d.loc[[(decode, f) for f in sorted(STATE)], "decision"]
            if policy == "no-sharing":
                assert (state == "private").all()
                assert list(seq["ok"]) == [True, False, False, False, False], seq
                assert got[0] == want[0] and got != want  # prefill alone is right; the decodes see an empty cache
            else:
                assert (state == "shared").all(), state
                assert seq["ok"].all(), seq
                assert got == want  # eager's greedy tokens, exactly
        return s.decisions
    finally:
        s.close()


@pytest.mark.parametrize("policy", toolkit.POLICIES)
def test_generation_under_every_policy(built_sample, policy, llm):
    assert set(llm.EXPECTED) == set(toolkit.POLICIES)
    assert llm.EXPECTED[policy].sequence_wrong == (set(SEQUENCES) if policy == "no-sharing" else frozenset())
    check_policy(built_sample(SAMPLE), policy)


def test_fingerprint_shares_the_cache_because_of_provenance(built_sample):
    s = toolkit.load_program(built_sample(SAMPLE), "fingerprint")
    d = s.decisions.set_index(["method", "fqn"])
    for m in ("decode", "decode_next"):
        for fqn in STATE:
            assert d.loc[(m, fqn), "reason_code"] == "same_state", d.loc[(m, fqn)]
            assert d.loc[(m, fqn), "shared_from"].startswith("prefill/")
    s.close()


# the culprits where the sequence is wrong: decode needs the four cache buffers of prefill (its
# position is an input, so the counter is not among them); decode_next also needs the counter
CULPRITS = {"generate": {("decode", f) for f in CACHE}, "generate_next": {("decode_next", f) for f in STATE}}


def check_blame(s, policy: str, sequence: str) -> None:
    assert s.status == "loaded", s.error  # (a failed load has nothing to blame: no empty frame passes for it)
    b = s.blame(sequence)
    culprits = set(zip(b[b["fixes"]]["method"], b[b["fixes"]]["fqn"]))
    if policy != "no-sharing":
        assert s.verify(sequence=sequence)["ok"].all()  # nothing wrong, so nothing blamed
        assert culprits == set() and b.empty, b
        return
    # no single buffer fixes it (every buffer kept apart): they fix it together, and only those needed
    assert culprits == CULPRITS[sequence], b
    single = b[~b["fixes"]]
    assert len(single) and single["swap"].str.startswith("the writer's tensor").all()
    fix = b[b["fixes"]]
    assert fix["swap"].str.endswith(f"with {len(culprits) - 1} more swaps").all(), fix["swap"]
    assert fix["evidence"].str.contains("is not shared").all()
    tried = [e for e in s.log if e.kind.value == "culprit_tried" and e.verification == sequence]
    assert len(tried) == len(b)
    dec = s.decisions.set_index(["method", "fqn"])
    assert set(dec[dec["culprit"].map(lambda c: sequence in c.split(", "))].index) == culprits
    assert s.verify(sequence=sequence)["ok"].tolist() == [True, False, False, False, False]  # swaps undone


@pytest.mark.parametrize("policy", ["no-sharing", "fingerprint", "name-only", "fqn-weight-cache"])
def test_blame_names_the_state_only_where_a_decode_is_wrong(built_sample, policy):
    s = toolkit.load_program(built_sample(SAMPLE), policy)
    for sequence in SEQUENCES:
        check_blame(s, policy, sequence)
    assert s.blame().empty  # standalone, nothing is wrong under any policy
    s.close()


@pytest.mark.parametrize("policy", ["fingerprint", "no-sharing"])
def test_repeatability_attributes_decode_next_to_the_state(built_sample, policy):
    """prefill and decode write at explicit positions: re-running one rewrites the same slots and
    its outputs repeat bit for bit, with or without resets.  decode_next moves along the cache
    every run: its outputs change unless the state is reset, and the cause names the cache
    buffers and the counter."""
    s = toolkit.load_program(built_sample(SAMPLE), policy)
    r = s.repeatability(runs=3).set_index("method")
    assert set(r.index) == {"prefill", "decode", "decode_next"}
    for m in r.index:
        assert set(r.loc[m, "buffers"].split(", ")) == STATE
        assert not r.loc[m, "changes_with_reset"]
    for m in ("prefill", "decode"):
        assert not r.loc[m, "changes_without_reset"] and r.loc[m, "cause"] == ""
    assert r.loc["decode_next", "changes_without_reset"]
    cause = r.loc["decode_next", "cause"]
    assert cause.startswith("state carried in mutated buffers") and all(f in cause for f in STATE), cause
    # the state carries between methods too: decode after prefill is not decode from the empty cache
    steps = read_sequence_reference(s.program, "generate")
    s.reset_state()
    alone = s.run("decode", steps[1][1])[0].clone()
    s.run("prefill", steps[0][1])
    after = s.run("decode", steps[1][1])[0].clone()
    assert torch.equal(alone, after) == (policy == "no-sharing")
    s.close()


def test_a_one_element_written_buffer_is_warned_about(tmp_path):
    """Why the sample's counter has two elements: the builder warns about a written buffer of one."""

    class Counter(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.register_buffer("count", torch.zeros(n, dtype=torch.int64))

        def forward(self, x):
            out = x + self.count[:1]
            self.count.add_(1)
            return out

    x = torch.zeros(1, dtype=torch.int64)
    with pytest.warns(UserWarning, match="buffer 'count' is written and has one element") as rec:
        toolkit.build_program({"one": (Counter(1), (x,)), "two": (Counter(2), (x,))}, tmp_path / "p", progress=False)
    assert [str(w.message).split(":")[0] for w in rec if "one element" in str(w.message)] == ["method 'one'"]


# -- on the GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("policy", toolkit.POLICIES)
def test_generation_under_every_policy_on_cuda(built_sample, policy):
    check_policy(built_sample(SAMPLE, "cuda"), policy)


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["no-sharing", "fingerprint"])
def test_blame_on_cuda(built_sample, policy):
    s = toolkit.load_program(built_sample(SAMPLE, "cuda"), policy)
    for sequence in SEQUENCES:
        check_blame(s, policy, sequence)
    s.close()


@pytest.mark.gpu
def test_repeatability_attributes_decode_next_to_the_state_on_cuda(built_sample):
    s = toolkit.load_program(built_sample(SAMPLE, "cuda"), "fingerprint")
    r = s.repeatability(runs=3).set_index("method")
    assert not r["changes_with_reset"].any(), r
    assert list(r.index[r["changes_without_reset"]]) == ["decode_next"], r
    s.close()


class _ScatterSum(torch.nn.Module):
    """Sums many float32 values into few bins (``index_add_``): on CUDA Inductor compiles it to
    atomic adds, whose order, and so whose rounding, changes from run to run."""

    def __init__(self, bins: int):
        super().__init__()
        self.bins = bins

    def forward(self, index, values):
        return torch.zeros(self.bins, device=values.device, dtype=values.dtype).index_add_(0, index, values)


@pytest.mark.gpu
def test_repeatability_names_nondeterministic_kernels_on_cuda(tmp_path):
    """GPU-only: on a CPU the same kernel is a sequential loop and repeats bit for bit."""
    g = torch.Generator().manual_seed(0)
    n = 1 << 20
    index = torch.randint(0, 4, (n,), generator=g)
    values = torch.randn(n, generator=g) * torch.logspace(-3, 3, n)[torch.randperm(n, generator=g)]
    p = toolkit.build_program(
        {"scatter": (_ScatterSum(4), (index, values))}, tmp_path / "p", device="cuda", progress=False
    )
    s = toolkit.load_program(p, "fingerprint")
    r = s.repeatability(runs=5).set_index("method")
    assert r.loc["scatter", "changes_with_reset"], r
    assert r.loc["scatter", "cause"].startswith("nondeterministic kernels"), r
    s.close()
