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
# How long a snapshot waits for a moment with no request in flight before it is taken anyway.
PATIENCE = 2.0
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
    #: both snapshots taken between requests (none in flight); False where one could not be
    #: within PATIENCE (a request's objects alive at a snapshot read as kept)
    between_requests: bool
    top: list[TracedLine]  #: the lines that grew, by bytes, most first
    note: str | None  #: why it did not run, or what it could not read


def trace_for(
    seconds: float,
    *,
    max_seconds: float,
    requests: int | None = None,
    counter: Callable[[], int] | None = None,
    activity: Callable[[], tuple[int, int]] | None = None,
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
    blocks a request) from a container resized (a block or two). ``activity`` (the requests
    started and answered) lets each snapshot wait, up to ``PATIENCE`` seconds, for a moment
    with no request in flight: a request's parsed body alive at one snapshot (2,068 blocks of
    JSON for a batch of 2,048 floats) is not a growth."""
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
        quiet = False
        at = first
        between = _Between(activity)
        try:
            while time.perf_counter() - started < seconds:
                done = count() - first
                if baseline is None and (
                    (requests is not None and done >= max(1, requests // 5))
                    or time.perf_counter() - started >= seconds / 5
                ):
                    baseline, quiet = between.snapshot()
                    at = count()
                if requests is not None and done >= requests:
                    stopped = "requests"
                    break
                time.sleep(0.01)
            end, quiet_end = between.snapshot()
            answered = count() - at
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
            between_requests=quiet and quiet_end,
            top=[TracedLine(file=f.filename, line=f.lineno, bytes=b, blocks=n) for f, b, n in stats[:top] if b > 0],
            note="; ".join(
                n
                for n in (
                    None if owned else "tracemalloc was already tracing (its owner's): read, and left running",
                    None
                    if activity is None or (quiet and quiet_end)
                    else "a snapshot was taken with a request in flight (no pause between requests "
                    f"in {PATIENCE:g} s): its objects read as kept",
                )
                if n
            )
            or None,
        )
    except Exception as e:  # tracemalloc refusing (a custom allocator, memory): a note, not a 500
        return _empty(f"the Python trace failed: {type(e).__name__}: {e}")
    finally:
        _window_lock.release()


class _Between:
    """Snapshots taken between requests, as ``activity`` (started, answered) counts them: where
    no request is in flight before and the counts have not moved after. A request that failed
    is never answered, so after half its patience a snapshot takes "none in flight" to be the
    fewest in flight it has seen. Only after: taken at once, the fewest seen was whatever the
    first look found, a request mid-way most often (its body 10 ms alive of every 11 in a
    test), and a snapshot caught 725 blocks of a body being built (the full suite, 2026-12-07)."""

    def __init__(self, activity: Callable[[], tuple[int, int]] | None) -> None:
        self.activity = activity
        self.least: int | None = None

    def in_flight(self, settle: bool) -> tuple[tuple[int, int], bool]:
        """The counts now, and whether none is in flight: none at all, or, with ``settle``, no
        more than the fewest seen (requests that failed and stay counted as in flight)."""
        assert self.activity is not None
        counts = self.activity()
        now = counts[0] - counts[1]
        self.least = now if self.least is None else min(self.least, now)
        return counts, now == 0 or (settle and now == self.least)

    def snapshot(self) -> tuple[tracemalloc.Snapshot, bool]:
        """A snapshot of what is alive now, the collector's garbage freed first where it runs,
        and whether it was taken between requests: the counts read the same right before and
        right after ``take_snapshot`` (which holds the GIL throughout), none in flight."""
        if gc.isenabled():
            gc.collect()
        if self.activity is None:
            return tracemalloc.take_snapshot().filter_traces(_NOT_OURS), False
        started = time.perf_counter()
        deadline = started + PATIENCE
        while True:
            before, idle = self.in_flight(settle=time.perf_counter() >= started + PATIENCE / 2)
            if idle:
                raw = tracemalloc.take_snapshot()
                if self.activity() == before:
                    return raw.filter_traces(_NOT_OURS), True
            if time.perf_counter() >= deadline:
                return tracemalloc.take_snapshot().filter_traces(_NOT_OURS), False
            time.sleep(0.0005)


def _empty(note: str) -> PyTraceDoc:
    return PyTraceDoc(
        schema=SCHEMA,
        requests=0,
        seconds=0.0,
        stopped="not started",
        kept_bytes=0,
        kept_blocks=0,
        between_requests=False,
        top=[],
        note=note,
    )
