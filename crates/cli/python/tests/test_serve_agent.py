"""``leaklab.serve_agent()`` in a process that serves no HTTP of its own (an inference worker, as
LitServe's and BentoML's are): the agent's routes on loopback from a thread, its census naming
the worker's holder, its address registered in the workers' folder and listed by the API
server's agent, and its refusals."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import call
from leaklab import find_leaklab_bin, serve_agent
from leaklab.asgi import LeaklabDebug

# A worker: torch imported, the agent served from a thread, then requests of its own kind (a
# line on stdin: keep N tensors of 4 KiB), as an inference worker takes work from a queue.
WORKER = """
import sys
import torch
from leaklab import serve_agent

KEPT = []
agent = serve_agent(workers_dir=sys.argv[1], workers_period=0.05, allow_trim=True)
print(agent.url, flush=True)
for line in sys.stdin:
    for _ in range(int(line)):
        KEPT.append(torch.ones(1024))  # LEAK(worker): 4 KiB kept per item of work
    print("done", flush=True)
"""


def get(url: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def worker(tmp_path: Path) -> Any:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    folder = tmp_path / "workers"
    p = subprocess.Popen(
        [sys.executable, str(script), str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdin is not None
    url = p.stdout.readline().strip()
    yield p, url, folder
    p.kill()
    p.wait()


async def hello(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


def test_a_worker_serves_its_census_and_the_servers_agent_lists_its_address(worker: Any, tmp_path: Path) -> None:
    p, url, folder = worker
    assert url.startswith("http://127.0.0.1:") and url.endswith("/debug/leaklab"), url
    status, stats = get(f"{url}/stats")
    assert status == 200 and stats["pid"] == p.pid, stats
    # The census of the worker, before and after 200 items of work: its holder named.
    before = get(f"{url}/tensors")[1]
    p.stdin.write("200\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "done"
    after = get(f"{url}/tensors")[1]
    (tmp_path / "before.json").write_text(json.dumps(before))
    (tmp_path / "after.json").write_text(json.dumps(after))
    diff = subprocess.run(
        [
            find_leaklab_bin(),
            "census-diff",
            str(tmp_path / "before.json"),
            str(tmp_path / "after.json"),
            "--steps",
            "200",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    grown = json.loads(diff.stdout)["grown"]
    assert grown[0]["holder"] == "__main__.KEPT" and grown[0]["tensors"] == 200, grown
    assert grown[0]["bytes"] == 200 * 4096, grown
    # The opt-in trim probe answers, as the middleware's does.
    assert get(f"{url}/trim", "POST")[0] == 200
    # The API server's agent, given the same folder, lists the worker and where it answers.
    server = LeaklabDebug(hello, workers_dir=str(folder), workers_period=0.05)
    assert call(server, "/work")[0] == 200
    deadline = time.monotonic() + 10
    while True:
        workers = json.loads(call(server, "/debug/leaklab/stats")[2])["workers"]
        if str(p.pid) in workers["agents"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert workers["agents"][str(p.pid)] == url, workers
    assert p.pid in workers["pids"], workers
    # Nothing but the agent's routes is served there.
    status, body = get(url.replace("/debug/leaklab", "/predict"))
    assert status == 404 and "agent's routes only" in body["error"], body


def test_a_server_off_loopback_needs_a_token_and_then_asks_it() -> None:
    with pytest.raises(ValueError, match="not loopback: give a token"):
        serve_agent(host="0.0.0.0")
    with pytest.raises(ValueError, match="must be an IP address"):
        serve_agent(host="localhost.example")
    agent = serve_agent(allow_loopback=False, token="s3cret")
    try:
        status, body = get(f"{agent.url}/stats")
        assert status in (401, 403), body
        request = urllib.request.Request(f"{agent.url}/stats", headers={"authorization": "Bearer s3cret"})
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 200
    finally:
        agent.close()


def test_a_client_cannot_hold_the_agents_server() -> None:
    """A connection that sends half a request and waits is closed after ``idle_timeout``, other
    clients answered meanwhile; a body over the cap is refused with a message, unread."""
    agent = serve_agent(idle_timeout=0.5)
    try:
        host, port = agent.url.split("//")[1].split("/")[0].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as stalled:
            stalled.sendall(b"GET /debug/leaklab/stats HTTP/1.1\r\nhost: x\r\n")  # no blank line
            started = time.monotonic()
            status, body = get(f"{agent.url}/stats")
            assert status == 200 and body["schema"] == "leaklab.stats/1"
            assert stalled.recv(1) == b"", "the silent client is closed, not answered"
            assert time.monotonic() - started < 5
        request = urllib.request.Request(f"{agent.url}/stats", data=b"x" * (65 * 1024), method="POST")
        try:
            urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as e:
            assert e.code == 413
            assert "at most 65536 bytes" in json.loads(e.read())["error"]
        else:
            raise AssertionError("a body over the cap was taken")
    finally:
        agent.close()
