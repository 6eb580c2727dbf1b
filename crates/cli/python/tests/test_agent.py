"""LeaklabDebug as a service runs it: who it answers, what it refuses (and then changes nothing),
and everything else passed through untouched."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request
from typing import Any

import pytest
from conftest import call, client_for
from leaklab.asgi import LeaklabDebug

P = "/debug/leaklab"


async def hello(scope: Any, receive: Any, send: Any) -> None:
    """A bare ASGI app: every request it gets is answered 200 'app'."""
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"app"})


def doc(body: bytes) -> Any:
    return json.loads(body)


# --- who is answered -------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.1"])
def test_loopback_clients_are_answered(host: str) -> None:
    status, _, body = call(LeaklabDebug(hello), f"{P}/stats", client=(host, 1))
    assert status == 200 and doc(body)["schema"] == "leaklab.stats/1"


@pytest.mark.parametrize("client", [("10.1.2.3", 1), ("203.0.113.9", 1), ("testclient", 50000), None])
def test_other_clients_are_refused_with_what_to_do(client: Any) -> None:
    status, headers, body = call(LeaklabDebug(hello), f"{P}/stats", client=client)
    assert status == 403 and headers[b"content-type"] == b"application/json"
    error = doc(body)["error"]
    assert "loopback clients only" in error and "allow_networks" in error and "token" in error


def test_allowed_networks_are_answered_and_others_still_refused() -> None:
    app = LeaklabDebug(hello, allow_networks=["10.0.0.0/8", "fd00::/8"])
    assert call(app, f"{P}/stats", client=("10.200.0.1", 1))[0] == 200
    assert call(app, f"{P}/stats", client=("fd00::1", 1))[0] == 200
    assert call(app, f"{P}/stats", client=("192.168.0.1", 1))[0] == 403


def test_a_bearer_token_lets_any_client_in() -> None:
    app = LeaklabDebug(hello, token="s3cret-token")
    far = ("203.0.113.9", 1)
    auth = [(b"authorization", b"Bearer s3cret-token")]
    assert call(app, f"{P}/stats", client=far, headers=auth)[0] == 200
    status, headers, body = call(app, f"{P}/stats", client=far)
    assert status == 401 and headers[b"www-authenticate"].startswith(b"Bearer")
    assert "Authorization: Bearer" in doc(body)["error"]
    wrong = [(b"authorization", b"Bearer s3cret-tokem")]
    assert call(app, f"{P}/stats", client=far, headers=wrong)[0] == 401
    # Loopback needs no token, unless told otherwise (a reverse proxy on the same host).
    assert call(app, f"{P}/stats")[0] == 200
    strict = LeaklabDebug(hello, token="s3cret-token", allow_loopback=False)
    assert call(strict, f"{P}/stats")[0] == 401
    assert call(strict, f"{P}/stats", headers=auth)[0] == 200


def test_bad_options_are_refused_at_construction() -> None:
    for kwargs in (
        {"prefix": "debug"},
        {"prefix": "/"},
        {"token": " "},
        {"allow_networks": ["not-a-network"]},
        {"census_max_seconds": 0},
        {"census_max_depth": 0},
        {"record_memory_history": -1},
    ):
        with pytest.raises(ValueError):
            LeaklabDebug(hello, **kwargs)


# --- bad requests: a 4xx, a sentence, nothing changed ----------------------------------------------


def _unchanged(app: LeaklabDebug) -> tuple[Any, Any, Any]:
    stats = doc(call(app, f"{P}/stats")[2])
    return stats["last_census"], stats["history"], stats["census_running"]


@pytest.mark.parametrize(
    ("method", "path", "query", "status", "says"),
    [
        ("GET", f"{P}/nope", b"", 404, "no route /debug/leaklab/nope; leaklab answers"),
        ("GET", f"{P}/tensors/extra", b"", 404, "no route"),
        ("POST", f"{P}/tensors", b"", 405, "POST is not allowed on /debug/leaklab/tensors: use GET"),
        ("PUT", f"{P}/history", b"", 405, "use GET, POST, DELETE"),
        ("GET", f"{P}/tensors", b"max_seconds=abc", 400, "max_seconds must be a number"),
        ("GET", f"{P}/tensors", b"max_seconds=0", 400, "max_seconds must be more than 0"),
        ("GET", f"{P}/tensors", b"max_seconds=nan", 400, "max_seconds"),
        ("GET", f"{P}/tensors", b"max_depth=1.5", 400, "max_depth must be an integer"),
        ("GET", f"{P}/tensors", b"top=-1", 400, "top must be at least 0"),
        (
            "GET",
            f"{P}/tensors",
            b"depth=3",
            400,
            "unknown option 'depth'; this route takes max_seconds, max_depth, top",
        ),
        ("GET", f"{P}/tensors", b"top=1&top=2", 400, "option 'top' is given twice"),
        ("GET", f"{P}/tensors", b"top=\xff", 400, "cannot be read"),
        ("GET", f"{P}/tensors", b"top=%ff", 400, "top must be an integer"),
        ("GET", f"{P}/stats", b"x=1", 400, "unknown option 'x'; this route takes none"),
        ("POST", f"{P}/history", b"max_entries=0", 400, "max_entries must be at least 1"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_sentence_and_change_nothing(
    method: str, path: str, query: bytes, status: int, says: str
) -> None:
    app = LeaklabDebug(hello)
    before = _unchanged(app)
    got, headers, body = call(app, path, method=method, query=query)
    assert got == status and headers[b"content-type"] == b"application/json"
    assert says in doc(body)["error"]
    if status == 405:
        assert headers[b"allow"]
    assert _unchanged(app) == before


def test_cuda_routes_answer_409_without_cuda_and_point_at_the_census() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the 409s are for CPU-only processes")
    app = LeaklabDebug(hello)
    before = _unchanged(app)
    for method, path in (("GET", "snapshot"), ("POST", "history"), ("DELETE", "history")):
        status, _, body = call(app, f"{P}/{path}", method=method)
        assert status == 409
        error = doc(body)["error"]
        assert "CUDA is not available in this process" in error and f"GET {P}/tensors" in error
    assert _unchanged(app) == before
    history = doc(call(app, f"{P}/history")[2])
    assert history == {"recording": False, "max_entries": None, "since": None, "note": None}
    # Asked for at construction, recording says why it did not start, and nothing fails.
    noted = LeaklabDebug(hello, record_memory_history=1000, oom_snapshot_dir="/nonexistent/leaklab-oom")
    assert doc(call(noted, f"{P}/history")[2])["note"] == "CUDA is not available in this process"


def test_stats_are_cheap_figures() -> None:
    from leaklab.asgi import HistoryState, ProcessStats, StatsDoc

    app = LeaklabDebug(hello)
    stats = doc(call(app, f"{P}/stats")[2])
    assert set(stats) == StatsDoc.__required_keys__
    assert set(stats["process"]) == ProcessStats.__required_keys__
    assert set(stats["history"]) == HistoryState.__required_keys__
    assert stats["process"]["rss_bytes"] > 0 and stats["process"]["anonymous_bytes"] > 0
    assert stats["process"]["source"] == "/proc/self/status"
    assert stats["last_census"] is None and stats["census_running"] is False
    census = doc(call(app, f"{P}/tensors", query=b"top=3&max_seconds=10")[2])
    assert len(census["holders"]) <= 3
    last = doc(call(app, f"{P}/stats")[2])["last_census"]
    assert last["totals"] == census["totals"] and last["taken_at"] == census["taken_at"]
    assert last["holders"] == len(census["holders"]) + census["holders_omitted"]


def test_the_index_lists_the_routes() -> None:
    status, _, body = call(LeaklabDebug(hello), f"{P}/")
    assert status == 200 and f"GET {P}/tensors" in doc(body)["routes"]


def test_a_failing_census_is_a_500_not_an_exception_in_the_app(monkeypatch: Any) -> None:
    import leaklab.asgi

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("the walk fell over")

    monkeypatch.setattr(leaklab.asgi, "census", broken)
    app = LeaklabDebug(hello)
    status, _, body = call(app, f"{P}/tensors")
    assert status == 500 and "RuntimeError: the walk fell over" in doc(body)["error"]
    assert call(app, f"{P}/tensors")[0] == 500  # the lock was released
    assert call(app, "/v1/infer")[0] == 200


def test_one_census_at_a_time() -> None:
    app = LeaklabDebug(hello)
    app._census_lock.acquire()  # as if one were running
    try:
        status, _, body = call(app, f"{P}/tensors")
        assert status == 409 and "already running" in doc(body)["error"]
        assert doc(call(app, f"{P}/stats")[2])["census_running"] is True
    finally:
        app._census_lock.release()


# --- everything else, untouched --------------------------------------------------------------------


def test_other_paths_lifespan_and_websockets_reach_the_app_as_they_came() -> None:
    seen: list[tuple[Any, Any, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    wrapped = LeaklabDebug(app)

    async def receive() -> Any:
        return {}

    async def send(message: Any) -> None:
        raise AssertionError("the middleware must not answer these")

    scopes = [
        {"type": "lifespan", "asgi": {"version": "3.0"}},
        {"type": "websocket", "path": f"{P}/tensors", "client": ("203.0.113.9", 1)},
        {"type": "http", "path": "/v1/infer", "method": "POST", "client": ("203.0.113.9", 1)},
        {"type": "http", "path": "/debug/leaklabs", "method": "GET", "client": ("127.0.0.1", 1)},
        {"type": "http", "path": "/debug/leak", "method": "GET", "client": ("127.0.0.1", 1)},
    ]
    for scope in scopes:
        asyncio.run(wrapped(scope, receive, send))
    assert [s for s, _, _ in seen] == scopes
    assert all(s is scope and r is receive and x is send for (s, r, x), scope in zip(seen, scopes, strict=True))


def test_a_fastapi_app_keeps_its_lifespan_routes_and_streaming_bodies() -> None:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    events: list[str] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        events.append("startup")
        yield
        events.append("shutdown")

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(LeaklabDebug, token="t0ken")

    @app.get("/stream")
    def stream() -> StreamingResponse:
        return StreamingResponse((f"chunk {i}\n".encode() for i in range(50)), media_type="text/plain")

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    with client_for(app, host="203.0.113.9") as c:
        assert events == ["startup"]
        with c.stream("GET", "/stream") as r:
            chunks = list(r.iter_bytes())
        assert b"".join(chunks) == b"".join(f"chunk {i}\n".encode() for i in range(50))
        assert c.post("/echo", json={"a": [1, 2]}).json() == {"a": [1, 2]}
        assert c.get("/missing").status_code == 404 and c.get("/missing").json() == {"detail": "Not Found"}
        assert c.get(f"{P}/stats").status_code == 401
        assert c.get(f"{P}/stats", headers={"authorization": "Bearer t0ken"}).status_code == 200
    assert events == ["startup", "shutdown"]


def test_under_uvicorn_on_a_real_socket() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(LeaklabDebug(hello), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}{P}/stats", timeout=10) as r:
            assert r.status == 200 and json.load(r)["schema"] == "leaklab.stats/1"
        with urllib.request.urlopen(f"{base}/anything", timeout=10) as r:
            assert r.read() == b"app"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


# --- the CUDA routes' wiring, without a GPU ---------------------------------------------------------


def _fake_torch(calls: list[Any]) -> Any:
    """A stand-in for torch with CUDA in use: the calls the agent makes, recorded."""
    from types import SimpleNamespace

    snapshot = {"segments": [{"address": 1, "total_size": 2 << 20, "blocks": []}], "device_traces": [[]]}

    def record(**kwargs: Any) -> None:
        calls.append(("record", kwargs))

    def attach(observer: Any) -> None:
        calls.append(("attach", observer))

    stats = {"allocated_bytes.all.current": 5, "reserved_bytes.all.current": 8, "num_ooms": 1}
    memory = SimpleNamespace(_snapshot=lambda: snapshot, _record_memory_history=record)
    cuda = SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        device_count=lambda: 1,
        memory_stats=lambda index: stats,
        memory=memory,
    )
    return SimpleNamespace(cuda=cuda, _C=SimpleNamespace(_cuda_attach_out_of_memory_observer=attach)), snapshot


def test_the_calls_match_torch_2_11s_signatures() -> None:
    import inspect

    import torch

    memory = torch.cuda.memory
    inspect.signature(memory._record_memory_history).bind(
        enabled="all", context="all", stacks="python", max_entries=100_000
    )
    inspect.signature(memory._record_memory_history).bind(enabled=None)
    inspect.signature(memory._snapshot).bind()
    assert callable(torch._C._cuda_attach_out_of_memory_observer)


def test_with_cuda_in_use_the_snapshot_is_the_pickle_and_history_starts_and_stops(
    monkeypatch: Any, tmp_path: Any
) -> None:
    import pickle
    import sys

    calls: list[Any] = []
    fake, snapshot = _fake_torch(calls)
    monkeypatch.setitem(sys.modules, "torch", fake)
    app = LeaklabDebug(hello, record_memory_history=5000, oom_snapshot_dir=str(tmp_path), oom_snapshot_limit=1)
    assert calls[0] == ("record", {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000})
    status, headers, body = call(app, f"{P}/snapshot")
    assert status == 200 and headers[b"content-type"] == b"application/octet-stream"
    assert pickle.loads(body) == snapshot  # what torch.cuda.memory._dump_snapshot writes
    assert headers[b"content-disposition"].startswith(b'attachment; filename="leaklab-')
    state = doc(call(app, f"{P}/history")[2])
    assert state["recording"] is True and state["max_entries"] == 5000
    assert doc(call(app, f"{P}/history", method="POST", query=b"max_entries=77")[2])["max_entries"] == 77
    assert calls[-1] == ("record", {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 77})
    assert doc(call(app, f"{P}/history", method="DELETE")[2])["recording"] is False
    assert calls[-1] == ("record", {"enabled": None})
    device = doc(call(app, f"{P}/stats")[2])["cuda"]["devices"][0]
    assert device["device"] == "cuda:0" and (device["allocated_bytes"], device["reserved_bytes"]) == (5, 8)
    assert device["ooms"] == 1 and device["alloc_retries"] == 0
    # The out-of-memory observer writes one snapshot (the limit), atomically named.
    observer = next(c[1] for c in calls if c[0] == "attach")
    observer(0, 1 << 30, 7 << 30, 1 << 20)
    observer(0, 1 << 30, 7 << 30, 1 << 20)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 1 and written[0].startswith("oom-") and written[0].endswith(".pickle")
    assert pickle.loads((tmp_path / written[0]).read_bytes()) == snapshot
