"""``LeaklabDebug``: the tensor census, the CUDA snapshot and the cheap memory figures of a live service.

A pure ASGI middleware, written the way Starlette writes its own::

    from leaklab.asgi import LeaklabDebug

    app.add_middleware(LeaklabDebug)                      # FastAPI, Starlette
    app = LeaklabDebug(app, token=os.environ["LEAKLAB_TOKEN"])  # any ASGI app

It answers under ``/debug/leaklab/`` (``prefix``) and hands every other request, and every
lifespan and websocket scope, to ``app`` untouched; on that path it does nothing but compare
``scope["path"]`` with the prefix. Routes (docs/agent.md has the JSON schemas):

- ``GET tensors``: the tensor census (:mod:`leaklab.census`), run in a worker thread, within the
  owner's ceilings (a client may ask for a shorter or shallower census, never a longer one).
- ``GET stats``: process RSS and anonymous memory, CUDA allocator figures where CUDA is in use,
  the last census's totals.
- ``GET snapshot``: PyTorch's CUDA memory snapshot pickle (as ``torch.cuda.memory._dump_snapshot``
  writes it, for ``leaklab snapshot`` and pytorch.org/memory_viz), pickled to a temporary file
  up to ``snapshot_max_bytes`` and streamed from it; 409 where CUDA is not in use.
- ``GET|POST|DELETE history``: the CUDA allocator's history ring, its state, start and stop
  (``max_entries`` up to ``history_max_entries``). One snapshot or history change at a time.
- ``POST native`` (where the owner passed ``native_max_seconds``): memray's native allocation
  trace over a window of ``seconds`` or ``requests`` (:mod:`leaklab.native`).
- ``POST pytrace`` (where the owner passed ``python_trace_max_seconds``): the standard library's
  ``tracemalloc`` over a window of ``seconds`` or ``requests``: what Python objects the window
  allocated and left alive, by line (:mod:`leaklab.pytrace`), where no tensor holds the memory.
- ``POST trim`` (where the owner passed ``allow_trim=True``): ``malloc_trim(0)``, ``gc.collect()``,
  ``malloc_trim(0)`` again, what each gave back measured apart (:func:`leaklab._process.trim`).

``stats`` also counts the HTTP requests handed to the application (started and answered: two
integer increments on the request path), and says the collector's state and the threads alive.

A server of several worker processes (``uvicorn --workers N``, gunicorn) has one middleware, and
one count, per worker, and a request to ``stats`` reaches one of them. With ``workers_dir`` (or
the ``LEAKLAB_WORKERS_DIR`` environment variable), as prometheus_client's multiprocess mode does,
each worker's thread writes its counts and memory to ``DIR/PID.json`` every ``workers_period``
seconds (nothing more on the request path), and ``stats`` adds ``workers``: the live workers'
PIDs, and their requests and memory summed. ``leaklab watch`` reads the whole server from it.

Only loopback clients are answered, unless ``allow_networks`` names others or the request
carries the bearer ``token``. Every refusal and every bad request gets a JSON message and a 4xx,
and changes nothing. Nothing this module does raises into the application.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hmac
import importlib
import io
import ipaddress
import json
import logging
import os
import pickle
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import IO, Any, TypedDict, TypeVar
from urllib.parse import parse_qsl

from leaklab._process import (
    TRIM_SCHEMA,
    CollectorState,
    ThreadsState,
    collector_state,
    threads_state,
    trim,
)
from leaklab.census import SCHEMA as CENSUS_SCHEMA
from leaklab.census import CensusError, Totals, census
from leaklab.native import SCHEMA as NATIVE_SCHEMA
from leaklab.native import trace_for
from leaklab.pytrace import SCHEMA as PYTRACE_SCHEMA
from leaklab.pytrace import trace_for as python_trace_for

__all__ = [
    "CudaDevice",
    "CudaStats",
    "ErrorDoc",
    "HistoryState",
    "IndexDoc",
    "LastCensus",
    "LeaklabDebug",
    "ProcessStats",
    "Requests",
    "StatsDoc",
    "WorkersDoc",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

STATS_SCHEMA = "leaklab.stats/1"
log = logging.getLogger("leaklab")


class ErrorDoc(TypedDict):
    """Every 4xx and 5xx answer: what was wrong and what to do."""

    error: str


class IndexDoc(TypedDict):
    """``GET {prefix}``: the routes."""

    schema: str  #: ``leaklab.agent/1``
    routes: dict[str, str]  #: ``"GET /debug/leaklab/tensors"``: what it answers


class HistoryState(TypedDict):
    """The CUDA allocator's history ring, as this middleware set it."""

    recording: bool
    max_entries: int | None  #: the ring's size while recording
    since: float | None  #: unix seconds when recording started
    note: str | None  #: why it cannot record here (no torch, no CUDA), or what went wrong


class ProcessStats(TypedDict):
    rss_bytes: int | None
    anonymous_bytes: int | None  #: resident anonymous pages (RssAnon): heap and tensors, not mapped files
    source: str  #: the file they were read from


class CudaDevice(TypedDict):
    device: str  #: ``cuda:0``
    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    inactive_split_bytes: int
    peak_allocated_bytes: int
    alloc_retries: int
    ooms: int


class CudaStats(TypedDict):
    devices: list[CudaDevice]


