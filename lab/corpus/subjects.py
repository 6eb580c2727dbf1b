"""The corpus's subjects: FastAPI + PyTorch services whose memory behaviour is known by
construction, so that each recording's ground truth comes from how its subject was built,
never from a run (issue: the judge, measured).

Each subject serves ``POST /predict`` with a body ``{"inputs": [[float] * 256] * 8}``: a
``Linear(256, 256)`` forward under ``torch.inference_mode()``, torch imported (a large,
long-lived heap), one torch thread, a sync endpoint (FastAPI runs it on its thread pool, as
most services do). What each keeps per request is its mechanism:

Leaky (a rung of 1, 2, 4 or 8 KiB kept per request, never freed):
- ``bytes-list``: a ``bytes`` object of the rung's size appended to a module-level list.
- ``tensor-list``: a float32 tensor of the rung's size appended to a module-level list.
- ``array-dict``: an ``array('d')`` of the rung's size stored in a dict under the request's
  number.
- ``float-list``: the rung's size in Python floats (32 bytes each: a 24-byte object and its
  8-byte slot) added to a list: pymalloc's arenas, not malloc's.
- ``bytearray-state``: a ``bytearray`` of the rung's size appended to ``app.state``'s list.
- ``str-cache``: a ``bytes`` value of the rung's size cached under the request's input (its
  body's text): an unbounded cache keyed by input, so it grows per new input and not on
  repeats.
- ``native-malloc`` (added 2026-12-07, so that the corpus has leaks Python does not own): the
  rung's size from the C allocator (``malloc`` through ctypes), written once and never freed,
  its address (a Python int) kept in a list: native memory, the owner native.

Must pass (nothing kept per request, or a bound that the judged requests reach):
- ``stateless``: nothing kept.
- ``number-kept``: the output's mean kept in a ``deque(maxlen=1000)`` (the README's fix).
- ``lru-256x16k``: an LRU cache of 256 entries of 16 KiB keyed by input: full after 256 new
  inputs (4 MiB), then each new input evicts one.
- ``deque-200x8k``: the last 200 outputs' 8 KiB tensors in a ``deque(maxlen=200)``.
- ``lru-600x32k``: an LRU cache of 600 entries of 32 KiB keyed by input (19.7 MB): full after
  600 new inputs, late in the judged requests.
- ``gc-cycles``: per request a reference cycle holding an 8 KiB tensor, dropped at once: the
  collector (enabled, default thresholds) frees it at its next full collection.

Must pass, added after the first recordings (every candidate written down then was kept, on
whichever side the split put it: the first set left one must-pass subject in calibration):
- ``dict-64x64k``: a dict of the last 64 requests' 64 KiB values, the oldest dropped.
- ``tensor-churn-64k``: a 64 KiB tensor made and dropped per request.
- ``churn-1m``: a 1 MiB tensor made and dropped per request.
- ``lru-cache-128x16k``: ``functools.lru_cache(maxsize=128)`` over a 16 KiB value keyed by
  input.
- ``thread-local-256k``: a 256 KiB ``bytearray`` per thread of the pool that serves requests
  (``threading.local``): bounded by the pool's threads (40 at most).
- ``pymalloc-churn``: 5,000 small tuples made and dropped per request (pymalloc's arenas).
- ``bytes-churn-200k``: a 200,000-byte ``bytes`` made and dropped per request (above glibc's
  first mmap threshold, 128 KiB, which then moves).

Must pass, added on 2026-12-07 so that the collector's garbage has subjects beyond gc-cycles
(which the split put in validation, leaving the garbage rule no calibration subject). Four
were named, their sides computed as they were named; all four are kept, whichever side:
- ``cycle-bytes-8k``: per request a reference cycle holding an 8 KiB ``bytes``, dropped at once.
- ``cycle-dict-tensor``: per request a dict that holds itself and a 2,048-float tensor.
- ``cycle-closure``: per request a closure whose cell holds a list holding the closure and a
  4 KiB ``bytearray``.
- ``cycle-graph-4k``: per request a ring of four objects, each holding 1 KiB ``bytes``.

Held out (written after the host noise floor was frozen at 64 KiB, recorded into
``held-out/``, never in the corpus the table and the thresholds read):
- ``deque-of-records-3k``: a dict per request (its number, its mean, a 3 KiB ``bytes``
  payload) appended to an unbounded ``collections.deque``: about 3.3 kB a request, per
  request, Python's.
- ``ring-tensor``: a preallocated 1,000 × 256 tensor written in place, one row a request: must
  pass.

Held out, written on 2026-12-07 after that day's rules (repeats that grow read per request,
the garbage kept share at 0.45) and before their first recording:
- ``history-by-client-8k``: each request's output (8 × 256 floats, 8 KiB) detached and appended
  to a per-client history (a dict of lists, 50 clients in turn), never trimmed: a metrics
  history of tensors, per request, Python's.
- ``expiring-cache-16k``: 16 KiB cached under the request's number and dropped 100 requests
  later (a cache with a time to live counted in requests): bounded at 1.6 MB, full after 100.

The truth each recording carries is :func:`truth` of its subject's name.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import threading
from array import array
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, replace
from typing import Any

RUNGS = (1024, 2048, 4096, 8192)
LEAKY = (
    "bytes-list",
    "tensor-list",
    "array-dict",
    "float-list",
    "bytearray-state",
    "str-cache",
    "native-malloc",
)
MUST_PASS = (
    "stateless",
    "number-kept",
    "lru-256x16k",
    "deque-200x8k",
    "lru-600x32k",
    "gc-cycles",
    "dict-64x64k",
    "tensor-churn-64k",
    "churn-1m",
    "lru-cache-128x16k",
    "thread-local-256k",
    "pymalloc-churn",
    "bytes-churn-200k",
    "cycle-bytes-8k",
    "cycle-dict-tensor",
    "cycle-closure",
    "cycle-graph-4k",
)
# The must-pass subjects whose memory grows by the collector's garbage until a full
# collection frees it: their truth's axis is "garbage".
GARBAGE = (
    "gc-cycles",
    "cycle-bytes-8k",
    "cycle-dict-tensor",
    "cycle-closure",
    "cycle-graph-4k",
)
# The mechanisms keyed by the request's input.
KEYED = ("str-cache", "lru-256x16k", "lru-600x32k", "lru-cache-128x16k")
HELD_OUT = (
    "deque-of-records-3k",
    "ring-tensor",
    "history-by-client-8k",
    "expiring-cache-16k",
)
FEATURES = 256
ROWS = 8


@dataclass(frozen=True)
class Truth:
    """What a subject does to memory, from its construction."""

    subject: str
    mechanism: str
    must_pass: bool
    # Bytes kept per request (per new input for a cache keyed by input), never freed.
    leak_bytes_per_request: int
    # The axis the growth is along: per-request, per-new-input, garbage (the collector's, freed
    # at its full collections), or none.
    axis: str
    owner: str
    # A bounded holder: its bytes when full, and the new inputs that fill it.
    bound_bytes: int
    fills_after_requests: int
    # What it keeps is tensors (the agent's census weighs those, and only those).
    tensors: bool = False


def names() -> list[str]:
    """Every subject: the leaky ones as MECHANISM-RUNG (``bytes-list-2k``), then the others."""
    leaky = [f"{m}-{r // 1024}k" for m in LEAKY for r in RUNGS]
    return leaky + list(MUST_PASS)


def truth(name: str) -> Truth:
    for mechanism in LEAKY:
        for rung in RUNGS:
            if name == f"{mechanism}-{rung // 1024}k":
                axis = "per-new-input" if mechanism == "str-cache" else "per-request"
                owner = "native" if mechanism == "native-malloc" else "python"
                tensors = mechanism == "tensor-list"
                return Truth(name, mechanism, False, rung, axis, owner, 0, 0, tensors)
    bounds = {
        "lru-256x16k": (256 * 16384, 256),
        "deque-200x8k": (200 * 8192, 200),
        "lru-600x32k": (600 * 32768, 600),
        "dict-64x64k": (64 * 65536, 64),
        "lru-cache-128x16k": (128 * 16384, 128),
        "thread-local-256k": (40 * 262144, 0),
    }
    if name == "deque-of-records-3k":
        return Truth(name, name, False, 3072, "per-request", "python", 0, 0)
    if name == "history-by-client-8k":
        return Truth(name, name, False, 8192, "per-request", "python", 0, 0, True)
    if name == "expiring-cache-16k":
        return Truth(name, name, True, 0, "none", "none", 100 * 16384, 100)
    if name == "ring-tensor":
        return Truth(name, name, True, 0, "none", "none", 1000 * FEATURES * 4, 0, True)
    if name in MUST_PASS:
        bound, fills = bounds.get(name, (0, 0))
        axis = "garbage" if name in GARBAGE else "none"
        tensors = name in ("deque-200x8k", "gc-cycles", "cycle-dict-tensor")
        return Truth(name, name, True, 0, axis, "none", bound, fills, tensors)
    raise KeyError(f"no subject {name!r}; the subjects are {names()}")


def truth_json(name: str, workers: int = 0) -> dict[str, Any]:
    """The subject's truth as recorded, served by ``workers`` forked workers (0: by the process
    the scan is given): there a leak grows the workers while that process stays flat (the axis
    "other-process"), and each worker fills a bounded holder of its own."""
    t = truth(name)
    if workers:
        t = replace(
            t,
            axis="other-process" if not t.must_pass else t.axis,
            bound_bytes=t.bound_bytes * workers,
            fills_after_requests=t.fills_after_requests * workers,
        )
    return asdict(t)


def make_app(name: str) -> Any:
    """The subject's FastAPI app."""
    import torch
    from fastapi import FastAPI

    torch.set_num_threads(1)
    t = truth(name)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    app = FastAPI()
    model = torch.nn.Linear(FEATURES, FEATURES)
    app.state.log = []
    kept: list[Any] = []
    by_request: dict[int, Any] = {}
    cache: OrderedDict[str, Any] = OrderedDict()
    numbers: deque[float] = deque(maxlen=1000)
    outputs: deque[Any] = deque(maxlen=200)
    count = [0]
    records: deque[dict[str, Any]] = deque()
    ring = torch.zeros(1000, FEATURES)
    recent: dict[int, bytes] = {}
    history: dict[int, list[Any]] = {}
    expiring: dict[int, bytes] = {}
    local = threading.local()

    @functools.lru_cache(maxsize=128)
    def value(key: str) -> bytes:
        return bytes(16384) + key[:0].encode()

    class Cycle:
        """Two objects that point at each other, one holding a tensor: only the collector
        frees them."""

        def __init__(self, tensor: Any) -> None:
            self.tensor = tensor
            self.other = self

    class Node:
        """One object of a ring: each holds the next, so only the collector frees them."""

        def __init__(self, payload: bytes) -> None:
            self.payload = payload
            self.next: Any = None

    def cached(key: str, size: int, capacity: int | None) -> None:
        if key in cache:
            cache.move_to_end(key)
            return
        cache[key] = bytes(size)
        if capacity is not None and len(cache) > capacity:
            cache.popitem(last=False)

    @app.post("/predict")
    def predict(body: dict[str, Any]) -> dict[str, Any]:
        x = torch.tensor(body["inputs"], dtype=torch.float32)
        with torch.inference_mode():
            y = model(x)
        mean = float(y.mean())
        count[0] += 1
        n, m = t.leak_bytes_per_request, t.mechanism
        key = json.dumps(body["inputs"]) if m in KEYED else ""
        if m == "bytes-list":
            kept.append(bytes(n))
        elif m == "tensor-list":
            kept.append(torch.full((n // 4,), mean))
        elif m == "array-dict":
            by_request[count[0]] = array("d", [mean]) * (n // 8)
        elif m == "float-list":
            kept.extend(mean + k for k in range(n // 32))
        elif m == "bytearray-state":
            app.state.log.append(bytearray(n))
        elif m == "str-cache":
            cached(key, n, None)
        elif m == "native-malloc":
            address = libc.malloc(n)
            ctypes.memset(address, 1, n)
            kept.append(address)
        elif m == "number-kept":
            numbers.append(mean)
        elif m == "lru-256x16k":
            cached(key, 16384, 256)
        elif m == "deque-200x8k":
            outputs.append(torch.full((2048,), mean))
        elif m == "lru-600x32k":
            cached(key, 32768, 600)
        elif m == "gc-cycles":
            Cycle(torch.full((2048,), mean))
        elif m == "dict-64x64k":
            recent[count[0]] = bytes(65536)
            recent.pop(count[0] - 64, None)
        elif m == "tensor-churn-64k":
            del_after = torch.full((16384,), mean)
            del del_after
        elif m == "churn-1m":
            big = torch.empty(262144).fill_(mean)
            del big
        elif m == "lru-cache-128x16k":
            value(key)
        elif m == "thread-local-256k":
            if not hasattr(local, "buffer"):
                local.buffer = bytearray(262144)
        elif m == "pymalloc-churn":
            small = [(k, mean) for k in range(5000)]
            del small
        elif m == "deque-of-records-3k":
            records.append({"n": count[0], "mean": mean, "payload": bytes(3072)})
        elif m == "history-by-client-8k":
            history.setdefault(count[0] % 50, []).append(y.detach().clone())
        elif m == "expiring-cache-16k":
            expiring[count[0]] = bytes(16384)
            expiring.pop(count[0] - 100, None)
        elif m == "ring-tensor":
            ring[count[0] % 1000].copy_(y[0])
        elif m == "cycle-bytes-8k":
            Cycle(bytes(8192))
        elif m == "cycle-dict-tensor":
            loop: dict[str, Any] = {"tensor": torch.full((2048,), mean)}
            loop["self"] = loop
            del loop
        elif m == "cycle-closure":
            box: list[Any] = [bytearray(4096)]

            def step() -> Any:
                return box

            box.append(step)
            del box, step
        elif m == "cycle-graph-4k":
            nodes = [Node(bytes(1024)) for _ in range(4)]
            for k, node in enumerate(nodes):
                node.next = nodes[(k + 1) % 4]
            del nodes, node
        elif m == "bytes-churn-200k":
            scratch = bytes(200_000)
            del scratch
        return {"mean": mean}

    # Start-up garbage collected before the first request: the subject's heap as it serves.
    gc.collect()
    return app


def body() -> dict[str, Any]:
    """The request body every subject takes (the scan's --vary nudges its numbers)."""
    return {"inputs": [[0.1] * FEATURES] * ROWS}
