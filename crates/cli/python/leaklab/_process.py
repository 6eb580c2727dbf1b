"""Process state that explains a cause, and the trim probe: what the collector and the allocator give back.

- :func:`collector_state`: whether the cyclic garbage collector is on, its thresholds, its
  counts per generation, the objects ``gc.freeze()`` moved aside. A census that finds cycles
  awaiting the collector reads differently where the collector is off: they are never freed.
- :func:`threads_state`: Python threads alive and the process's OS threads (native pools
  included), which per-thread caches (glibc arenas, oneDNN, cuDNN) multiply.
- :func:`trim`: glibc's ``malloc_trim(0)``, ``gc.collect()``, then ``malloc_trim(0)`` again,
  each measured apart in anonymous memory: the first returns memory the allocator was keeping
  free; the collection frees garbage the process kept (a finding where the collector is off),
  and the second trim returns what of the garbage's memory the allocator kept.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
from collections.abc import Callable
from typing import TypedDict

__all__ = [
    "TRIM_SCHEMA",
    "CollectShare",
    "CollectorState",
    "ThreadsState",
    "TrimDoc",
    "TrimShare",
    "anonymous_bytes",
    "collector_state",
    "malloc_trim",
    "threads_state",
    "trim",
]

TRIM_SCHEMA = "leaklab.trim/1"


class CollectorState(TypedDict):
    """The cyclic garbage collector of this process."""

    enabled: bool  #: False where the service called gc.disable(): cycles are never freed
    thresholds: list[int]  #: gc.get_threshold(), per generation
    counts: list[int]  #: gc.get_count(): what each generation has gathered since it was last collected
    frozen: int  #: gc.get_freeze_count(): objects gc.freeze() moved aside, never collected
    collections: list[int]  #: collections run so far, per generation (gc.get_stats())
    collected: list[int]  #: objects those collections freed, per generation
    uncollectable: int  #: len(gc.garbage): objects the collector found but could not free


class ThreadsState(TypedDict):
    python: int  #: threading.active_count(): Python threads alive
    os: int | None  #: ``Threads:`` of /proc/self/status: every OS thread (native pools too); None without /proc


def collector_state(enabled: bool | None = None) -> CollectorState:
    """The collector's state; ``enabled`` as the caller saw it before turning it off itself."""
    stats = gc.get_stats()
    return CollectorState(
        enabled=gc.isenabled() if enabled is None else enabled,
        thresholds=list(gc.get_threshold()),
        counts=list(gc.get_count()),
        frozen=gc.get_freeze_count(),
        collections=[int(s.get("collections", 0)) for s in stats],
        collected=[int(s.get("collected", 0)) for s in stats],
        uncollectable=len(gc.garbage),
    )


def _status(key: str) -> int | None:
    # /proc/self/status reads kernel counters: tens of microseconds.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    value = line.split()[1]
                    return int(value) if value.isdigit() else None
    except OSError:
        return None
    return None


def threads_state() -> ThreadsState:
    return ThreadsState(python=threading.active_count(), os=_status("Threads:"))


def anonymous_bytes() -> int | None:
    """Resident anonymous memory, exact: ``Anonymous:`` of smaps_rollup (it walks the page
    tables: tens of ms for a large process, so never on the event loop); RssAnon otherwise."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    kb = _status("RssAnon:")
    return None if kb is None else kb * 1024


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


class TrimShare(TypedDict):
    """One step of the trim probe, measured in resident anonymous memory."""

    anonymous_before: int | None
    anonymous_after: int | None
    given_back_bytes: int | None  #: before minus after (negative where the process grew meanwhile)
    seconds: float


class CollectShare(TrimShare):
    collector_enabled: bool  #: the collector's state before the probe
    objects: int  #: unreachable objects gc.collect() found (freed, or moved to gc.garbage)
    uncollectable: int  #: of them, those left in gc.garbage
    note: str | None  #: why it did not run


class MallocShare(TrimShare):
    available: bool  #: whether the C library has malloc_trim (glibc)
    released: bool | None  #: malloc_trim's answer: True where it returned memory to the system
    note: str | None  #: why it did not run


class TrimDoc(TypedDict):
    """``POST /debug/leaklab/trim``: what the allocator kept, what the collector frees, and what
    of the garbage's memory the allocator then kept."""

    schema: str  #: ``leaklab.trim/1``
    pid: int
    taken_at: float
    seconds: float
    max_seconds: float  #: a step that would start after this long is skipped (its ``note`` says so)
    kept_by_allocator: MallocShare  #: malloc_trim(0) first: free memory the allocator kept before the probe
    collect: CollectShare  #: then gc.collect(): the garbage, and the memory given back as it was freed
    malloc_trim: MallocShare  #: malloc_trim(0) again: what of the garbage's memory the allocator kept
    findings: list[str]  #: sentences: what the shares say