class LastCensus(TypedDict):
    taken_at: float
    seconds: float
    complete: bool
    totals: Totals
    holders: int


class Requests(TypedDict):
    """HTTP requests this middleware handed to the application (its own routes left out), in
    this worker process since it started: a server of several workers has one count per worker."""

    started: int  #: handed to the application
    answered: int  #: the application returned from (its answer sent); started minus answered: in flight or failed


class WorkersDoc(TypedDict):
    """The whole server: every live worker that writes to the shared ``workers_dir``, summed."""

    dir: str
    pids: list[int]  #: the live workers, sorted; one replaced is a restart to a watcher
    requests: Requests  #: summed over ``pids``
    process: ProcessStats  #: RSS and anonymous memory summed over ``pids``
    oldest_seconds: float  #: the age of the oldest figures summed (at most a few ``workers_period``)
    #: PID -> the agent's base URL, for the workers that serve one of their own
    #: (:func:`leaklab.serve_agent`): where to look inside each
    agents: dict[str, str]


class StatsDoc(TypedDict):
    """``GET {prefix}/stats``: cheap to produce (no census, no snapshot)."""

    schema: str  #: ``leaklab.stats/1``
    pid: int  #: this worker process: a watcher sums the workers' ``requests`` by PID
    taken_at: float
    process: ProcessStats
    cuda: CudaStats | None  #: None unless torch is imported and CUDA initialised in this process
    history: HistoryState
    last_census: LastCensus | None
    census_running: bool
    requests: Requests
    collector: CollectorState
    threads: ThreadsState
    workers: WorkersDoc | None  #: None unless the workers share a folder (``workers_dir``)


