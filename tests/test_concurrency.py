"""Loading methods of one program from 8 threads into ONE session and cache.

The upstream backend guards its process-wide cache with a mutex; here the cache's lock
serialises whole method loads.  Every thread tries every method in its own random order
and all start together, so each method is raced by all 8 threads: exactly one load of it
must win, the others must be told it is already loaded, and the result must be the
decisions of a serial load in the order the loads actually happened (decisions depend on
order: the first method with an FQN loads it, later ones share or decline).
"""

from __future__ import annotations

import random
import threading

import pytest

from toolkit.core.errors import LoadError
from toolkit.core.policies import get_policy
from toolkit.engine.devices import resolve_devices
from toolkit.engine.session import Session

THREADS = 8
REPEATS = 4
POLICY_SET = ["name-only", "decline-on-mismatch", "verify-always", "fingerprint", "content-dedup"]
# three methods (genuine share + collision) under every sharing policy; the real Llama
# architecture (22 shared constants) under the default policy
CASES = [("three_methods", p) for p in POLICY_SET] + [("llama_prefill_decode", "fingerprint")]
VOLATILE = {"seq"}


def _session(program, policy: str) -> Session:
    return Session(program, get_policy(policy), resolve_devices(program, None))


def _by_key(decisions) -> dict:
    cols = [c for c in decisions.columns if c not in VOLATILE]
    rows = decisions[cols].to_dict("records")
    keyed = {(r["method"], r["name"]): r for r in rows}
    assert len(keyed) == len(rows), "a (method, constant) was decided twice"
    return keyed


def _run_in_threads(worker, start: threading.Barrier) -> None:
    """Run ``worker(i)`` for i in range(THREADS), each in its own thread; fail if any raised or hung.

    An exception in a thread never reaches the test by itself (threading prints it and the
    thread ends, and the test would pass), so each one is caught here and raised again in
    the test's own thread.
    """
    errors: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        try:
            worker(i)
        except BaseException as e:  # noqa: BLE001 - any exception in a worker fails the test below
            with lock:
                errors.append((i, e))
            start.abort()  # the other threads must not wait at the barrier for this one forever

    threads = [threading.Thread(target=run, args=(i,), name=f"worker-{i}") for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        i, first = errors[0]  # the first to fail; the others may only have found the barrier broken
        raise AssertionError(
            f"{len(errors)} of {THREADS} worker threads raised; thread {i} first: {first!r}"
        ) from first


def _concurrent_load(program, policy: str, seed: int) -> tuple[Session, dict[str, list[str]]]:
    s = _session(program, policy)
    names = program.method_names
    start = threading.Barrier(THREADS)
    outcomes: dict[str, list[str]] = {m: [] for m in names}
    lock = threading.Lock()

    def worker(i: int) -> None:
        order = list(names)
        random.Random(seed * 100 + i).shuffle(order)
        start.wait()
        for m in order:
            try:
                s.load_method(m)
                result = "loaded"
            except LoadError as e:
                result = "already" if "already loaded" in str(e) else f"error: {e}"
            with lock:
                outcomes[m].append(result)

    _run_in_threads(worker, start)
    return s, outcomes


@pytest.mark.parametrize("sample, policy", CASES)
def test_eight_threads_give_the_serial_decisions(built_sample, sample, policy):
    program = built_sample(sample)
    for rep in range(REPEATS):
        s, outcomes = _concurrent_load(program, policy, seed=rep)
        for m, results in outcomes.items():
            assert sorted(results) == ["already"] * (THREADS - 1) + ["loaded"], (m, results)
        order = list(s.methods)  # insertion order = the order the serialised loads completed
        assert sorted(order) == sorted(program.method_names)

        serial = _session(program, policy)
        for m in order:
            serial.load_method(m)
        assert _by_key(s.decisions) == _by_key(serial.decisions), f"rep {rep}, order {order}"
        assert {(e.fqn, e.owner_method, frozenset(e.users)) for e in s.cache} == {
            (e.fqn, e.owner_method, frozenset(e.users)) for e in serial.cache
        }
        got = s.verify()[["method", "ran", "ok"]].to_dict("records")
        assert got == serial.verify()[["method", "ran", "ok"]].to_dict("records")
        s.close()
        serial.close()
        assert len(s.cache) == 0


def test_threads_run_loaded_methods_concurrently(built_sample):
    """run() from 8 threads on methods that share tensors gives the serial outputs."""
    import torch

    program = built_sample("three_methods")
    s = _session(program, "fingerprint")
    s.load()
    expected = {m: [o.clone() for o in s.run(m)] for m in s.methods}
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def worker(i: int) -> None:
        start.wait()
        for k in range(20):
            m = program.method_names[(i + k) % len(program.methods)]
            out = s.run(m)
            if not all(torch.equal(a, b) for a, b in zip(out, expected[m])):
                failures.append(m)

    _run_in_threads(worker, start)
    assert not failures
