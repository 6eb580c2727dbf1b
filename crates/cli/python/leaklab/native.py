"""The native allocation trace: where the memory no Python object holds was allocated.

The census names Python holders; memory kept below Python (oneDNN's primitive cache, cuDNN's
plan cache, the allocator's own arenas) is reachable from no Python object. This module runs
memray's tracer (``memray.Tracker(path, native_traces=True)``, the optional extra
``pip install leaklab[native]``) inside the process over a bounded window, a number of requests
or seconds, then reads what the window allocated and left live
(``FileReader.get_leaked_allocation_records(merge_threads=True)``) into the top native stacks
by bytes, each with its frames (library frames kept: they are the point) and, where a frame is
one leaklab knows (:data:`KNOWN`), the mechanism and the knob that bounds it. An unknown holder
is still reported with its stacks.

    window = NativeWindow(requests=200, seconds=30)
    note = window.start()           # None, or why the trace cannot run here
    ...                             # serve requests; window.request_done() after each
    doc = window.stop()             # the NativeDoc (JSON-ready); its ``note`` says what failed

Bounds: the window closes at ``requests`` requests or ``seconds`` seconds (at most the owner's
``max_seconds``), or as soon as the capture file passes ``max_capture_bytes``; a watchdog thread
checks the time, the file and a request ``counter`` where one is given (the agent's), so a
window nobody closes still ends. The capture is memray's full
format, written as the window runs, so that its cap holds while tracing (memray's aggregated
format, 40 times smaller here, is written only when tracing stops), compressed when it stops,
in a temporary folder removed once read. One window per process: memray allows one tracker at
a time.

Nothing here raises into the application: memray missing, a tracker that cannot start (another
one active, a platform memray does not support) or a capture that cannot be read give a
document whose ``note`` says so. memray sees the allocations of the host's allocators (malloc,
mmap), not GPU memory (memray #229); sizes are what was asked, so an mmap counts its whole
mapping, resident or not. The window's growth of resident anonymous memory (RssAnon) is
reported beside them: what grew there beyond what was left live was freed but kept by the
allocator (:data:`ALLOCATOR_RETENTION`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypedDict

__all__ = [
    "ALLOCATOR_RETENTION",
    "KNOWN",
    "SCHEMA",
    "Frame",
    "Holder",
    "Mechanism",
    "NativeDoc",
    "NativeWindow",
    "Stack",
    "mechanism_of",
    "trace_for",
]

SCHEMA = "leaklab.native/1"
StopReason = Literal["requests", "seconds", "max_capture_bytes", "stopped", "not started"]


@dataclass(frozen=True)
class Mechanism:
    """A native holder leaklab knows: the frames that name it, and what bounds it."""

    key: str  #: ``onednn_primitive_cache``
    title: str
    patterns: tuple[str, ...]  #: substrings of a frame's symbol that name it
    knobs: tuple[str, ...]  #: environment variables and calls that bound or return it
    fix: str


#: Known native holders, matched against each stack's frames from the allocation outwards: the
#: first frame that names one decides. Only the oneDNN entry is verified here (torch 2.11 CPU:
#: its frames are ``dnnl::impl::utils::cache_t<…primitive_cache…>``, ``ideep::utils::
#: computation_cache<…, 1024ul, …>`` and ``dnnl::impl::cpu::x64::jit_generator_t``); the CUDA
#: ones are the class names of PyTorch's sources (Conv_v8.cpp, CUDACachingAllocator.cpp).
KNOWN: tuple[Mechanism, ...] = (
    Mechanism(
        key="onednn_primitive_cache",
        title="oneDNN's primitive cache and ideep's (one entry and its JIT-compiled kernel per new input shape)",
        patterns=(
            "dnnl::impl::utils::lru_cache_t",
            "dnnl::impl::utils::cache_t",
            "primitive_cache",
            "ideep::utils::lru_cache",
            "ideep::utils::computation_cache",
            "jit_generator",
        ),
        knobs=("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"),
        fix=(
            "bounded by the caches' capacities (1,024 entries each by default): bucket input shapes "
            "(pad or resize to a few sizes), or lower the capacities "
            "(ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 LRU_CACHE_CAPACITY=1 turn them off, at a cost per call)"
        ),
    ),
    Mechanism(
        key="cudnn_plan_cache",
        title="cuDNN's execution plan cache (one plan per new input shape, per thread)",
        patterns=("BenchmarkCache", "cudnn_frontend::ExecutionPlan", "cudnn_frontend::ExecutionPlan_v8"),
        knobs=("TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT",),
        fix=(
            "bounded by TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT (10,000 plans by default): lower it, or bucket input shapes"
        ),
    ),
    Mechanism(
        key="cuda_caching_allocator",
        title="PyTorch's CUDA caching allocator (its host-side memory; memray does not see GPU memory)",
        patterns=("CUDACachingAllocator", "CachingHostAllocator"),
        knobs=("PYTORCH_CUDA_ALLOC_CONF",),
        fix=(
            "the allocator keeps freed blocks for reuse: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "or max_split_size_mb against fragmentation; torch.cuda.empty_cache() returns cached blocks"
        ),
    ),
)

#: Not named by a frame (memray sees malloc's callers, not glibc's arenas): the share of the
#: window's RssAnon growth beyond what the window left live, memory freed but kept by malloc.
ALLOCATOR_RETENTION = Mechanism(
    key="glibc_arenas",
    title="memory freed but kept by the C allocator (glibc's arenas)",
    patterns=(),
    knobs=("MALLOC_ARENA_MAX", "malloc_trim"),
    fix=(
        "not a leak while it stays bounded: MALLOC_ARENA_MAX=2 limits the arenas of many threads; "
        "malloc_trim(0) (ctypes.CDLL('libc.so.6').malloc_trim(0)) returns the free pages"
    ),
)

#: Retention smaller than this is noise (page-table and interpreter growth of a busy process).
_RETENTION_FLOOR = 1 << 20


class Frame(TypedDict):
    symbol: str
    file: str  #: ``<unknown>`` for a library built without debug information
    line: int


class Stack(TypedDict):
    """One native stack the window left memory live under."""

    bytes: int
    allocations: int
    mechanism: str | None  #: a :data:`KNOWN` key, or None for a holder leaklab does not know
    frames: list[Frame]  #: native frames, the allocating one first
    frames_omitted: int  #: frames beyond ``max_frames``
    python: list[Frame]  #: the Python frames that were running, innermost first


class Holder(TypedDict):
    """A known mechanism, summed over every stack (not only the top ones) that names it."""

    mechanism: str
    title: str
    knobs: list[str]
    fix: str
    bytes: int
    allocations: int
    stacks: int


class NativeDoc(TypedDict):
    """What the window left live, by native stack; ``note`` says what could not be done."""

    schema: str  #: ``leaklab.native/1``
    pid: int
    traced: bool  #: False where the tracer did not run (then ``note`` says why)
    started_at: float | None
    seconds: float  #: the window's length
    requests: int  #: requests counted (``request_done``) during the window
    stopped_by: StopReason
    capture_bytes: int  #: the size of memray's capture file
    read_seconds: float  #: reading the capture
    live_bytes: int  #: allocated during the window and not freed by its end
    live_allocations: int
    stacks_total: int
    holders: list[Holder]  #: known mechanisms, largest first
    unattributed_bytes: int  #: live bytes under no known mechanism (see ``top``)
    rss_anon_growth_bytes: int | None  #: RssAnon at the end minus at the start
    top: list[Stack]
    note: str | None


class _Record(Protocol):
    """The part of ``memray.AllocationRecord`` read here."""

    @property
    def size(self) -> int: ...
    @property
    def n_allocations(self) -> int: ...
    def native_stack_trace(self, max_stacks: int | None = None) -> list[tuple[str, str, int]]: ...
    def stack_trace(self, max_stacks: int | None = None) -> list[tuple[str, str, int]]: ...


def mechanism_of(symbols: Iterable[str]) -> Mechanism | None:
    """The known mechanism the first naming frame belongs to (frames from the allocation out)."""
    for symbol in symbols:
        for m in KNOWN:
            if any(p in symbol for p in m.patterns):
                return m
    return None


# One window per process: memray allows one tracker at a time.
_process_lock = threading.Lock()


class NativeWindow:
    """A native allocation trace over a bounded window; see the module's doc.

    - ``requests``: close after this many requests (None: by time only), counted by
      :meth:`request_done` or, where ``counter`` is given (a count of requests answered, such
      as the agent's), read from it every 50 ms: the window then closes within 50 ms of the last.
    - ``seconds``: close after this long; at most ``max_seconds`` (the owner's ceiling).
    - ``max_capture_bytes``: close as soon as the capture file passes this size.
    - ``top``: how many stacks the document lists; ``max_frames``: native frames per stack.
    """

    def __init__(
        self,
        *,
        requests: int | None = None,
        seconds: float = 30.0,
        max_seconds: float = 120.0,
        max_capture_bytes: int = 64 << 20,
        top: int = 10,
        max_frames: int = 32,
        python_frames: int = 5,
        counter: Callable[[], int] | None = None,
    ) -> None:
        if requests is not None and requests < 1:
            raise ValueError(f"requests must be 1 or more (or None for a window by time), not {requests!r}")
        if not 0 < max_seconds < float("inf") or not 0 < seconds <= max_seconds:
            raise ValueError(f"seconds must be more than 0 and at most max_seconds ({max_seconds:g}), not {seconds!r}")
        if max_capture_bytes < 1 or top < 0 or max_frames < 1 or python_frames < 0:
            raise ValueError("max_capture_bytes and max_frames must be 1 or more, top and python_frames 0 or more")
        self._requests, self._seconds, self._cap = requests, float(seconds), int(max_capture_bytes)
        self._top, self._max_frames, self._python_frames = top, max_frames, python_frames
        self._lock = threading.Lock()  # guards the state below
        self._closed = threading.Event()
        self._tracker: Any = None
        self._dir: str | None = None
        self._path = ""
        self._count = 0
        self._counter, self._counted_from = counter, 0
        self._started_at: float | None = None
        self._started = 0.0
        self._length = 0.0
        self._rss_start: int | None = None
        self._rss_growth: int | None = None
        self._stopped_by: StopReason = "not started"
        self._note: str | None = None
        self._holds_process_lock = False
        self._reading = threading.Lock()
        self._doc: NativeDoc | None = None

    # --- the window -------------------------------------------------------------------------------

    def start(self) -> str | None:
        """Start tracing; None, or the reason it cannot (also the document's ``note``)."""
        with self._lock:
            if self._started_at is not None or self._note is not None:
                return self._note or "this window has already started"
            self._note = self._start()
            if self._note is not None:
                self._closed.set()
            return self._note

    def _start(self) -> str | None:
        try:
            import memray
        except ImportError as e:
            return (
                f"the native trace needs memray, which cannot be imported here ({e}): "
                "pip install 'leaklab[native]' (memray has wheels for Linux and macOS)"
            )
        if not _process_lock.acquire(blocking=False):
            return "a native trace is already running in this process; ask again when it has finished"
        self._holds_process_lock = True
        tracker: Any = None
        try:
            self._dir = tempfile.mkdtemp(prefix="leaklab-native-")
            self._path = os.path.join(self._dir, "capture.bin")
            tracker = memray.Tracker(self._path, native_traces=True)
            self._rss_start = _rss_anon()
            self._counted_from = self._counter() if self._counter is not None else 0
            tracker.__enter__()
        except Exception as e:  # another tracker active, an unsupported platform, a full disk
            tracker = None  # its writer closes (and compresses) the file before the folder goes
            self._cleanup()
            return f"memray's tracer could not start: {type(e).__name__}: {e}"
        self._tracker = tracker
        self._started_at, self._started = time.time(), time.monotonic()
        threading.Thread(target=self._watch, name="leaklab-native-watchdog", daemon=True).start()
        return None

    def _watch(self) -> None:
        deadline = self._started + self._seconds
        while not self._closed.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                self._close("seconds")
            elif _size(self._path) > self._cap:
                self._close("max_capture_bytes")
            elif self._counter is not None and self._requests is not None:
                if self._counter() - self._counted_from >= self._requests:
                    self._close("requests")

    def request_done(self) -> None:
        """Count one request; the window closes at ``requests``. Cheap, and safe from any thread."""
        with self._lock:
            if self._tracker is None:
                return
            self._count += 1
            done = self._requests is not None and self._count >= self._requests
        if done:
            self._close("requests")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the window has closed (or could not start); False on ``timeout``."""
        return self._closed.wait(timeout)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _close(self, reason: StopReason) -> None:
        with self._lock:
            tracker, self._tracker = self._tracker, None
            if tracker is None:
                return
            try:
                tracker.__exit__(None, None, None)
            except Exception as e:
                self._note = f"memray's tracer failed to stop: {type(e).__name__}: {e}"
            self._release()  # the tracer is off: another window may start while this one is read
            self._length = time.monotonic() - self._started
            if self._counter is not None:
                self._count += self._counter() - self._counted_from
            rss = _rss_anon()
            if rss is not None and self._rss_start is not None:
                self._rss_growth = rss - self._rss_start
            self._stopped_by = reason
            self._closed.set()

    def stop(self) -> NativeDoc:
        """Close the window if it is still open, read the capture and remove it: the document.

        Call it once the window has closed, or to close it now; a second call gives the same.
        """
        self._close("stopped")
        with self._reading:
            if self._doc is None:
                try:
                    self._doc = self._read()
                finally:
                    self._cleanup()
            return self._doc

    # --- reading ----------------------------------------------------------------------------------

    def _read(self) -> NativeDoc:
        doc = NativeDoc(
            schema=SCHEMA,
            pid=os.getpid(),
            traced=self._started_at is not None,
            started_at=self._started_at,
            seconds=round(self._length, 3),
            requests=self._count,
            stopped_by=self._stopped_by,
            capture_bytes=max(_size(self._path), 0) if self._path else 0,
            read_seconds=0.0,
            live_bytes=0,
            live_allocations=0,
            stacks_total=0,
            holders=[],
            unattributed_bytes=0,
            rss_anon_growth_bytes=self._rss_growth,
            top=[],
            note=self._note,
        )
        if not doc["traced"]:
            doc["note"] = self._note or "the window was never started (NativeWindow.start)"
            return doc
        if self._note is not None:
            return doc
        began = time.monotonic()
        try:
            import memray

            records: list[_Record] = list(
                memray.FileReader(self._path).get_leaked_allocation_records(merge_threads=True)
            )
            self._summarise(doc, records)
        except Exception as e:
            doc["note"] = f"memray's capture could not be read: {type(e).__name__}: {e}"
        doc["read_seconds"] = round(time.monotonic() - began, 3)
        return doc

    def _summarise(self, doc: NativeDoc, records: list[_Record]) -> None:
        # Records come merged per (Python stack, native stack); leaklab's unit is the native one.
        stacks: dict[tuple[tuple[str, str, int], ...], Stack] = {}
        largest: dict[tuple[tuple[str, str, int], ...], int] = {}
        held: dict[str, Holder] = {}
        for r in records:
            native = tuple(r.native_stack_trace())
            doc["live_bytes"] += r.size
            doc["live_allocations"] += r.n_allocations
            s = stacks.get(native)
            if s is None:
                m = mechanism_of(f[0] for f in native)
                s = stacks[native] = Stack(
                    bytes=0,
                    allocations=0,
                    mechanism=m.key if m else None,
                    frames=[_frame(f) for f in native[: self._max_frames]],
                    frames_omitted=max(0, len(native) - self._max_frames),
                    python=[],
                )
                if m is not None and m.key not in held:
                    held[m.key] = _holder(m)
            s["bytes"] += r.size
            s["allocations"] += r.n_allocations
            if r.size > largest.get(native, -1):  # the Python stack of the stack's largest record
                largest[native] = r.size
                s["python"] = [_frame(f) for f in r.stack_trace(max_stacks=self._python_frames)]
            if s["mechanism"] is not None:
                h = held[s["mechanism"]]
                h["bytes"] += r.size
                h["allocations"] += r.n_allocations
        for s in stacks.values():
            if s["mechanism"] is not None:
                held[s["mechanism"]]["stacks"] += 1
        attributed = sum(h["bytes"] for h in held.values())
        retained = (self._rss_growth or 0) - doc["live_bytes"]
        if retained > _RETENTION_FLOOR:
            held[ALLOCATOR_RETENTION.key] = _holder(ALLOCATOR_RETENTION, retained)
        doc["stacks_total"] = len(stacks)
        doc["holders"] = sorted(held.values(), key=lambda h: -h["bytes"])
        doc["unattributed_bytes"] = doc["live_bytes"] - attributed
        doc["top"] = sorted(stacks.values(), key=lambda s: -s["bytes"])[: self._top]

    def _cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._release()

    def _release(self) -> None:
        if self._holds_process_lock:
            self._holds_process_lock = False
            _process_lock.release()


def trace_for(
    seconds: float,
    *,
    max_seconds: float,
    requests: int | None = None,
    counter: Callable[[], int] | None = None,
    max_capture_bytes: int = 64 << 20,
    top: int = 10,
) -> NativeDoc:
    """One window over whatever the process serves meanwhile, read: what the agent's route runs.

    It closes after ``seconds``, or ``requests`` as ``counter`` counts them. It blocks for the
    window and the reading (run it in a worker thread), and never raises for memray's sake.
    """
    window = NativeWindow(
        requests=requests,
        seconds=seconds,
        max_seconds=max_seconds,
        max_capture_bytes=max_capture_bytes,
        top=top,
        counter=counter,
    )
    if window.start() is None:
        window.wait()
    return window.stop()


def _holder(m: Mechanism, retained: int = 0) -> Holder:
    return Holder(
        mechanism=m.key,
        title=m.title,
        knobs=list(m.knobs),
        fix=m.fix,
        bytes=retained,
        allocations=0,
        stacks=0,
    )


def _frame(f: tuple[str, str, int]) -> Frame:
    return Frame(symbol=f[0], file=f[1], line=f[2])


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def _rss_anon() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