class _Answer(Exception):
    """A finished answer (usually a refusal) raised out of a route's checks."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, list(headers)


_LOOPBACK_HINT = (
    "leaklab's debug routes answer loopback clients only; to reach them from elsewhere, pass "
    "allow_networks=['10.0.0.0/8'] or token=... to LeaklabDebug and send 'Authorization: Bearer TOKEN'"
)


class LeaklabDebug:
    """ASGI middleware serving leaklab's debug routes under ``prefix``; see the module's doc.

    Options:

    - ``prefix``: where the routes live (``/debug/leaklab``).
    - ``allow_networks``: CIDRs whose clients are answered besides loopback (``["10.0.0.0/8"]``).
    - ``token``: a bearer token that admits any client (compared in constant time).
    - ``allow_loopback``: answer loopback clients without a token (True). Set it False behind a
      reverse proxy on the same host, where every client looks like loopback.
    - ``record_memory_history``: start the CUDA allocator's history ring of this many entries
      (``stacks="python"``) now; 0 leaves it off (``POST history`` starts it later).
    - ``oom_snapshot_dir``: on a CUDA out-of-memory error, write the snapshot there
      (``oom-PID-TIME-N.pickle``), at most ``oom_snapshot_limit`` files per process.
    - ``census_max_seconds``, ``census_max_depth``: the census's ceilings: a request may ask for
      less (``?max_seconds=2``), never more, and gets them when it asks nothing.
    - ``history_max_entries``: the most entries ``POST history`` (and ``record_memory_history``)
      may ask of the history ring (100,000, as PyTorch's own examples use).
    - ``snapshot_max_bytes``: the largest snapshot pickle served (1 GiB); a larger one is refused.
    - ``allow_trim``: serve ``POST trim`` (off): ``malloc_trim(0)``, a full ``gc.collect()``,
      ``malloc_trim(0)`` again, each measured apart, one at a time with the census, a step that
      would start after ``census_max_seconds`` skipped. It changes the process: opt in.
    - ``native_max_seconds``: serve ``POST native`` (0: off), memray's native allocation trace
      over a window up to this long (``?seconds=``, a ceiling; ``?requests=`` closes it sooner).
    - ``python_trace_max_seconds``: serve ``POST pytrace`` (0: off), tracemalloc over a window up
      to this long (``?seconds=``, a ceiling; ``?requests=`` closes it sooner): each allocation
      of the window is slower while it traces, so its owner opts in.
    - ``workers_dir``: a folder the server's workers share (default: ``LEAKLAB_WORKERS_DIR``, else
      off): each worker writes its counts and memory there every ``workers_period`` seconds
      (0.5), from a thread, once it has served (a lifespan or a request), and ``stats`` sums the
      live workers. Each worker also serves these routes on a loopback port of its own (a
      thread; the token's rule as here), registered in its file, so that ``leaklab scan
      --agent`` given the server's address takes each worker's census from that worker.
      Give each server its own empty folder, as prometheus_client's
      ``PROMETHEUS_MULTIPROC_DIR``; a worker's file is removed when it exits.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        prefix: str = "/debug/leaklab",
        allow_networks: Iterable[str] = (),
        token: str | None = None,
        allow_loopback: bool = True,
        record_memory_history: int = 0,
        oom_snapshot_dir: str | None = None,
        oom_snapshot_limit: int = 3,
        census_max_seconds: float = 10.0,
        census_max_depth: int = 1000,
        history_max_entries: int = 100_000,
        snapshot_max_bytes: int = 1 << 30,
        allow_trim: bool = False,
        native_max_seconds: float = 0.0,
        python_trace_max_seconds: float = 0.0,
        workers_dir: str | None = None,
        workers_period: float = 0.5,
    ) -> None:
        if not prefix.startswith("/") or prefix.rstrip("/") == "":
            raise ValueError(f"prefix must be a path such as '/debug/leaklab', not {prefix!r}")
        if token is not None and not token.strip():
            raise ValueError("token must not be empty (leave it None to admit loopback clients only)")
        if record_memory_history < 0 or oom_snapshot_limit < 0:
            raise ValueError("record_memory_history and oom_snapshot_limit must be 0 or more")
        _check_range("census_max_seconds", census_max_seconds, 0.0, _MAX_SECONDS, exclusive_low=True)
        _check_range("census_max_depth", census_max_depth, 1, _MAX_DEPTH)
        _check_range("history_max_entries", history_max_entries, 1, _MAX_ENTRIES)
        _check_range("record_memory_history", record_memory_history, 0, history_max_entries)
        _check_range("snapshot_max_bytes", snapshot_max_bytes, 1, float("inf"))
        self.app = app
        self._prefix = prefix.rstrip("/")
        self._networks = tuple(ipaddress.ip_network(n, strict=False) for n in allow_networks)
        self._token = token.encode() if token is not None else None
        self._allow_loopback = allow_loopback
        self._max_seconds, self._max_depth = float(census_max_seconds), int(census_max_depth)
        self._max_entries, self._max_bytes = int(history_max_entries), int(snapshot_max_bytes)
        self._allow_trim = bool(allow_trim)
        _check_range("native_max_seconds", native_max_seconds, 0.0, _MAX_SECONDS)
        self._native_max_seconds = float(native_max_seconds)  # 0: the native trace is off
        _check_range("python_trace_max_seconds", python_trace_max_seconds, 0.0, _MAX_SECONDS)
        self._python_trace_max_seconds = float(python_trace_max_seconds)  # 0: off
        # Plain integers, counted on the event loop's thread: one increment each per request.
        self.started = self.answered = 0
        self._census_lock = threading.Lock()  # one census or trim at a time
        self._cuda_lock = threading.Lock()  # one snapshot or history change at a time
        self._last: LastCensus | None = None
        self._history = HistoryState(recording=False, max_entries=None, since=None, note=None)
        self._default_entries = record_memory_history or self._max_entries
        self._routes: dict[str, dict[str, Callable[[dict[str, str]], Awaitable[_Response]]]] = {
            "": {"GET": self._index},
            "tensors": {"GET": self._tensors},
            "stats": {"GET": self._stats},
            "snapshot": {"GET": self._snapshot},
            "history": {"GET": self._history_state, "POST": self._history_start, "DELETE": self._history_stop},
            "trim": {"POST": self._trim},
            "native": {"POST": self._native},
            "pytrace": {"POST": self._pytrace},
        }
        _check_range("workers_period", workers_period, 0.0, 60.0, exclusive_low=True)
        self._serving = False  # set by the first lifespan scope: a worker, not a preloading master
        self.url: str | None = None  # where this agent answers, where it serves itself (serve_agent)
        self._workers: _Workers | None = None
        folder = workers_dir if workers_dir is not None else os.environ.get("LEAKLAB_WORKERS_DIR") or None
        if folder is not None:
            self._workers = _Workers(self, folder, float(workers_period))
        if record_memory_history:
            self._history = _start_history(record_memory_history)
            if self._history["note"]:
                log.warning("leaklab: record_memory_history=%d: %s", record_memory_history, self._history["note"])
        if oom_snapshot_dir is not None:
            note = _attach_oom_observer(oom_snapshot_dir, oom_snapshot_limit)
            if note:
                log.warning("leaklab: oom_snapshot_dir=%s: %s", oom_snapshot_dir, note)

    @property
    def prefix(self) -> str:
        """Where the routes live (``/debug/leaklab``)."""
        return self._prefix

    def serve_here(self, url: str) -> None:
        """This agent answers at ``url`` from a server of its own (:func:`leaklab.serve_agent`):
        a worker from now on, its address registered with its figures in ``workers_dir``."""
        self.url = url
        self._serving = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The only work on the request path: one type check, one prefix comparison and, for
        # HTTP, two increments.
        if scope["type"] != "http":
            self._serving = True
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith(self._prefix):
            rest = path[len(self._prefix) :]
            if not rest or rest[0] == "/":  # /debug/leaklabs is not ours
                await self._serve(scope, rest.strip("/"), send)
                return
        self.started += 1
        await self.app(scope, receive, send)
        self.answered += 1

    # --- serving ----------------------------------------------------------------------------------

    async def _serve(self, scope: Scope, route: str, send: Send) -> None:
        started = False

        async def respond(status: int, body: _Body, content_type: bytes, extra: list[tuple[bytes, bytes]]) -> None:
            nonlocal started
            size = body.size if isinstance(body, _Spool) else len(body)
            headers = [
                (b"content-type", content_type),
                (b"content-length", str(size).encode()),
                (b"cache-control", b"no-store"),
                *extra,
            ]
            started = True
            await send({"type": "http.response.start", "status": status, "headers": headers})
            if not isinstance(body, _Spool):
                await send({"type": "http.response.body", "body": body})
                return
            # Streamed from the file in chunks: no request holds the whole pickle in memory.
            left = size
            while left > 0:
                chunk = body.file.read(min(_CHUNK, left))
                if not chunk:
                    raise OSError(f"the snapshot's temporary file ended {left} bytes short")
                left -= len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})

        answer: _Response | None = None

        try:
            try:
                self._admit(scope)
                methods = self._routes.get(route)
                if methods is None:
                    known = ", ".join(f"{self._prefix}/{r}" for r in self._routes if r)
                    raise _Answer(404, f"no route {scope['path']}; leaklab answers {known}")
                handler = methods.get(scope["method"])
                if handler is None:
                    allow = ", ".join(methods)
                    message = f"{scope['method']} is not allowed on {scope['path']}: use {allow}"
                    raise _Answer(405, message, [(b"allow", allow.encode())])
                answer = await handler(_query(scope))
            except _Answer as a:
                answer = a.status, _json(ErrorDoc(error=a.message)), _JSON, a.headers
            await respond(*answer)
        except Exception as e:  # never into the application
            log.exception("leaklab: %s %s failed", scope.get("method"), scope.get("path"))
            if not started:
                try:
                    body = _json(ErrorDoc(error=f"leaklab's agent failed: {type(e).__name__}: {e}"))
                    await respond(500, body, _JSON, [])
                except Exception:
                    log.exception("leaklab: could not send the 500")
        finally:
            if answer is not None and isinstance(answer[1], _Spool):
                answer[1].close()

    def _admit(self, scope: Scope) -> None:
        if self._token is not None:
            given = _bearer(scope)
            if given is not None:
                if hmac.compare_digest(given, self._token):
                    return
                raise _Answer(401, "the bearer token is not the one LeaklabDebug was given", [_CHALLENGE])
        client = scope.get("client")
        host = client[0] if client else None
        address = _address(host)
        if address is not None:
            if self._allow_loopback and address.is_loopback:
                return
            if any(address in net for net in self._networks):
                return
        who = f"client {host}" if host else "a client whose address the server did not give"
        if self._token is not None:
            raise _Answer(401, f"{who} needs 'Authorization: Bearer TOKEN' here", [_CHALLENGE])
        raise _Answer(403, f"{who} is refused: {_LOOPBACK_HINT}")

    # --- routes -----------------------------------------------------------------------------------

    async def _index(self, query: dict[str, str]) -> _Response:
        _options(query, {})
        p = self._prefix
        doc = IndexDoc(
            schema="leaklab.agent/1",
            routes={
                f"GET {p}/tensors": f"the tensor census ({CENSUS_SCHEMA}); options max_seconds, max_depth, top",
                f"GET {p}/stats": f"process and CUDA allocator figures, the last census's totals ({STATS_SCHEMA})",
                f"GET {p}/snapshot": "the CUDA memory snapshot pickle (409 without CUDA)",
                f"GET {p}/history": "the CUDA allocator history ring's state",
                f"POST {p}/history": "start recording it; option max_entries",
                f"DELETE {p}/history": "stop recording it",
                f"POST {p}/native": f"a native allocation trace ({NATIVE_SCHEMA}); options seconds, requests, top; "
                "opt-in: native_max_seconds",
                f"POST {p}/pytrace": f"a Python allocation trace, tracemalloc ({PYTRACE_SCHEMA}); options seconds, "
                "requests, top; opt-in: python_trace_max_seconds",
                f"POST {p}/trim": f"malloc_trim(0), gc.collect(), malloc_trim(0) ({TRIM_SCHEMA}); opt-in: allow_trim",
            },
        )
        return 200, _json(doc), _JSON, []

    async def _tensors(self, query: dict[str, str]) -> _Response:
        opts = _options(
            query,
            {
                "max_seconds": (float, 0.0, self._max_seconds, True),
                "max_depth": (int, 1, self._max_depth, False),
                "top": (int, 0, 1_000_000, False),
            },
            ceilings=("max_seconds", "max_depth"),
        )
        max_seconds = float(opts.get("max_seconds", self._max_seconds))
        max_depth = int(opts.get("max_depth", self._max_depth))
        top = int(opts.get("top", 0))
        if not self._census_lock.acquire(blocking=False):
            raise _Answer(409, "a census or a trim is already running in this process; ask again when it has answered")

        def work() -> bytes:
            doc = census(max_seconds=max_seconds, max_depth=max_depth, top=top)
            self._last = LastCensus(
                taken_at=doc["taken_at"],
                seconds=doc["seconds"],
                complete=doc["complete"],
                totals=doc["totals"],
                holders=len(doc["holders"]) + doc["holders_omitted"],
            )
            return _json(doc)

        try:
            body = await _in_thread_holding(self._census_lock, work)
        except CensusError as e:
            raise _Answer(409, str(e)) from e
        self._census_lock.release()  # on success the lock is still held: ours to release
        return 200, body, _JSON, []

    async def _stats(self, query: dict[str, str]) -> _Response:
        _options(query, {})
        doc = StatsDoc(
            schema=STATS_SCHEMA,
            pid=os.getpid(),
            taken_at=time.time(),
            process=_process_stats(),
            cuda=_cuda_stats(),
            history=self._history,
            last_census=self._last,
            census_running=self._census_lock.locked(),
            requests=Requests(started=self.started, answered=self.answered),
            collector=collector_state(),
            threads=threads_state(),
            workers=None,
        )
        if self._workers is not None:
            doc["workers"] = self._workers.summed(doc["process"])
        return 200, _json(doc), _JSON, []

    async def _native(self, query: dict[str, str]) -> _Response:
        if not self._native_max_seconds:
            raise _Answer(
                409,
                "the native trace is off: it runs memray's tracer in this process for a window, so its owner "
                "opts in with LeaklabDebug(app, native_max_seconds=30) (and pip install 'leaklab[native]')",
            )
        spec: dict[str, _Spec] = {
            "seconds": (float, 0.0, self._native_max_seconds, True),
            "requests": (int, 1, 1_000_000_000, False),
            "top": (int, 0, 1000, False),
        }
        opts = _options(query, spec, ceilings=("seconds",))
        seconds, top = float(opts.get("seconds", self._native_max_seconds)), int(opts.get("top", 10))
        requests = int(opts["requests"]) if "requests" in opts else None
        # The window counts the requests this agent answers; memray's own notes come back as 200s.
        doc = await _in_thread(
            lambda: trace_for(
                seconds, max_seconds=self._native_max_seconds, requests=requests, counter=lambda: self.answered, top=top
            )
        )
        return 200, _json(doc), _JSON, []

    async def _pytrace(self, query: dict[str, str]) -> _Response:
        if not self._python_trace_max_seconds:
            raise _Answer(
                409,
                "the Python trace is off: it runs tracemalloc in this process for a window, so its owner "
                "opts in with LeaklabDebug(app, python_trace_max_seconds=30)",
            )
        spec: dict[str, _Spec] = {
            "seconds": (float, 0.0, self._python_trace_max_seconds, True),
            "requests": (int, 1, 1_000_000_000, False),
            "top": (int, 0, 1000, False),
        }
        opts = _options(query, spec, ceilings=("seconds",))
        seconds, top = float(opts.get("seconds", self._python_trace_max_seconds)), int(opts.get("top", 10))
        requests = int(opts["requests"]) if "requests" in opts else None
        doc = await _in_thread(
            lambda: python_trace_for(
                seconds,
                max_seconds=self._python_trace_max_seconds,
                requests=requests,
                counter=lambda: self.answered,
                activity=lambda: (self.started, self.answered),
                top=top,
            )
        )
        return 200, _json(doc), _JSON, []

    async def _trim(self, query: dict[str, str]) -> _Response:
        opts = _options(query, {"max_seconds": (float, 0.0, self._max_seconds, True)}, ceilings=("max_seconds",))
        if not self._allow_trim:
            raise _Answer(
                409,
                "the trim probe is off: it runs gc.collect() and malloc_trim(0) in this process, so its "
                "owner opts in with LeaklabDebug(app, allow_trim=True)",
            )
        max_seconds = float(opts.get("max_seconds", self._max_seconds))
        if not self._census_lock.acquire(blocking=False):
            raise _Answer(409, "a census or a trim is already running in this process; ask again when it has answered")
        body = await _in_thread_holding(self._census_lock, lambda: _json(trim(max_seconds)))
        self._census_lock.release()
        return 200, body, _JSON, []

    async def _snapshot(self, query: dict[str, str]) -> _Response:
        _options(query, {})
        torch = _cuda_in_use(self._prefix)
        if not self._cuda_lock.acquire(blocking=False):
            raise _Answer(409, _BUSY)
        cap = self._max_bytes

        def work() -> _Spool:
            # What torch.cuda.memory._dump_snapshot writes, to a temporary file (gone once closed)
            # that the answer is streamed from.
            spool = _Spool(cap, self._cuda_lock)
            try:
                pickle.dump(torch.cuda.memory._snapshot(), spool, protocol=pickle.HIGHEST_PROTOCOL)
                spool.file.seek(0)
            except BaseException:
                spool.close(release=False)
                raise
            return spool

        try:
            spool = await _in_thread_holding(self._cuda_lock, work, lambda s: s.close(release=False))
        except _TooBig as e:
            raise _Answer(
                409,
                f"the CUDA snapshot's pickle is larger than snapshot_max_bytes ({cap:,} bytes; "
                f"{e.written:,} written when it was stopped): stop the history ring (DELETE {self._prefix}/history) "
                "and start it with fewer max_entries, or give LeaklabDebug a larger snapshot_max_bytes",
            ) from None
        name = f'attachment; filename="leaklab-{os.getpid()}-{int(time.time())}.pickle"'
        return 200, spool, b"application/octet-stream", [(b"content-disposition", name.encode())]

    async def _history_state(self, query: dict[str, str]) -> _Response:
        _options(query, {})
        return 200, _json(self._history), _JSON, []

    async def _history_start(self, query: dict[str, str]) -> _Response:
        opts = _options(query, {"max_entries": (int, 1, self._max_entries, False)}, ceilings=("max_entries",))
        entries = int(opts.get("max_entries", self._default_entries))
        _cuda_available(self._prefix)
        if not self._cuda_lock.acquire(blocking=False):
            raise _Answer(409, _BUSY)
        try:
            state = _start_history(entries)
        finally:
            self._cuda_lock.release()
        if state["note"]:
            raise _Answer(409, state["note"])
        self._history = state
        return 200, _json(state), _JSON, []

    async def _history_stop(self, query: dict[str, str]) -> _Response:
        _options(query, {})
        torch = _cuda_available(self._prefix)
        if not self._cuda_lock.acquire(blocking=False):
            raise _Answer(409, _BUSY)
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        finally:
            self._cuda_lock.release()
        self._history = HistoryState(recording=False, max_entries=None, since=None, note=None)
        return 200, _json(self._history), _JSON, []


