"""The census on a real FastAPI + PyTorch service: every kind of holder named, its growth per request exact.

One warm-up, a census, ten more requests of each kind, a second census (both through the
middleware's route, as ``leaklab scan --agent`` takes them). Storage bytes are exact, so the
growth per request is asserted to the byte: 1,024 bytes (a 4 x 64 float32 output) per request
for each leak, 3,072 graph bytes and 7 graph nodes per request for the accumulated statistic.
"""

from __future__ import annotations

import gc
import logging.handlers
from typing import Any

import pytest
from conftest import client_for
from leaklab.census import census_diff

WARMUP, N = 3, 10


def _expected() -> dict[str, tuple[str, str]]:
    import leaky_service as svc

    line = svc.batcher_loop.__code__.co_firstlineno
    return {
        "history": ("leaky_service.HISTORY", "module global"),
        "state": ("leaky_service.app.state.responses", "module global"),
        # A closure is named by where it is kept, then by its function.
        "closure": ("leaky_service.HANDLE → build_handler.<locals>.handle → cell 'outputs'", "closure"),
        # A hook by the module it is registered on (as state_dict names it).
        "hook": ("leaky_service.app.state.model.2._forward_hooks[…] → make_hook.<locals>.hook → cell 'x'", "closure"),
        "class": ("leaky_service.Recorder.buffer", "class attribute"),
        "log": ("logging 'leaky_service.audit' MemoryHandler.buffer[…].args", "log records"),
        "thread": (f"thread 'batcher' batcher_loop (leaky_service.py:{line}) local 'pending'", "frame"),
        "cycle": ("unreachable cycle (awaiting gc): leaky_service.Node.t", "unreachable cycle"),
        "native": ("held from native code (no Python referrer)", "native"),
    }


@pytest.fixture(scope="module")
def censuses() -> tuple[dict[str, Any], dict[str, Any]]:
    import leaky_service as svc

    kinds = [*_expected(), "graph"]
    enabled = gc.isenabled()
    gc.disable()  # the cycles must still be there at the second census: the census never collects
    thread = svc.start_batcher()
    # pytest's log capture adds its handlers to loggers that do not propagate, and keeps every
    # record too: leave the audit records to the service's own MemoryHandler.
    svc.AUDIT.handlers[:] = [h for h in svc.AUDIT.handlers if type(h) is logging.handlers.MemoryHandler]
    try:
        with client_for(svc.app) as c:

            def send(kind: str, seeds: range) -> None:
                for seed in seeds:
                    r = c.post(f"/leak/{kind}", params={"seed": seed})
                    assert r.status_code == 200, r.text
                    if kind == "thread":
                        assert svc.BATCHED.acquire(timeout=10), "the batcher thread did not take the tensor"

            for kind in kinds:
                send(kind, range(WARMUP))
            send("bounded", range(10))  # the deque (maxlen 8) is full from here on
            before = c.get("/debug/leaklab/tensors").json()
            for kind in [*kinds, "bounded"]:
                send(kind, range(100, 100 + N))
            after = c.get("/debug/leaklab/tensors").json()
    finally:
        svc.INBOX.put(None)
        thread.join(10)
        if enabled:
            gc.enable()
    return before, after


def _holder(doc: dict[str, Any], name: str) -> dict[str, Any]:
    for h in doc["holders"]:
        if h["holder"] == name:
            return h
    names = "\n  ".join(h["holder"] for h in doc["holders"])
    raise AssertionError(f"no holder {name!r} in the census; it has:\n  {names}")


@pytest.mark.parametrize("kind", list(_expected()))
def test_each_kind_of_holder_is_named_with_its_growth_per_request(kind: str, censuses: Any) -> None:
    import leaky_service as svc

    before, after = censuses
    name, holder_kind = _expected()[kind]
    a, b = _holder(before, name), _holder(after, name)
    assert b["kind"] == holder_kind
    assert (b["bytes"] - a["bytes"]) / N == svc.OUT_BYTES  # 1,024 bytes a request, exactly
    assert b["tensors"] - a["tensors"] == N
    assert b["devices"] == {"cpu": b["bytes"]} and b["dtypes"] == {"float32": b["tensors"]}
    assert [svc.ROWS, svc.FEATURES] in b["shapes"]


def test_an_accumulated_statistic_is_one_tensor_whose_graph_grows(censuses: Any) -> None:
    import leaky_service as svc

    before, after = censuses
    a, b = _holder(before, "leaky_service.PIPELINE.acc"), _holder(after, "leaky_service.PIPELINE.acc")
    assert (a["tensors"], b["tensors"]) == (1, 1) and b["graph"]["tensors"] == 1
    assert b["kind"] == "module global"
    assert (b["graph"]["nodes"] - a["graph"]["nodes"]) / N == svc.GRAPH_NODES  # 7 nodes a request
    assert (b["graph"]["saved_bytes"] - a["graph"]["saved_bytes"]) / N == svc.GRAPH_SAVED_BYTES  # 3,072 B
    assert b["graph"]["saved_tensors"] - a["graph"]["saved_tensors"] == 2 * N


def test_a_full_bounded_deque_does_not_grow(censuses: Any) -> None:
    import leaky_service as svc

    before, after = censuses
    a, b = _holder(before, "leaky_service.RECENT"), _holder(after, "leaky_service.RECENT")
    assert a["tensors"] == b["tensors"] == 8
    assert a["bytes"] == b["bytes"] == 8 * svc.OUT_BYTES
    assert "leaky_service.RECENT" not in {g["holder"] for g in census_diff(before, after, N)["grown"]}


def test_the_diff_names_the_leaks_and_nothing_else(censuses: Any) -> None:
    before, after = censuses
    grown = {g["holder"]: g for g in census_diff(before, after, N)["grown"]}
    expected = {name for name, _ in _expected().values()} | {"leaky_service.PIPELINE.acc"}
    assert set(grown) == expected
    assert after["complete"] and after["stopped_early"] is None
    assert after["schema"] == "leaklab.census/1" and after["objects"] > after["totals"]["tensors"]
