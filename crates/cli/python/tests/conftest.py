"""Shared helpers: a TestClient that comes from a chosen address, and a raw ASGI caller."""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# The package from this source tree when the wheel is not installed (the suite's own runs
# install the wheel first); the tests folder for `leaky_service`.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import leaklab  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(HERE))

# Starlette 1.x prefers httpx2 and warns when it falls back to httpx; torch warns without numpy.
_QUIET = ("ignore:.*httpx.*", "ignore:.*NumPy.*")
for _spec in _QUIET:
    warnings.filterwarnings("ignore", message=_spec.split(":", 1)[1])


def pytest_configure(config: Any) -> None:
    for spec in _QUIET:
        config.addinivalue_line("filterwarnings", spec)


LOOPBACK = ("127.0.0.1", 50000)


@contextmanager
def client_for(app: Any, host: str = LOOPBACK[0], **kwargs: Any) -> Iterator[Any]:
    from starlette.testclient import TestClient

    with TestClient(app, client=(host, 50000), **kwargs) as c:
        yield c


def call(
    app: Any, path: str, method: str = "GET", query: bytes = b"", client: Any = LOOPBACK, headers: Any = ()
) -> Any:
    """One HTTP request through a bare ASGI app: (status, headers dict, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": list(headers),
        "client": client,
        "server": ("127.0.0.1", 8000),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body