# --- the workers of one server ------------------------------------------------------------------


class _Workers:
    """This worker's figures in ``folder/PID.json``, written every ``period`` seconds from a daemon
    thread (restarted in a forked child), and the live workers' figures summed."""

    def __init__(self, agent: LeaklabDebug, folder: str, period: float) -> None:
        os.makedirs(folder, exist_ok=True)
        self.agent, self.folder, self.period = agent, os.path.abspath(folder), period
        # A worker whose figures are older than this is gone, whatever its PID says (reused PIDs).
        self.stale = max(30.0, 20 * period)
        self._stop = threading.Event()
        self._start()
        os.register_at_fork(after_in_child=self._forked)
        atexit.register(self._remove)

    def _path(self, pid: int) -> str:
        return os.path.join(self.folder, f"{pid}.json")

    def _start(self) -> None:
        self.pid = os.getpid()
        threading.Thread(target=self._loop, name="leaklab-workers", daemon=True).start()

    def _forked(self) -> None:
        # A child has none of its parent's threads: not the parent's server, nor its address.
        self.agent.url, self.agent._serving = None, False
        self._start()

    def _loop(self) -> None:
        pid = self.pid
        while not self._stop.wait(self.period) and pid == os.getpid():
            if self.agent._serving or self.agent.started:
                if self.agent.url is None:
                    self._serve_own()
                try:
                    self._write()
                except OSError:
                    log.exception("leaklab: writing this worker's figures to %s failed", self.folder)

    def _serve_own(self) -> None:
        """This worker's routes on a loopback port of its own, registered with its figures: the
        server's port reaches whichever worker the kernel hands a connection to, and a census
        diff compares two censuses of one process only."""
        from leaklab.serve import serve

        try:
            serve(self.agent, "127.0.0.1", 0, _MAX_SECONDS)
        except OSError:
            log.exception("leaklab: serving this worker's agent on loopback failed")
            self.agent.url = ""  # not tried again; registered as no address

    def _figures(self) -> dict[str, Any]:
        process = _process_stats()
        return {
            "pid": os.getpid(),
            "updated_at": time.time(),
            "started": self.agent.started,
            "answered": self.agent.answered,
            "rss_bytes": process["rss_bytes"],
            "anonymous_bytes": process["anonymous_bytes"],
            "agent": self.agent.url,
        }

    def _write(self) -> None:
        path = self._path(os.getpid())
        with tempfile.NamedTemporaryFile("w", dir=self.folder, prefix=".tmp-", suffix=".json", delete=False) as f:
            json.dump(self._figures(), f)
        os.replace(f.name, path)

    def _remove(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.unlink(self._path(os.getpid()))

    def summed(self, mine: ProcessStats) -> WorkersDoc:
        now, me = time.time(), os.getpid()
        found: dict[int, dict[str, Any]] = {}
        try:
            names = os.listdir(self.folder)
        except OSError:
            names = []
        for name in names:
            stem, _, ext = name.partition(".")
            if ext != "json" or not stem.isdigit() or int(stem) == me:
                continue
            try:
                with open(os.path.join(self.folder, name)) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue  # removed, or being replaced: the next look sees it
            if not isinstance(doc, dict) or now - float(doc.get("updated_at", 0)) > self.stale:
                continue
            if _alive(int(stem)):
                found[int(stem)] = doc
            else:  # a worker that exited without removing its file (killed): tidied here
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.folder, name))
        # This worker's own figures are read now, not from its file.
        found[me] = {
            "updated_at": now,
            "started": self.agent.started,
            "answered": self.agent.answered,
            "rss_bytes": mine["rss_bytes"],
            "anonymous_bytes": mine["anonymous_bytes"],
            "agent": self.agent.url,
        }

        def total(key: str) -> int | None:
            values = [d.get(key) for d in found.values()]
            ints = [v for v in values if isinstance(v, int)]
            return sum(ints) if len(ints) == len(values) else None  # a worker without the figure: unknown

        return WorkersDoc(
            dir=self.folder,
            pids=sorted(found),
            requests=Requests(started=total("started") or 0, answered=total("answered") or 0),
            process=ProcessStats(
                rss_bytes=total("rss_bytes"),
                anonymous_bytes=total("anonymous_bytes"),
                source=f"the sum over {len(found)} workers of {mine['source']}",
            ),
            oldest_seconds=round(max(now - float(d["updated_at"]) for d in found.values()), 3),
            agents={
                str(pid): d["agent"]
                for pid, d in sorted(found.items())
                if isinstance(d.get("agent"), str) and d["agent"]
            },
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


# --- helpers ----------------------------------------------------------------------------------------

_JSON = b"application/json"
_CHALLENGE = (b"www-authenticate", b'Bearer realm="leaklab"')
_MAX_SECONDS = 600.0  # the most an owner may set as the census's ceilings
_MAX_DEPTH = 1_000_000
_MAX_ENTRIES = 1_000_000  # ten times what PyTorch's own examples record
_MAX_QUERY = 1024
_CHUNK = 1 << 20  # bytes of the snapshot per message while it is streamed
_BUSY = "a CUDA snapshot or a history change is already under way in this process; ask again when it has answered"
_T = TypeVar("_T")


class _TooBig(Exception):
    def __init__(self, written: int) -> None:
        super().__init__(f"{written} bytes")
        self.written = written


class _Spool(io.RawIOBase):
    """A snapshot's pickle on its way to the client: written to a temporary file up to a cap.

    While it is answered it holds the CUDA lock, given back when it is closed.
    """

    def __init__(self, cap: int, lock: threading.Lock) -> None:
        super().__init__()
        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="leaklab-snapshot-")
        self.size, self.cap, self.lock = 0, cap, lock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = len(data)
        if self.size + n > self.cap:
            raise _TooBig(self.size + n)
        self.file.write(data)
        self.size += n
        return n

    def close(self, release: bool = True) -> None:
        if not self.closed:
            self.file.close()
            super().close()
            if release:
                self.lock.release()


