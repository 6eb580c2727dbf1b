"""An MCP tool server, stateful by default, whose clients open a session and never end it.

The cause, for a learner: MCP's Streamable HTTP transport is stateful unless told otherwise. A
client's ``initialize`` request opens a session: the server makes a transport for it (its
memory streams, its request bookkeeping) and starts a task that runs the protocol for that
session, and keeps both in the session manager's table until the client sends ``DELETE`` with
the session's id. Clients that stop without it (a process killed, a proxy that drops the
connection, a client library that never sends it) leave their sessions behind: a per-client
cost paid for every connection the server ever saw, held by Python objects, no tensor.

Reports reproduced (read through the public trackers):
- prowler-cloud/prowler PR #12235 "fix(mcp): run streamable HTTP stateless to stop session
  memory leak": an MCP server built with FastMCP's ``http_app()`` and no arguments runs
  stateful, "and its session manager retains each streamable-HTTP session's transport for the
  process lifetime. Sessions are only released when the client sends DELETE /mcp"; production
  logs over 32 h showed 1,398 session opens against 115 DELETEs, "roughly 100 KB retained
  each"; memory "climbs monotonically with request volume" and the task OOMed about every 6
  days on 512 MB. The fix: ``stateless_http=True`` (the server keeps no per-session state).
- modelcontextprotocol/python-sdk PR #3059: in stateful mode every request without a session
  id allocates a session and a task that are "never cleaned up" ("Only session_idle_timeout
  (opt-in, off by default) reaps them later").

The service: an MCP server (the ``mcp`` SDK's ``FastMCP``, mcp 1.26.0 from PyPI, the last
release before a default idle timeout: its session manager keeps a session until DELETE;
installed apart from the venv's packages, in the zoo's own site) that
exposes one tool, ``predict``, a small model (a 16 -> 32 -> 1 MLP) under inference mode, served
at ``/predict`` by Streamable HTTP. Each request the scan sends is a client's ``initialize``
(a new client that connects, as the report's did, and never ends its session). Fixed: the same
server with ``stateless_http=True``, the report's fix: a fresh transport per request, ended
with it.

PREDICTION (written before any measurement, in the commit that adds this module):
- Instrument: the scan from outside with the agent (its Python trace names the lines).
- Growth: one session a request, held until a DELETE that never comes: its transport, memory
  streams and protocol task, tens of kB (the report's "roughly 100 KB" was FastMCP's, which
  keeps more per session than the SDK's own server). Leaky, under the zoo's usual budget
  (1 GiB, 1 request a second, fail if it runs out within a day: 20 kB x 86,400 = 1.7 GB): FAIL.
  Axis per request (the same body every time: every initialize opens a session). Owner Python:
  objects that hold no tensor, the Python trace naming the SDK's lines (the session manager's
  transport, anyio's streams and task group).
- Fixed: PASS, flat or settling (each request's transport is terminated as it ends, its task
  with it). Axis none, owner none.

MEASURED (added after the runs; the prediction above is kept as written, in deff5a0): three
runs (`leaklab-lab run-lab --zoo --only mcp_session_per_client`, 2026-12-07, 2 cores): leaky
FAIL 3 of 3, anonymous memory 54.82-55.06 kB ± 1.48-2.42 kB a request over 400 judged
requests, per request, owner Python: the Python trace kept 41.4-42.3 kB a request (85-98
requests), most at asyncio/locks.py:168 (each session's events and conditions), pydantic's
main.py:280 and :792 (the session's stored initialize parameters, validated models) and anyio's
task group (_backends/_asyncio.py:419): the SDK's dependencies' lines, not its own, so the fix
line names asyncio's, where the prediction said the SDK's; the census grew nothing (no tensor).
Fixed PASS 3 of 3, plateau, 512-526 B ± 1.02 kB a request. As predicted (verdict, axis,
owner).
"""

# No `from __future__ import annotations`: the SDK reads the tool's annotations.
from typing import Any

from _zoo import Entry, Expect, Variant, zoo_site

FEATURES = 16

ENTRY = Entry(
    name="mcp_session_per_client",
    title="An MCP server, stateful by default, keeping every session its clients never end",
    reports=(
        "prowler-cloud/prowler PR #12235",
        "modelcontextprotocol/python-sdk PR #3059",
    ),
    symptom="A FastMCP server's session manager kept each Streamable HTTP session until the "
    "client sent DELETE: 1,398 sessions opened against 115 deleted in 32 h, about 100 KB "
    "retained each; the task ran out of its 512 MB about every 6 days.",
    instruments=("scan", "agent"),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-request", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "1GiB", "--rate", "1", "--fail-if-oom-within", "1d"),
    predicted_in="deff5a0",
    predicted_after_measuring=False,
    inputs="same",
    # A client's first request, as the SDK's own client sends it.
    body=lambda i: {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "zoo-client", "version": "1.0"},
        },
    },
    # Streamable HTTP answers a POST only to a client that accepts both (else 406).
    headers=("accept: application/json, text/event-stream",),
    # Not the SDK: it lives in the zoo's own site (``zoo_site``), added in make_app.
    preload=("torch",),
)


def make_app(variant: Variant) -> Any:
    import torch

    zoo_site()  # the SDK is not in the venv: it would stop LitServe's services from starting
    from mcp.server.fastmcp import FastMCP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    ).eval()
    # LEAK(mcp_session_per_client): stateful, the default: every initialize opens a session
    # the manager keeps until its client sends DELETE.
    # FIX(mcp_session_per_client): stateless_http=True: a transport per request, ended with it.
    mcp = FastMCP(
        "zoo-models",
        stateless_http=variant == "fixed",
        streamable_http_path="/predict",
    )

    @mcp.tool()
    def predict(features: list[float]) -> float:
        """The model's score for one row of 16 features."""
        if len(features) != FEATURES:
            raise ValueError(f"features must be {FEATURES} numbers")
        with torch.inference_mode():
            return float(model(torch.tensor([features], dtype=torch.float32))[0, 0])

    return mcp.streamable_http_app()
