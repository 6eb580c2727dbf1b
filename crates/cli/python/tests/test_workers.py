"""The workers of one server summed through a shared folder (``workers_dir``): each worker writes
its counts and memory there once it serves, ``stats`` sums the live ones and leaves out the dead
and the stale, and a real two-worker uvicorn server is counted whole, each worker's agent reachable
on a port of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from conftest import call
from leaklab.asgi import LeaklabDebug

P = "/debug/leaklab"
HERE = Path(__file__).resolve().parent


async def hello(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


def stats(app: LeaklabDebug) -> Any:
    status, _, body = call(app, f"{P}/stats")
    assert status == 200
    return json.loads(body)


def wait_for(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time given"
        time.sleep(0.02)


def test_without_a_folder_stats_have_no_workers(monkeypatch: Any) -> None:
    monkeypatch.delenv("LEAKLAB_WORKERS_DIR", raising=False)
    assert stats(LeaklabDebug(hello))["workers"] is None


def test_a_worker_writes_once_it_serves_and_stats_sum_the_live_workers_only(tmp_path: Path) -> None:
    app = LeaklabDebug(hello, workers_dir=str(tmp_path), workers_period=0.02)
    time.sleep(0.2)
    assert list(tmp_path.iterdir()) == [], "a process that has served nothing (a preloading master) writes nothing"
    for _ in range(3):
        assert call(app, "/work")[0] == 200
    me = tmp_path / f"{os.getpid()}.json"
    wait_for(me.exists)
    # Another live worker (this test's parent stands in for it), a dead one, a stale one.
    now = time.time()
    other = {"pid": os.getppid(), "updated_at": now, "started": 11, "answered": 10}
    other |= {"rss_bytes": 7, "anonymous_bytes": 5}
    (tmp_path / f"{os.getppid()}.json").write_text(json.dumps(other))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"{dead.pid}.json").write_text(json.dumps({**other, "pid": dead.pid}))
    (tmp_path / "1.json").write_text(json.dumps({**other, "pid": 1, "updated_at": now - 3600}))
    doc = stats(app)
    workers = doc["workers"]
    assert workers["pids"] == sorted([os.getpid(), os.getppid()])
    assert workers["requests"] == {"started": 3 + 11, "answered": 3 + 10}
    assert workers["process"]["anonymous_bytes"] == doc["process"]["anonymous_bytes"] + 5
    assert workers["process"]["rss_bytes"] == doc["process"]["rss_bytes"] + 7
    assert not (tmp_path / f"{dead.pid}.json").exists(), "a dead worker's file is tidied away"


def test_bad_periods_are_refused() -> None:
    for period in (0.0, -1.0, 61.0, float("nan")):
        try:
            LeaklabDebug(hello, workers_dir="/nonexistent-never-made", workers_period=period)
        except ValueError as e:
            assert "workers_period" in str(e)
        else:
            raise AssertionError(f"workers_period={period} was accepted")


def _get(url: str, data: bytes | None = None) -> bytes:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(request, timeout=10) as r:
        body: bytes = r.read()
        return body


def test_two_uvicorn_workers_are_counted_whole_and_a_replaced_one_leaves(tmp_path: Path) -> None:
    env = {**os.environ, "LEAKLAB_WORKERS_DIR": str(tmp_path), "WATCH_WORKERS_PERIOD": "0.05"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    server = subprocess.Popen(
        [sys.executable, str(HERE / "watch_service.py"), "--variant", "fixed", "--workers", "2"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base = server.stdout.readline().split("listening on ")[1].strip()

        def workers() -> Any:
            try:
                return json.loads(_get(f"{base}{P}/stats"))["workers"]
            except OSError:
                return None

        wait_for(lambda: (w := workers()) is not None and len(w["pids"]) == 2, 30)
        for _ in range(40):
            _get(f"{base}/work", b"")
        # Whichever worker answers, the count is the server's.
        wait_for(lambda: workers()["requests"]["answered"] == 40)
        pids = workers()["pids"]
        # Each worker serves its routes on a loopback port of its own, registered beside its
        # figures: the server's port reaches whichever worker the kernel picks, this one that
        # worker alone (a census diff pairs two censuses of one process).
        wait_for(lambda: sorted(workers()["agents"]) == sorted(map(str, pids)))
        for pid, url in workers()["agents"].items():
            assert url.startswith("http://127.0.0.1:") and not url.startswith(base), url
            for _ in range(3):
                assert json.loads(_get(f"{url}/stats"))["pid"] == int(pid)
        os.kill(pids[0], signal.SIGKILL)  # uvicorn's supervisor starts a new worker
        wait_for(lambda: (w := workers()) is not None and pids[0] not in w["pids"] and len(w["pids"]) == 2, 30)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
