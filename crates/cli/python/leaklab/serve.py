"""``serve_agent()``: the agent's routes from a process that serves no HTTP of its own.

Inference often runs in processes the web server started and cannot mount a middleware in:
LitServe's inference workers, BentoML's runners, Ray Serve's replicas, a multiprocessing pool, a
DataLoader's workers. One call in such a process serves the same routes as ``LeaklabDebug``
(the census, ``stats``, the snapshot, and the opt-in trim probe and native trace), with the same
ceilings and the same rule for clients (loopback, or the token), from a daemon thread, on a port
of its choosing on loopback::

    from leaklab import serve_agent

    agent = serve_agent(workers_dir="/tmp/leaklab-workers")  # in the worker, once
    agent.url  # http://127.0.0.1:PORT/debug/leaklab

With ``workers_dir`` (or ``LEAKLAB_WORKERS_DIR``), the address is registered beside the worker's
figures in that folder, so that the API server's agent (the middleware, given the same folder)
lists every worker's address in its ``stats`` (``workers.agents``), and ``leaklab scan --agent``
given that one agent names where to look inside the process that grows.

Nothing here runs on the worker's own path: the server is a thread that answers requests to the
agent's routes only, one at a time per connection, each on an event loop of its own thread. A
client cannot hold the server: each connection has a thread of its own, one silent for
``idle_timeout`` seconds (30) is closed, and a body over 64 KiB is refused (the routes read their
options from the query).
"""

from __future__ import annotations

import asyncio
import http.server
import ipaddress
import json
import threading
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leaklab.asgi import LeaklabDebug, Receive, Send

__all__ = ["AgentServer", "serve_agent"]

_MAX_BODY = 64 * 1024
_IDLE_SECONDS = 30.0  # how long a connection may stay silent before it is closed


class AgentServer:
    """A running agent server: its ``url`` and ``close()``."""

    def __init__(self, httpd: http.server.ThreadingHTTPServer, loop: asyncio.AbstractEventLoop, url: str) -> None:
        self._httpd, self._loop, self.url = httpd, loop, url

    def close(self) -> None:
        """Stops answering and frees the port (the workers folder's file goes at exit)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._loop.call_soon_threadsafe(self._loop.stop)


async def _not_found(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
    """The app behind the agent: nothing but the agent's routes is served here."""
    body = b'{"error": "this server answers the leaklab agent\'s routes only"}'
    await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def serve_agent(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    request_timeout: float = 600.0,
    idle_timeout: float = _IDLE_SECONDS,
    **options: Any,
) -> AgentServer:
    """Serves the agent's routes from this process, in a daemon thread; returns at once.

    ``host`` must be a loopback address unless ``token`` is given (the middleware's rule: a
    census names the process's objects). ``port`` 0 picks a free one. ``options`` are
    ``LeaklabDebug``'s (``token``, ``allow_trim``, ``native_max_seconds``, ``workers_dir``,
    ``census_max_seconds``, ...); ``prefix`` is ``/debug/leaklab`` unless given.
    ``request_timeout``: the longest one answer may take (a native trace's window, a census);
    ``idle_timeout``: how long a connection may stay silent (a request half sent, or none).
    """
    from leaklab.asgi import LeaklabDebug

    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError as e:
        raise ValueError(f"host must be an IP address, not {host!r}") from e
    if not loopback and not options.get("token"):
        raise ValueError(f"host {host} is not loopback: give a token too, or serve on 127.0.0.1")
    return serve(LeaklabDebug(_not_found, **options), host, port, request_timeout, idle_timeout)


def serve(
    agent: LeaklabDebug, host: str, port: int, request_timeout: float, idle_timeout: float = _IDLE_SECONDS
) -> AgentServer:
    """Serves ``agent``'s routes on ``host:port`` from daemon threads, and tells the agent where
    (it registers that address in its workers folder). The caller has checked ``host``."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="leaklab-agent-loop", daemon=True).start()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = idle_timeout  # the socket's: a silent client is dropped, not waited for

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the worker's own logs are not ours to fill

        def _answer(self) -> None:
            try:
                length = int(self.headers.get("content-length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= _MAX_BODY:
                if 0 < length <= 16 * _MAX_BODY:
                    self.rfile.read(length)  # read, so that closing sends the answer, not a reset
                refusal = json.dumps(
                    {"error": f"a body of at most {_MAX_BODY} bytes, with its content-length"}
                ).encode()
                self.send_response_only(413 if length > 0 else 400)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(refusal)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(refusal)
                self.close_connection = True
                return
            body = self.rfile.read(length) if length else b""
            path, _, query = self.path.partition("?")
            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": self.command,
                "scheme": "http",
                "path": path,
                "raw_path": path.encode(),
                "query_string": query.encode(),
                "root_path": "",
                "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()],
                "client": self.client_address[:2],
                "server": (host, bound_port),
            }
            received = False

            async def receive() -> MutableMapping[str, Any]:
                nonlocal received
                if received:
                    return {"type": "http.disconnect"}
                received = True
                return {"type": "http.request", "body": body, "more_body": False}

            chunked = False

            async def send(message: MutableMapping[str, Any]) -> None:
                nonlocal chunked
                # Written from the loop's thread while this one waits: the answer streams (a
                # snapshot may be a gigabyte) instead of being held whole.
                if message["type"] == "http.response.start":
                    self.send_response_only(message["status"])
                    headers = dict((k.lower(), v) for k, v in message.get("headers", []))
                    for k, v in message.get("headers", []):
                        self.send_header(k.decode("latin-1"), v.decode("latin-1"))
                    if b"content-length" not in headers:
                        self.send_header("transfer-encoding", "chunked")
                        chunked = True
                    self.end_headers()
                elif message["type"] == "http.response.body":
                    chunk = message.get("body", b"")
                    if chunked:
                        if chunk:
                            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        if not message.get("more_body"):
                            self.wfile.write(b"0\r\n\r\n")
                    else:
                        self.wfile.write(chunk)

            asyncio.run_coroutine_threadsafe(agent(scope, receive, send), loop).result(request_timeout)
            self.wfile.flush()

        do_GET = do_POST = do_DELETE = _answer

    httpd = http.server.ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    bound_port = int(httpd.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound_port}{agent.prefix}"
    agent.serve_here(url)
    threading.Thread(target=httpd.serve_forever, name="leaklab-agent", daemon=True).start()
    return AgentServer(httpd, loop, url)