def _share(before: int | None, after: int | None, seconds: float) -> TrimShare:
    given = None if before is None or after is None else before - after
    return TrimShare(anonymous_before=before, anonymous_after=after, given_back_bytes=given, seconds=round(seconds, 6))


def _trimmed(fn: Callable[[int], int] | None, late: bool, max_seconds: float) -> MallocShare:
    before = anonymous_bytes()
    if fn is None:
        note: str | None = "this process's C library has no malloc_trim (it is glibc's)"
    elif late:
        note = f"skipped: the probe had taken max_seconds ({max_seconds:g} s)"
    else:
        note = None
    released: bool | None = None
    t = time.perf_counter()
    if fn is not None and note is None:
        released = bool(fn(0))
    seconds = time.perf_counter() - t
    after = anonymous_bytes() if note is None else before
    return MallocShare(**_share(before, after, seconds), available=fn is not None, released=released, note=note)


def trim(max_seconds: float) -> TrimDoc:
    """``malloc_trim(0)``, a full ``gc.collect()``, then ``malloc_trim(0)`` again: each share apart.

    The first trim takes out what the allocator kept before the probe, so that the second
    returns only what the garbage's memory left with the allocator (glibc keeps small freed
    chunks in its arenas). The collection is one C call that holds the GIL for its whole pass
    (what the service's own collector would take); ``malloc_trim`` runs through ctypes, which
    lets the GIL go. A step that would start after ``max_seconds`` is skipped. The probe changes
    the process (that is what it measures): run it where an owner opted in.
    """
    started, taken_at = time.perf_counter(), time.time()

    def late() -> bool:
        return time.perf_counter() - started > max_seconds

    fn = malloc_trim()
    first = _trimmed(fn, False, max_seconds)
    enabled = gc.isenabled()
    garbage = len(gc.garbage)
    before = anonymous_bytes()
    t = time.perf_counter()
    skipped = late()
    objects = 0 if skipped else gc.collect()
    collected = time.perf_counter() - t
    collect = CollectShare(
        **_share(before, anonymous_bytes(), collected),
        collector_enabled=enabled,
        objects=objects,
        uncollectable=len(gc.garbage) - garbage,
        note=f"skipped: the probe had taken max_seconds ({max_seconds:g} s)" if skipped else None,
    )
    second = _trimmed(fn, late(), max_seconds)
    return TrimDoc(
        schema=TRIM_SCHEMA,
        pid=os.getpid(),
        taken_at=taken_at,
        seconds=round(time.perf_counter() - started, 6),
        max_seconds=max_seconds,
        kept_by_allocator=first,
        collect=collect,
        malloc_trim=second,
        findings=_findings(first, collect, second),
    )


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{round(n / 1e6, 1) + 0.0:,.1f} MB"  # + 0.0: never "-0.0"


def _findings(first: MallocShare, collect: CollectShare, second: MallocShare) -> list[str]:
    said: list[str] = []
    if first["released"] is not None:
        said.append(
            f"malloc_trim(0) returned {_mb(first['given_back_bytes'])} that the C allocator kept free: "
            "memory freed, not given back to the system (not a leak; MALLOC_ARENA_MAX, malloc_trim bound it)"
        )
    elif first["note"]:
        said.append(f"malloc_trim: {first['note']}")
    freed, kept = collect["given_back_bytes"], second["given_back_bytes"]
    memory = f"the memory it held: {_mb(freed)} given back at once"
    if second["released"] is not None:
        memory += f", {_mb(kept)} more by malloc_trim(0) after it"
    if not collect["collector_enabled"] and collect["objects"]:
        said.append(
            f"the collector is disabled in this process (gc.disable()): gc.collect() found "
            f"{collect['objects']:,} unreachable objects (reference cycles) it would never have freed; {memory}"
        )
    elif collect["objects"]:
        said.append(
            f"gc.collect() freed {collect['objects']:,} unreachable objects the collector had not reached yet; {memory}"
        )
    if collect["uncollectable"]:
        said.append(f"{collect['uncollectable']:,} objects are uncollectable (left in gc.garbage)")
    return said