_Body = bytes | _Spool
_Response = tuple[int, _Body, bytes, list[tuple[bytes, bytes]]]


def _json(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _check_range(name: str, value: float, low: float, high: float, exclusive_low: bool = False) -> None:
    if value != value or value > high or value < low or (exclusive_low and value == low):
        bound = f"more than {low:g}" if exclusive_low else f"at least {low:g}"
        raise ValueError(f"{name} must be {bound} and at most {high:g}, not {value!r}")


def _query(scope: Scope) -> dict[str, str]:
    raw: bytes = scope.get("query_string", b"")
    if len(raw) > _MAX_QUERY:
        raise _Answer(400, f"the query string is longer than {_MAX_QUERY} bytes")
    try:
        pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, strict_parsing=bool(raw))
    except (UnicodeDecodeError, ValueError) as e:
        raise _Answer(400, f"the query string cannot be read: {e}") from e
    query: dict[str, str] = {}
    for key, value in pairs:
        if key in query:
            raise _Answer(400, f"option {key!r} is given twice")
        query[key] = value
    return query


_Spec = tuple[type, float, float, bool]  # type, low, high, low excluded


def _options(query: dict[str, str], spec: dict[str, _Spec], ceilings: Iterable[str] = ()) -> dict[str, float]:
    """The query's options, checked against ``spec``; any unknown or bad one is a 400.

    The high bounds of the options named in ``ceilings`` are the owner's (LeaklabDebug's options).
    """
    unknown = sorted(set(query) - set(spec))
    if unknown:
        known = ", ".join(spec) or "none"
        raise _Answer(400, f"unknown option {unknown[0]!r}; this route takes {known}")
    out: dict[str, float] = {}
    for key, (kind, low, high, exclusive) in spec.items():
        if key not in query:
            continue
        text = query[key]
        value: float = float("nan")
        try:
            value = int(text) if kind is int else float(text)
            _check_range(key, value, low, high, exclusive)
        except ValueError as e:
            what = "an integer" if kind is int else "a number"
            above = key in ceilings and value > high
            owner = " (the ceiling this service's LeaklabDebug was given)" if above else ""
            raise _Answer(400, f"option {key}={text!r}: {key} must be {what}; {e}{owner}") from None
        out[key] = value
    return out


