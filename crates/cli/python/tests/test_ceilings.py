"""An agent no client can stall: the owner's ceilings, a deadline kept in every phase of the census,
the event loop served meanwhile, the collector off only in short slices, free-threaded CPython refused."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import time
from typing import Any

import leaklab.census
import pytest
import torch
from conftest import call
from leaklab import _naming, _unreached
from leaklab.asgi import LeaklabDebug
from leaklab.census import CensusError, census

P = "/debug/leaklab"


async def hello(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


def doc(body: bytes) -> Any:
    return json.loads(body)


# --- the owner's options are ceilings ----------------------------------------------------------------


def test_a_client_may_ask_for_less_never_more() -> None:
    app = LeaklabDebug(hello, census_max_seconds=5, census_max_depth=200)
    for query, says in (
        (b"max_seconds=600", "max_seconds must be more than 0 and at most 5, not 600.0"),
        (b"max_seconds=5.01", "at most 5, not 5.01"),
        (b"max_depth=1000000", "max_depth must be at least 1 and at most 200, not 1000000"),
    ):
        status, _, body = call(app, f"{P}/tensors", query=query)
        assert status == 400, body
        error = doc(body)["error"]
        assert says in error and "the ceiling this service's LeaklabDebug was given" in error, error
    # A mistake that is not about the ceiling does not blame it.
    error = doc(call(app, f"{P}/tensors", query=b"max_seconds=soon")[2])["error"]
    assert "must be a number" in error and "ceiling" not in error, error
    asked = doc(call(app, f"{P}/tensors", query=b"max_seconds=2&max_depth=50&top=1")[2])
    assert (asked["max_seconds"], asked["max_depth"]) == (2.0, 50)
    default = doc(call(app, f"{P}/tensors", query=b"top=1")[2])
    assert (default["max_seconds"], default["max_depth"]) == (5.0, 200)


def test_the_history_ring_is_bounded_by_its_owner() -> None:
    app = LeaklabDebug(hello)
    status, _, body = call(app, f"{P}/history", method="POST", query=b"max_entries=100000000")
    assert status == 400 and "at most 100000, not 100000000" in doc(body)["error"]
    with pytest.raises(ValueError, match="history_max_entries must be at least 1 and at most 1e\\+06"):
        LeaklabDebug(hello, history_max_entries=10_000_000)
    with pytest.raises(ValueError, match="record_memory_history must be at least 0 and at most 1000"):
        LeaklabDebug(hello, history_max_entries=1000, record_memory_history=5000)
    with pytest.raises(ValueError, match="snapshot_max_bytes"):
        LeaklabDebug(hello, snapshot_max_bytes=0)


# --- the deadline, in every phase ---------------------------------------------------------------------


def _late_from(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, bounds_of: Any) -> list[float]:
    """Make the census's time run out as ``owner.name`` starts: that phase must see it and stop.

    Returns a list that gets the moment the time ran out, and the process's CPU time then.
    """
    original = getattr(owner, name)
    when: list[float] = []

    def late(*args: Any, **kwargs: Any) -> Any:
        bounds = bounds_of(*args, **kwargs)
        if not when:
            when.extend((time.perf_counter(), time.process_time()))
            bounds.deadline = bounds.walk_deadline = when[0]
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, late)
    return when


KEEP: list[Any] = []


@pytest.fixture(scope="class")
def tensors_and_garbage() -> Any:
    """Named tensors, and cycles holding tensors that await the collector (kept off meanwhile);
    with the full census of them and its CPU time.

    Made once for the six phases (each of which reads the heap and changes nothing: a census
    never collects), not once each: a full census here is 0.6 s of CPU, measured 0.595 to
    0.657 s in one run of the six, so one reading serves as each phase's reference.
    """

    class Node:
        pass

    KEEP.extend({"t": torch.zeros(4)} for _ in range(3000))
    gc.disable()
    for _ in range(3000):
        a, b = Node(), Node()
        a.other, b.other, a.t = b, a, torch.zeros(2)  # type: ignore[attr-defined]
    del a, b
    cpu = time.process_time()
    full = census()
    yield full, time.process_time() - cpu
    KEEP.clear()
    gc.enable()
    gc.collect()


class TestEachPhaseKeepsTheDeadline:
    """The heap above, a full census of it, and each phase made late in turn."""

    @pytest.mark.parametrize(
        ("owner", "name", "bounds_of", "says"),
        [
            (leaklab.census, "listed_tensors", lambda kinds, bounds: bounds, "objects were searched for tensors"),
            (leaklab.census, "walk", lambda *a: a[-1], "the walk had reached"),
            (_naming.Namer, "holders", lambda *a: a[-1], "reached tensors were named"),
            (leaklab.census._Census, "count", lambda self, *a: self.bounds, "tensors were counted"),
            (_unreached.Unreached, "referrers", lambda self, *a: self.bounds, "referrers of"),
            (_unreached.Unreached, "refcounts", lambda self, *a: self.bounds, "unreached objects were sorted"),
        ],
    )
    def test_each_phase_keeps_the_deadline(
        self,
        monkeypatch: pytest.MonkeyPatch,
        tensors_and_garbage: Any,
        owner: Any,
        name: str,
        bounds_of: Any,
        says: str,
    ) -> None:
        full, full_cpu = tensors_and_garbage
        assert full["complete"] and full["totals"]["tensors"] >= 6000, full["stopped_early"]
        cycles = [h for h in full["holders"] if h["kind"] == "unreachable cycle"]
        assert sum(h["tensors"] for h in cycles) == 3000, cycles
        when = _late_from(monkeypatch, owner, name, bounds_of)
        cut = census(max_seconds=5)
        overrun = time.process_time() - when[1]
        assert not cut["complete"]
        assert cut["stopped_early"] is not None and cut["stopped_early"].startswith("max_seconds: ")
        assert says in cut["stopped_early"], cut["stopped_early"]
        print(f"{name}: {overrun * 1000:.1f} ms of CPU after the deadline (the full census: {full_cpu:.3f} s)")
        # One slice of work after the deadline, the lists given back and the document written. In
        # CPU time, not wall time: the suite shares its cores with other tests, and a wall clock
        # counts the time this process waited for a core (a failure under a load of 10).
        assert overrun < 0.1 * full_cpu, (overrun, full_cpu)
        assert cut["totals"]["tensors"] <= full["totals"]["tensors"]


def test_the_graph_walk_keeps_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = torch.zeros(1, requires_grad=True)
    for _ in range(3000):
        acc = acc + 1
    KEEP.append(acc)
    try:
        _late_from(monkeypatch, leaklab.census._Census, "graphs", lambda self, *a: self.bounds)
        cut = census(max_seconds=5)
        assert cut["stopped_early"] is not None and "autograd graph nodes were walked" in cut["stopped_early"]
        assert cut["totals"]["graph_nodes"] < 3000
    finally:
        KEEP.clear()


# --- free-threaded CPython ----------------------------------------------------------------------------


def test_free_threaded_cpython_is_refused_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leaklab.census, "_gil_enabled", lambda: False)
    with pytest.raises(CensusError, match=r"free-threaded CPython with the GIL off.*PYTHON_GIL=1"):
        census()
    status, _, body = call(LeaklabDebug(hello), f"{P}/tensors")
    assert status == 409 and "free-threaded CPython" in doc(body)["error"]


def test_the_gil_check_reads_sys(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    assert leaklab.census._gil_enabled() is False
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    assert leaklab.census._gil_enabled() is True


# --- a million objects, a real event loop beside the census --------------------------------------------


def _serve_with_a_ticker(app: Any, query: bytes, period: float = 0.001) -> dict[str, Any]:
    """One request through ``app`` on a running asyncio loop that ticks every ``period`` meanwhile.

    Returns the answer, the request's wall time, the longest wait between two ticks, and the
    longest stretch the ticks saw the collector off; the same loop ticking alone first, as long.
    """

    async def ticker(ticks: list[tuple[float, bool]], stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append((time.perf_counter(), gc.isenabled()))
            await asyncio.sleep(period)

    def longest(ticks: list[tuple[float, bool]]) -> tuple[float, float]:
        gap = max(b[0] - a[0] for a, b in itertools.pairwise(ticks))
        off, since = 0.0, None
        for at, enabled in ticks:
            if not enabled and since is None:
                since = at
            elif enabled and since is not None:
                off, since = max(off, at - since), None
        return gap, off

    async def main() -> dict[str, Any]:
        alone: list[tuple[float, bool]] = []
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(alone, stop))
        await asyncio.sleep(0.5)
        stop.set()
        await task
        ticks: list[tuple[float, bool]] = []
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(ticks, stop))
        await asyncio.sleep(0.05)
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "GET",
            "path": f"{P}/tensors",
            "query_string": query,
            "headers": [],
            "client": ("127.0.0.1", 1),
        }
        started = time.perf_counter()
        await app(scope, receive, send)
        wall = time.perf_counter() - started
        await asyncio.sleep(0.05)
        stop.set()
        await task
        during = [t for t in ticks if started <= t[0] <= started + wall + 0.01]
        return {
            "status": sent[0]["status"],
            "body": b"".join(m.get("body", b"") for m in sent[1:]),
            "wall": wall,
            "ticks": len(during),
            "gap": longest(ticks)[0],
            "collector_off": longest(ticks)[1],
            "gap_alone": longest(alone)[0],
        }

    return asyncio.run(main())


def test_on_a_million_objects_the_ceiling_holds_and_the_loop_keeps_ticking() -> None:
    base = len(gc.get_objects())
    # Records with a tensor each, and plain lists, to a million tracked objects in all.
    records = [{"id": i, "t": torch.zeros(4)} for i in range(20_000)]
    heap = [[i] for i in range(1_000_000 - base - len(records))]
    # As in a service that has run a while: the full collection the new heap is due is done.
    gc.collect()
    objects = len(gc.get_objects())
    try:
        ceiling = 0.5  # the full census of this heap takes about 1 s here: the ceiling must stop it
        app = LeaklabDebug(hello, census_max_seconds=ceiling)
        refused = _serve_with_a_ticker(app, b"max_seconds=600")
        assert refused["status"] == 400 and "at most 0.5" in doc(refused["body"])["error"]
        excess = []
        # Up to three censuses: the ceiling must hold in each. The event loop's longest wait is
        # judged beside the longest the same loop waited alone just before (the OS's own share:
        # on this shared 2-core machine it pauses a thread holding the GIL too), at the best of
        # the runs: measured idle, the loop waited 22 to 41 ms beside the census (alone 3 to 9 ms);
        # at a load of 9, 48 to 85 ms (alone 14 to 20 ms); at 16, over 100 ms, as the old census.
        for _ in range(3):
            served = _serve_with_a_ticker(app, b"top=5")
            assert served["status"] == 200
            got = doc(served["body"])
            print(
                f"\n{objects:,} objects, ceiling {ceiling} s: census {got['seconds']:.3f} s "
                f"(request {served['wall']:.3f} s), stopped: {got['stopped_early']}; "
                f"the loop: {served['ticks']} ticks, longest wait {served['gap'] * 1000:.1f} ms "
                f"(alone {served['gap_alone'] * 1000:.1f} ms), collector seen off at most "
                f"{served['collector_off'] * 1000:.1f} ms; phases {got['phases']}"
            )
            assert got["max_seconds"] == ceiling and not got["complete"]
            # Measured: 0.495 to 0.521 s (one slice past the deadline, then the lists given back).
            assert got["seconds"] <= 1.1 * ceiling, got["seconds"]
            excess.append(served["gap"] - served["gap_alone"])
            if excess[-1] < 0.050:
                break
        assert min(excess) < 0.050, excess
    finally:
        del heap, records


# --- the snapshot and the history ring, through a stand-in for torch's CUDA calls --------------------


@pytest.fixture
def cuda_in_use(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """torch.cuda's functions the agent calls, replaced: CUDA in use, a 3 MiB snapshot, calls recorded."""
    state: dict[str, Any] = {
        "snapshot": {
            "segments": [
                {"address": i, "total_size": 2 << 20, "blocks": [i.to_bytes(4, "little") * 250]} for i in range(3200)
            ]
        },
        "calls": [],
        "gate": None,
    }

    def snapshot() -> Any:
        if state["gate"] is not None:
            state["gate"].wait(10)
        return state["snapshot"]

    def record(**kwargs: Any) -> None:
        state["calls"].append(kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", snapshot)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
    return state


def _raw(app: Any, path: str, method: str = "GET", query: bytes = b"") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query, "client": ("127.0.0.1", 1)}
    asyncio.run(app(scope, receive, send))
    return sent


