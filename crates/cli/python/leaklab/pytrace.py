"""The Python trace: what Python objects a window of requests allocated and left alive.

The census names the holders of tensors. Memory kept by Python objects that hold no tensor (a
metric's child series per user, handlers added per client, per-session dicts) is invisible to
it, and from outside it looks like any native growth. This module runs the standard library's
``tracemalloc`` over a bounded window, a number of requests or seconds, and reads what grew
between two snapshots inside it, by the line that allocated it: bytes and blocks, the top lines
first.

    doc = trace_for(seconds=30, max_seconds=30, requests=100, counter=lambda: answered)

Where the process does not trace already, the window starts tracing (one frame a trace) and
stops it when it closes; where its owner started ``tracemalloc``, the window reads it and leaves
it running. Its cost is the window's only: each allocation of the traced window is slower (a
hash-table insert, and a record kept beside each live block), and each snapshot comes after a
full collection, where the collector is on. A window closes at ``requests`` requests or
``seconds`` seconds, at most the owner's ``max_seconds``; the agent's thread polls the counter
every 10 ms, so a window nobody reads still ends. Nothing here raises into the application.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Literal, TypedDict

__all__ = ["SCHEMA", "PyTraceDoc", "TracedLine", "trace_for"]

SCHEMA = "leaklab.pytrace/1"

# Allocations made by leaklab's own modules (the agent answering meanwhile) and by tracemalloc's
# own bookkeeping are not the service's.
_NOT_OURS = [
    tracemalloc.Filter(False, os.path.join(os.path.dirname(os.path.abspath(__file__)), "*")),
    tracemalloc.Filter(False, tracemalloc.__file__),
]
# One window at a time in a process: tracemalloc is process-wide.
_window_lock = threading.Lock()


class TracedLine(TypedDict):
    file: str
    line: int
    bytes: int  #: grew between the window's two snapshots
    blocks: int  #: blocks more (a growth a request adds about one a request; a request in flight, a few)


class PyTraceDoc(TypedDict):
    """``POST /debug/leaklab/pytrace``'s answer."""

    schema: str  #: ``leaklab.pytrace/1``
    requests: int  #: requests answered between the window's two snapshots (by the agent's count)
    seconds: float
    stopped: Literal["requests", "seconds", "not started"]
    kept_bytes: int  #: what grew between the window's two snapshots, leaklab's own allocations left out
    kept_blocks: int
    top: list[TracedLine]  #: the lines that grew, by bytes, most first
    note: str | None  #: why it did not run, or what it could not read


def trace_for(
    seconds: float,
    *,
    max_seconds: float,
    requests: int | None = None,
    counter: Callable[[], int] | None = None,
    top: int = 30,
) -> PyTraceDoc:
    """One window over whatever the process serves meanwhile, read. It blocks for the window
    (run it in a worker thread) and closes after ``seconds`` (at most ``max_seconds``), or
    ``requests`` as ``counter`` counts them.

    What it reports is what grew between two snapshots inside the window, the first after a
    fifth of it (so that what any request has in flight is in both), each right after a full
    collection where the collector is on (so that its garbage, which it frees, is in neither;
    a full collection pauses the process for as long as it takes: 31-38 ms on a heap of 161k
    objects, torch imported, docs/agent.md). Lines are listed with the blocks they kept, which tell a growth (new
    blocks a request) from a request in flight or a container resized (one block)."""
    seconds = min(seconds, max_seconds) if seconds > 0 else max_seconds
    if not _window_lock.acquire(blocking=False):
        return _empty("another Python trace is running in this process")
    try:
        owned = not tracemalloc.is_tracing()
        if owned:
            tracemalloc.start(1)
        count = counter or (lambda: 0)
        first = count()
        started = time.perf_counter()
        stopped: Literal["requests", "seconds", "not started"] = "seconds"
        baseline: tracemalloc.Snapshot | None = None
        at = first
        try:
            while time.perf_counter() - started < seconds:
                done = count() - first
                if baseline is None and (
                    (requests is not None and done >= max(1, requests // 5))
                    or time.perf_counter() - started >= seconds / 5
                ):
                    baseline, at = _snapshot(), count()
                if requests is not None and done >= requests:
                    stopped = "requests"
                    break
                time.sleep(0.01)
            end, answered = _snapshot(), count() - at
        finally:
            if owned:
                tracemalloc.stop()
        elapsed = time.perf_counter() - started
        if baseline is None:
            return _empty("the window closed before its first snapshot")
        stats = [(s.traceback[0], s.size_diff, s.count_diff) for s in end.compare_to(baseline, "lineno")]
        stats.sort(key=lambda s: -s[1])
        return PyTraceDoc(
            schema=SCHEMA,
            requests=answered,
            seconds=round(elapsed, 6),
            stopped=stopped,
            kept_bytes=sum(s[1] for s in stats),
            kept_blocks=sum(s[2] for s in stats),
            top=[TracedLine(file=f.filename, line=f.lineno, bytes=b, blocks=n) for f, b, n in stats[:top] if b > 0],
            note=None if owned else "tracemalloc was already tracing (its owner's): read, and left running",
        )
    except Exception as e:  # tracemalloc refusing (a custom allocator, memory): a note, not a 500
        return _empty(f"the Python trace failed: {type(e).__name__}: {e}")
    finally:
        _window_lock.release()


def _snapshot() -> tracemalloc.Snapshot:
    """A snapshot of what is alive now, the collector's garbage freed first where it runs."""
    if gc.isenabled():
        gc.collect()
    return tracemalloc.take_snapshot().filter_traces(_NOT_OURS)


def _empty(note: str) -> PyTraceDoc:
    return PyTraceDoc(
        schema=SCHEMA, requests=0, seconds=0.0, stopped="not started", kept_bytes=0, kept_blocks=0, top=[], note=note
    )