def _bearer(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, credentials = bytes(value).partition(b" ")
            return credentials.strip() if scheme.lower() == b"bearer" else b""
    return None


def _address(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not host:
        return None
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:  # "testclient", a unix socket path: not an address we can vouch for
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


async def _in_thread(fn: Callable[[], _T]) -> _T:
    # A worker thread keeps the event loop serving while the census walks; it shares the GIL
    # with the loop at the interpreter's switch interval. anyio (Starlette's) when present, so
    # that trio works too; plain asyncio otherwise.
    try:
        import anyio.to_thread
    except ImportError:
        return await asyncio.get_running_loop().run_in_executor(None, fn)
    return await anyio.to_thread.run_sync(fn)


async def _in_thread_holding(
    lock: threading.Lock, fn: Callable[[], _T], discard: Callable[[_T], object] | None = None
) -> _T:
    """``fn()`` in a worker thread, for a caller that holds ``lock``; its result, the lock still held.

    Where ``fn`` fails, or the caller is cancelled (or fails) first, the lock is released, by
    whichever side comes last, and a result made meanwhile is handed to ``discard``.
    """
    guard = threading.Lock()
    state = ["waiting"]  # then "running" and "done", or "abandoned" by the caller
    made: list[_T] = []

    def work() -> None:
        with guard:
            if state[0] == "abandoned":
                return  # the caller gave up before the thread started, and released the lock
            state[0] = "running"
        try:
            made.append(fn())
        finally:
            with guard:
                abandoned, state[0] = state[0] == "abandoned", "done"
            if abandoned:
                for r in made:
                    if discard is not None:
                        discard(r)
                lock.release()

    try:
        await _in_thread(work)
    except BaseException:
        with guard:
            was = state[0]
            state[0] = "done" if was == "done" else "abandoned"
        if was != "running":  # not started, or finished: the thread will not release it
            for r in made:
                if discard is not None:
                    discard(r)
            lock.release()
        raise
    return made[0]


def _process_stats() -> ProcessStats:
    # /proc/self/status reads kernel counters (tens of microseconds); smaps_rollup walks the page
    # tables (37 ms measured for a 500 MB torch process on a busy machine), too long for the
    # event loop: it is only the fallback.
    for path, rss_key, anon_key in (
        ("/proc/self/status", "VmRSS:", "RssAnon:"),
        ("/proc/self/smaps_rollup", "Rss:", "Anonymous:"),
    ):
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        values: dict[str, int] = {}
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and parts[0] in (rss_key, anon_key) and parts[1].isdigit():
                values.setdefault(parts[0], int(parts[1]) * 1024)
        return ProcessStats(rss_bytes=values.get(rss_key), anonymous_bytes=values.get(anon_key), source=path)
    return ProcessStats(rss_bytes=None, anonymous_bytes=None, source="none (no /proc)")


def _cuda_stats() -> CudaStats | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():  # reading figures must not create a CUDA context
            return None
        devices = []
        for index in range(torch.cuda.device_count()):
            s = torch.cuda.memory_stats(index)
            devices.append(
                CudaDevice(
                    device=f"cuda:{index}",
                    allocated_bytes=int(s.get("allocated_bytes.all.current", 0)),
                    reserved_bytes=int(s.get("reserved_bytes.all.current", 0)),
                    active_bytes=int(s.get("active_bytes.all.current", 0)),
                    inactive_split_bytes=int(s.get("inactive_split_bytes.all.current", 0)),
                    peak_allocated_bytes=int(s.get("allocated_bytes.all.peak", 0)),
                    alloc_retries=int(s.get("num_alloc_retries", 0)),
                    ooms=int(s.get("num_ooms", 0)),
                )
            )
        return CudaStats(devices=devices)
    except Exception:
        log.exception("leaklab: reading the CUDA allocator's statistics failed")
        return None


def _cuda_available(prefix: str) -> Any:
    """torch, where CUDA can be used here; a 409 that says why not, and what works instead."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise _Answer(
            409,
            "torch is not imported in this process, so there is no CUDA memory to look at; "
            f"GET {prefix}/tensors takes the tensor census wherever torch runs",
        )
    try:
        available = bool(torch.cuda.is_available())
    except Exception as e:
        available, why = False, f" ({type(e).__name__}: {e})"
    else:
        why = ""
    if not available:
        raise _Answer(
            409,
            f"CUDA is not available in this process (torch.cuda.is_available() is False{why}): there is no "
            f"CUDA allocator to snapshot or record; for CPU tensors, GET {prefix}/tensors takes the tensor census",
        )
    return torch


def _cuda_in_use(prefix: str) -> Any:
    torch = _cuda_available(prefix)
    if not torch.cuda.is_initialized():
        raise _Answer(
            409,
            "CUDA is available but this process has not used it yet: there is nothing to snapshot (and "
            f"taking a snapshot would create a CUDA context); GET {prefix}/tensors lists its CPU tensors",
        )
    return torch


def _torch() -> Any:
    # Imported by name so that type checkers need not read torch (it is the user's, any version).
    return sys.modules.get("torch") or importlib.import_module("torch")


def _start_history(max_entries: int) -> HistoryState:
    """Start the CUDA allocator's history ring; a state whose ``note`` says why it did not."""
    try:
        torch = _torch()
    except ImportError as e:
        return HistoryState(recording=False, max_entries=None, since=None, note=f"torch cannot be imported: {e}")
    try:
        if not torch.cuda.is_available():
            return HistoryState(
                recording=False, max_entries=None, since=None, note="CUDA is not available in this process"
            )
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    except Exception as e:
        return HistoryState(recording=False, max_entries=None, since=None, note=f"{type(e).__name__}: {e}")
    return HistoryState(recording=True, max_entries=max_entries, since=time.time(), note=None)


_oom_lock = threading.Lock()
_oom_attached: dict[str, int] = {}  # folder -> snapshots written to it


def _attach_oom_observer(folder: str, limit: int) -> str | None:
    """Write a snapshot to ``folder`` when the CUDA allocator runs out of memory; why not, or None."""
    try:
        torch = _torch()
    except ImportError as e:
        return f"torch cannot be imported: {e}"
    with _oom_lock:
        if folder in _oom_attached:
            return None  # one observer per folder and process, however many middlewares
        try:
            if not torch.cuda.is_available():
                return "CUDA is not available in this process: no out-of-memory snapshots"
            os.makedirs(folder, exist_ok=True)

            def observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
                with _oom_lock:
                    written = _oom_attached.get(folder, 0)
                    if written >= limit:
                        return
                    _oom_attached[folder] = written + 1
                try:
                    snapshot = torch.cuda.memory._snapshot()
                    final = os.path.join(folder, f"oom-{os.getpid()}-{int(time.time())}-{written}.pickle")
                    with tempfile.NamedTemporaryFile("wb", dir=folder, suffix=".pickle.tmp", delete=False) as f:
                        pickle.dump(snapshot, f)
                    os.replace(f.name, final)
                    log.warning(
                        "leaklab: CUDA out of memory on device %d (%d bytes asked, %d free): snapshot in %s",
                        device,
                        alloc,
                        device_free,
                        final,
                    )
                except Exception:
                    log.exception("leaklab: writing the out-of-memory snapshot failed")

            torch._C._cuda_attach_out_of_memory_observer(observer)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        _oom_attached[folder] = 0
    return None
