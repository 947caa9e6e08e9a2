"""Lifetimes: shared tensors stay valid whichever method is unloaded first.

Tensors extracted from an AOTInductor container alias its memory and dangle once it is
destroyed (background.md); a container that received them user-managed then reads freed
memory.  Under the whole-blob policies the cache entry keeps the owning container alive;
under the per-constant policies the toolkit owns the tensor.  Either way, unloading the
owner first must leave the other methods producing exactly the outputs they produced
before.  Freed memory is scribbled over (allocations of the same sizes filled with NaN)
before the survivors run, so a dangling read would show up as a different output.
"""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from toolkit.core.policies import POLICIES, get_policy
from toolkit.engine.devices import resolve_devices
from toolkit.engine.session import Session

SHARING = [p for p in POLICIES if p != "no-sharing"]


def _loads(sample: str, policy: str) -> bool:
    from toolkit.build.samples import sample_module

    return sample_module(sample).EXPECTED[policy].loaded  # fqn-weight-cache: 1.5.x refuses three_methods


LIFETIME_CASES = [(s, p) for s in ("three_methods", "llama_prefill_decode") for p in SHARING if _loads(s, p)]


def _load(program, policy: str, device: str) -> Session:
    s = Session(program, get_policy(policy), resolve_devices(program, device))
    s.load()
    assert s.status == "loaded", s.error
    return s


def _outputs(s: Session, m: str) -> list[torch.Tensor]:
    return [o.detach().cpu().clone() for o in s.run(m)]


def _scribble(nbytes: list[int], device: str) -> list[torch.Tensor]:
    """Allocate and poison memory the size of what was freed, to reuse it if it was freed."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    junk = []
    for n in nbytes * 4:
        t = torch.empty(max(n // 4, 1), dtype=torch.float32, device=device)
        t.fill_(float("nan"))
        junk.append(t)
    return junk


def _owner_first_orders(s: Session) -> list[tuple[str, ...]]:
    """Every unload order that starts with a method owning an entry another method uses."""
    owners = {e.owner_method for e in s.cache if len(e.users) > 1}
    return [order for order in itertools.permutations(s.methods) if order[0] in owners]


def check_owner_unloaded_first(program, policy: str, device: str) -> int:
    probe = _load(program, policy, device)
    orders = _owner_first_orders(probe)
    probe.close()
    assert orders, f"{policy}: nothing is shared, the sample cannot show a lifetime problem"
    for order in orders:
        s = _load(program, policy, device)
        before = {m: _outputs(s, m) for m in s.methods}
        shared_bytes = [e.nbytes for e in s.cache]
        blob_bytes = [lm.whole_blob_bytes for lm in s.methods.values() if lm.whole_blob_bytes]
        for i, gone in enumerate(order[:-1]):
            s.unload(gone)
            # entries the gone method produced are still there while someone uses them
            for e in s.cache:
                assert e.users and e.users <= set(s.methods), (e.fqn, e.users)
                if e.owner_method == gone:
                    assert e.owner_kind == "toolkit" or e.keepalive is not None
            junk = _scribble(shared_bytes + blob_bytes, device)
            for m in order[i + 1 :]:
                after = _outputs(s, m)
                for a, b in zip(after, before[m]):
                    assert torch.equal(a, b), f"{policy}: {m} changed after unloading {order[: i + 1]}"
            del junk
        s.unload(order[-1])
        assert len(s.cache) == 0 and not s.methods
    return len(orders)


@pytest.mark.parametrize("sample,policy", LIFETIME_CASES)
def test_unload_owner_first_cpu(built_sample, sample, policy):
    assert check_owner_unloaded_first(built_sample(sample), policy, "cpu") >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("sample,policy", LIFETIME_CASES)
def test_unload_owner_first_cuda(built_sample, sample, policy):
    assert check_owner_unloaded_first(built_sample(sample, device="cuda"), policy, "cuda") >= 1


def test_running_an_unloaded_method_is_a_load_error(built_sample):
    from toolkit.core.errors import LoadError

    s = _load(built_sample("three_methods"), "fingerprint", "cpu")
    s.unload("encode")
    with pytest.raises(LoadError, match="not loaded"):
        s.run("encode")
    with pytest.raises(LoadError, match="not loaded"):
        s.unload("encode")
    v = s.verify().set_index("method")
    assert v.loc["encode", "reason"] == "not loaded" and bool(v.loc["encode_again", "ok"])