def test_the_snapshot_is_streamed_from_a_file_in_chunks(cuda_in_use: dict[str, Any]) -> None:
    import pickle

    app = LeaklabDebug(hello)
    sent = _raw(app, f"{P}/snapshot")
    start, bodies = sent[0], sent[1:]
    assert start["status"] == 200
    body = b"".join(m["body"] for m in bodies)
    assert pickle.loads(body) == cuda_in_use["snapshot"]
    assert int(dict(start["headers"])[b"content-length"]) == len(body) > 3 << 20
    # Chunks of 1 MiB, every one but the last saying more follows: never the whole pickle at once.
    assert len(bodies) == -(-len(body) // (1 << 20)) >= 4
    assert all(len(m["body"]) <= 1 << 20 for m in bodies)
    assert [m["more_body"] for m in bodies] == [True] * (len(bodies) - 1) + [False]
    assert not app._cuda_lock.locked()


def test_a_snapshot_over_the_owners_cap_is_refused_and_nothing_is_left(
    cuda_in_use: dict[str, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    app = LeaklabDebug(hello, snapshot_max_bytes=1 << 20)
    status, _, body = call(app, f"{P}/snapshot")
    error = doc(body)["error"]
    assert status == 409 and "larger than snapshot_max_bytes (1,048,576 bytes" in error, error
    assert "fewer max_entries" in error
    assert not app._cuda_lock.locked() and list(tmp_path.iterdir()) == []


def test_one_snapshot_or_history_change_at_a_time(cuda_in_use: dict[str, Any]) -> None:
    app = LeaklabDebug(hello)
    app._cuda_lock.acquire()  # as if a snapshot were being streamed
    try:
        for method, route in (("GET", "snapshot"), ("POST", "history"), ("DELETE", "history")):
            status, _, body = call(app, f"{P}/{route}", method=method)
            assert status == 409 and "already under way" in doc(body)["error"], (route, body)
        assert cuda_in_use["calls"] == []
        assert call(app, f"{P}/history")[0] == 200  # reading the state needs no turn
    finally:
        app._cuda_lock.release()
    assert doc(call(app, f"{P}/history", method="POST", query=b"max_entries=100000")[2])["max_entries"] == 100_000
    assert cuda_in_use["calls"][-1]["max_entries"] == 100_000
    assert doc(call(app, f"{P}/history", method="DELETE")[2])["recording"] is False
    assert cuda_in_use["calls"][-1] == {"enabled": None}


def test_a_client_that_leaves_mid_snapshot_gives_the_turn_back(cuda_in_use: dict[str, Any]) -> None:
    import threading

    cuda_in_use["gate"] = gate = threading.Event()
    app = LeaklabDebug(hello)

    async def leave() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            raise AssertionError("the client left before any answer")

        scope = {"type": "http", "method": "GET", "path": f"{P}/snapshot", "query_string": b"", "client": ("::1", 1)}
        task = asyncio.create_task(app(scope, receive, send))
        await asyncio.sleep(0.2)  # the worker thread waits on the gate, the lock held
        assert app._cuda_lock.locked()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave())  # asyncio.run waits for the worker thread
    gate.set()
    deadline = time.monotonic() + 10
    while app._cuda_lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not app._cuda_lock.locked()
