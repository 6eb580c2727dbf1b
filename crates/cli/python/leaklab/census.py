"""The tensor census: every live tensor reachable from Python, grouped by the object that holds it.

A leak scan from outside says *that* memory grows; a CUDA snapshot says where the kept memory was
*born*. The census answers the next question, *who keeps it*: it names, for every live tensor,
the path from a root to the container that holds it, in the words a Python engineer reads
(``service.HISTORY``, ``main.app.state.responses``, ``main.app.state.model.2._forward_hooks[…] →
make_hook.<locals>.hook → cell 'x'``), and sums per holder the bytes of the tensors' storages (each storage once: views
share it) and of what their autograd graphs keep alive. Taken twice, after a warm-up and after N
requests, the holders whose bytes grew are the leak, and the names say where it is kept.

This module holds the document, :func:`census` and :func:`census_diff` (the ``leaklab`` binary's
diff, the one every tool uses); the census's jobs live in
modules of their own (the costs are in docs/agent.md):

1. :mod:`leaklab._walk`: the tensors among the objects the collector lists, then a
   breadth-first walk from the roots (modules' globals, threads' frames), each object once.
2. :mod:`leaklab._naming`: the path from a root to each reached tensor's container.
3. :mod:`leaklab._storage`: each storage counted once in the whole census (keyed by base
   address and device), for the first holder that reaches it; then the autograd graphs of the
   tensors that carry one, each node once, and the saved tensors whose storage no
   Python-visible tensor holds are the graph's own bytes. The plugin's tally counts the same way.
4. :mod:`leaklab._unreached`: the tensors the walk did not reach, sorted as the collector would
   into unreachable cycles and tensors held from native code.

All of it reads the user's objects without running their code (:mod:`leaklab._reflect`). It runs
Python code and hands the GIL to any thread waiting for it every 1,024 objects, so the event
loop keeps serving while it runs; ``max_seconds`` and ``max_depth`` bound it, its deadline
checked in every phase (:mod:`leaklab._bounds`); a census that stopped early says why and keeps
what it found. A tensor ``gc.freeze()`` hid from ``gc.get_objects()`` is still found by the walk.
Importing this module imports no torch, nor does :func:`census`: a process that has not
imported torch holds no tensors, and its census says so (torch ``not imported``).
"""

from __future__ import annotations

import collections
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, TypedDict

from leaklab._bounds import CHECK_EVERY, Bounds
from leaklab._naming import ITEM, Entry, Namer
from leaklab._process import CollectorState, ThreadsState, collector_state, threads_state
from leaklab._reflect import class_name, subclasses
from leaklab._storage import device_name, graph_nodes, nbytes, saved_tensors, storages
from leaklab._unreached import Unreached
from leaklab._walk import listed_tensors, roots, walk

SCHEMA = "leaklab.census/1"
#: A diff takes milliseconds: past this, the binary is stuck.
DIFF_TIMEOUT_SECONDS = 60.0
#: The holder of the tensors a census that ran out of time could not count (their number only).
NOT_COUNTED = "(not counted: the census stopped early)"

__all__ = [
    "ITEM",
    "SCHEMA",
    "CensusDiff",
    "CensusDoc",
    "CensusError",
    "GraphStats",
    "Growth",
    "Holder",
    "Phases",
    "Totals",
    "census",
    "census_diff",
]


class GraphStats(TypedDict):
    """The autograd graphs of a holder's tensors: what they keep alive beside the tensors."""

    tensors: int  #: tensors of this holder that carry a graph (``grad_fn`` set)
    nodes: int  #: graph nodes first reached from this holder (each node counted once per census)
    saved_tensors: int  #: saved tensors whose storage only graphs hold (counted in saved_bytes)
    saved_bytes: int  #: bytes of those storages, not already counted as a holder's ``bytes``


class Holder(TypedDict):
    """One holder: the container that keeps tensors alive, and what it keeps."""

    holder: str  #: the path from a root to the container, variable parts as ``[…]``
    kind: str  #: module global, class attribute, closure, frame, log records, native, unreachable cycle, ...
    tensors: int  #: Python tensor objects it holds (views counted, storages not twice)
    bytes: int  #: bytes of the storages first reached through it
    devices: dict[str, int]  #: bytes per device (``cpu``, ``cuda:0``)
    dtypes: dict[str, int]  #: tensors per dtype (``float32``)
    shapes: list[list[int]]  #: up to five distinct shapes, in the order met
    graph: GraphStats
    #: ``id()`` of the deepest object every tensor of the holder is reached through (the list,
    #: the hook dict): the same object in every census of this process however the walk reached
    #: it, so that a holder reached by another path is still itself. None where its tensors
    #: share no object (frames of different threads) or it has no path (not reached).
    identity: int | None


class Totals(TypedDict):
    """The whole census: every storage once, every graph node once."""

    tensors: int
    bytes: int
    graph_nodes: int
    graph_saved_bytes: int


class Phases(TypedDict):
    """Seconds spent in each phase of the census (their sum is about ``seconds``)."""

    objects: float  #: ``gc.get_objects()`` and picking the tensors
    walk: float  #: the breadth-first walk from the roots
    unreached: float  #: climbing the referrers of the tensors the walk did not reach
    tensors: float  #: names, storages, devices, dtypes, shapes
    graphs: float  #: the autograd graphs


class Heap(TypedDict):
    """Python's own heap beside the tensors: what grows where no tensor does."""

    blocks: int  #: ``sys.getallocatedblocks()``: pymalloc blocks in use (every small object, tracked or not)
    #: gc-tracked objects by type (``module.qualname``, read from the type without running its
    #: code; builtins bare), the most numerous first, at most :data:`TYPES_KEPT`
    types: dict[str, int]


#: Types a census keeps in ``heap.types``: the most numerous (a type that grows a request is
#: among them within a few hundred requests).
TYPES_KEPT = 300


class CensusDoc(TypedDict):
    """``GET /debug/leaklab/tensors`` and :func:`census`: the document the ``leaklab`` binary reads."""

    schema: str  #: ``leaklab.census/1``
    pid: int
    taken_at: float  #: unix seconds when the census started
    seconds: float  #: wall time of the census (it holds the GIL in turns with other threads)
    cpu_seconds: float  #: CPU time of the thread that took it: its own cost, waits for the GIL left out
    complete: bool  #: False when a bound stopped it (what it found is kept)
    stopped_early: str | None  #: why it stopped early, in a sentence
    objects: int  #: gc-tracked objects when it started
    frozen: int  #: objects gc.freeze() moved aside (not in ``objects``; the walk still reaches them)
    visited: int  #: objects the walk went through
    max_seconds: float
    max_depth: int
    python: str
    torch: str
    phases: Phases
    totals: Totals
    holders: list[Holder]  #: largest first (bytes + graph saved bytes)
    holders_omitted: int  #: holders left out by ``top`` (their bytes are still in ``totals``)
    collector: CollectorState  #: the collector as the process had it (where it is off, cycles are never freed)
    threads: ThreadsState  #: Python and OS threads alive when it started
    heap: Heap  #: Python's own heap: pymalloc blocks and objects by type


class Growth(TypedDict):
    """A holder that grew between two censuses (:func:`census_diff`)."""

    holder: str
    kind: str
    bytes: int  #: bytes + graph saved bytes, after minus before
    bytes_per_step: float  #: ``bytes`` over the calls or requests between the censuses
    tensors: int
    graph_nodes: int
    bytes_after: int  #: bytes + graph saved bytes in the second census
    shapes: list[list[int]]  #: up to three of its shapes in the second census


class CensusDiff(TypedDict):
    """Who holds what accumulated between two censuses (:func:`census_diff`, ``leaklab census-diff``)."""

    steps: int
    grown: list[Growth]  #: holders whose bytes, tensors or graph nodes grew, most bytes first
    total_bytes: int  #: every tensor's bytes plus graph saved bytes, after minus before
    total_tensors: int
    total_graph_nodes: int
    census_seconds: list[float]  #: what each census took, before and after
    notes: list[str]  #: holders matched under another name, censuses that stopped early


class CensusError(RuntimeError):
    """The census cannot run in this process (torch is not installed)."""


class _NotImported:
    """Stands in for torch in a process that has not imported it: it holds no tensors, and the
    census must not import torch for it (a service that never used torch would gain ~270 MB and
    3.5 s of CPU, measured on the watch's test service)."""

    class Tensor:  # no object of the process is one of these
        pass

    __version__ = "not imported"


def _torch() -> Any:
    """torch where this process imported it; :class:`_NotImported` where it has not but could
    (it holds no tensors, and nothing is imported); :class:`CensusError` where it cannot."""
    # Typed as Any on purpose: the census must work across torch versions and mypy need not
    # analyse torch to check this package.
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        if importlib.util.find_spec("torch") is not None:
            return _NotImported
    except (ImportError, ValueError):
        pass  # said below, in import's own words
    try:
        import torch as imported
    except ImportError as e:
        raise CensusError(
            f"the tensor census needs torch, and this Python ({sys.executable}) cannot import it: {e}"
        ) from e
    return imported


def census(*, max_seconds: float = 10.0, max_depth: int = 1000, top: int = 0) -> CensusDoc:
    """Take a tensor census of this process.

    ``max_seconds`` bounds the wall time of the whole census, checked in every phase, and
    ``max_depth`` the length of a path from a root; a census that hits either says so in
    ``stopped_early`` and keeps what it found. ``top`` keeps only the largest holders in
    ``holders`` (0: all of them). Refused (:class:`CensusError`) where torch cannot be imported
    and on free-threaded CPython with the GIL off.
    """
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, not {max_seconds!r}")
    if max_depth < 1:
        raise ValueError(f"max_depth must be at least 1, not {max_depth!r}")
    if top < 0:
        raise ValueError(f"top must be 0 (all holders) or positive, not {top!r}")
    if not _gil_enabled():
        raise CensusError(
            "the tensor census refuses to run on free-threaded CPython with the GIL off "
            "(sys._is_gil_enabled() is False): it reads reference counts and walks containers that other "
            "threads would change under it; run the service with PYTHON_GIL=1 (or python -X gil=1) to take one"
        )
    torch = _torch()
    enabled = gc.isenabled()
    process = collector_state(), threads_state()  # before the census turns the collector off
    # A collection started by our own allocations would hold the GIL for its whole pass: the
    # collector is off while the census works, and back on (where it was) at each pause.
    gc.disable()
    try:
        return _Census(torch, Bounds(max_seconds, max_depth, collector=enabled)).run(top, *process)
    finally:
        if enabled:
            gc.enable()


def _gil_enabled() -> bool:
    """False on free-threaded CPython (3.13t and later) running with the GIL off."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def census_diff(before: CensusDoc, after: CensusDoc, steps: int = 1) -> CensusDiff:
    """The holders that grew from ``before`` to ``after``, ``steps`` calls or requests apart.

    One diff for every tool: this asks the ``leaklab`` binary (``leaklab census-diff --json``,
    one subprocess), the diff ``leaklab scan --agent`` and the pytest plugin use. A holder is
    compared with the same object in ``before`` where the census says so (its ``identity``,
    however it was reached), else with the holder of the same name; growth in tensors or graph
    nodes alone counts too. Raises :class:`CensusError` where the binary gives no answer.
    """
    from leaklab._find_bin import LeaklabNotFound, find_leaklab_bin

    if steps < 1:
        raise ValueError(f"steps is the number of calls or requests between the censuses, at least 1, not {steps!r}")
    try:
        binary = find_leaklab_bin()
    except LeaklabNotFound as e:
        raise CensusError(f"the census diff is the leaklab binary's: {e}") from None
    with tempfile.TemporaryDirectory(prefix="leaklab-census-") as folder:
        paths = [os.path.join(folder, name) for name in ("before.json", "after.json")]
        for path, doc in zip(paths, (before, after), strict=True):
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
        try:
            done = subprocess.run(
                [binary, "census-diff", *paths, "--steps", str(steps), "--json"],
                capture_output=True,
                timeout=DIFF_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CensusError(f"{binary} census-diff gave no answer: {e}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[-2000:] or "(nothing on stderr)"
        raise CensusError(f"{binary} census-diff exited {done.returncode}: {said}")
    answer: CensusDiff = json.loads(done.stdout)
    return answer


class _Totals:
    __slots__ = (
        "bytes",
        "devices",
        "dtypes",
        "graph_nodes",
        "graph_saved",
        "graph_saved_bytes",
        "graph_tensors",
        "identity",
        "kind",
        "name",
        "shapes",
        "tensors",
    )

    def __init__(self, name: str, kind: str) -> None:
        self.name, self.kind = name, kind
        self.tensors = self.bytes = 0
        self.devices: dict[str, int] = {}
        self.dtypes: dict[str, int] = {}
        self.shapes: list[list[int]] = []
        self.graph_tensors = self.graph_nodes = self.graph_saved = self.graph_saved_bytes = 0
        self.identity: int | None = None

    def document(self) -> Holder:
        return Holder(
            holder=self.name,
            kind=self.kind,
            tensors=self.tensors,
            bytes=self.bytes,
            devices=self.devices,
            dtypes=self.dtypes,
            shapes=self.shapes,
            graph=GraphStats(
                tensors=self.graph_tensors,
                nodes=self.graph_nodes,
                saved_tensors=self.graph_saved,
                saved_bytes=self.graph_saved_bytes,
            ),
            identity=self.identity,
        )


class _Census:
    def __init__(self, torch: Any, bounds: Bounds) -> None:
        self.torch = torch
        self.tensor_type: type = torch.Tensor
        self.bounds = bounds
        self.cpu_started = time.thread_time()
        self.namer = Namer(torch)
        self.counted: set[Any] = set()  # storage keys counted, by a holder or a graph
        self.graph_keys: set[Any] = set()  # storage keys some graph saves
        self.nodes: dict[int, Any] = {}  # graph nodes walked: id -> node, kept so ids stay unique
        self.saved_attrs: dict[type, tuple[str, ...]] = {}
        self.dtypes: dict[Any, str] = {}  # torch.float32 -> "float32"

    def run(self, top: int, collector: CollectorState, threads: ThreadsState) -> CensusDoc:
        bounds = self.bounds
        taken_at = time.time()
        clock = bounds.started
        spent: dict[str, float] = collections.defaultdict(float)

        def lap(phase: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            spent[phase] += now - clock
            clock = now

        # 1: the objects, and the tensors among them.
        kinds = subclasses(self.tensor_type)
        blocks = sys.getallocatedblocks()
        tensors, objects, counts = listed_tensors(kinds, bounds)
        heap = Heap(blocks=blocks, types={class_name(t): n for t, n in counts.most_common(TYPES_KEPT)})
        del counts
        lap("objects")

        # 2: the walk.
        order, parent, labels = roots()
        reached: dict[int, int] = {}  # id(tensor) -> position of its parent in `order`
        found: list[Any] = []
        walk(order, parent, kinds, reached, found, bounds)
        visited = len(order)
        lap("walk")

        # 3: the reached tensors' holders, from their parents' labels; their storages.
        entries = self.namer.holders(found, reached, order, parent, labels, bounds)
        unreached = [t for t in tensors if id(t) not in reached]
        bounds.release(order)
        del tensors, reached, found, order, parent, labels
        holders: dict[str, _Totals] = {}
        self.count(entries, holders)
        for name, identity in self.namer.identities.items():
            if name in holders:
                holders[name].identity = identity
        lap("tensors")

        # 4: their graphs. Python-visible storages are all counted by now, so what a graph
        # saves beside them is the graph's own.
        self.graphs(entries, holders)
        lap("graphs")

        # 5: the tensors the walk did not reach.
        if bounds.late():  # no time to look at them: their number only
            self.uncounted(holders, len(unreached))
            unreached.clear()
        # Empties `unreached` as it takes the tensors over.
        more = list(Unreached(self.namer, bounds, self.tensor_type, objects).holders(unreached, self.graph_keys))
        lap("unreached")
        self.count(more, holders)
        lap("tensors")
        self.graphs(more, holders)
        del entries, more
        lap("graphs")

        docs = [h.document() for h in holders.values()]
        docs.sort(key=lambda h: (-(h["bytes"] + h["graph"]["saved_bytes"]), h["holder"]))
        totals = Totals(
            tensors=sum(h["tensors"] for h in docs),
            bytes=sum(h["bytes"] for h in docs),
            graph_nodes=sum(h["graph"]["nodes"] for h in docs),
            graph_saved_bytes=sum(h["graph"]["saved_bytes"] for h in docs),
        )
        kept = docs[:top] if top else docs
        return CensusDoc(
            schema=SCHEMA,
            pid=os.getpid(),
            taken_at=taken_at,
            seconds=round(clock - bounds.started, 6),
            cpu_seconds=round(time.thread_time() - self.cpu_started, 6),
            complete=bounds.stopped is None,
            stopped_early=bounds.stopped,
            objects=objects,
            frozen=gc.get_freeze_count(),
            visited=visited,
            max_seconds=bounds.max_seconds,
            max_depth=bounds.max_depth,
            python=sys.version.split()[0],
            torch=str(getattr(self.torch, "__version__", "?")),
            phases=Phases(
                objects=round(spent["objects"], 6),
                walk=round(spent["walk"], 6),
                tensors=round(spent["tensors"], 6),
                graphs=round(spent["graphs"], 6),
                unreached=round(spent["unreached"], 6),
            ),
            totals=totals,
            holders=kept,
            holders_omitted=len(docs) - len(kept),
            collector=collector,
            threads=threads,
            heap=heap,
        )

    @staticmethod
    def uncounted(holders: dict[str, _Totals], tensors: int) -> None:
        """Tensors left when time was up keep their number, not their bytes (reading them is what
        there was no time for)."""
        if tensors:
            rest = holders.setdefault(NOT_COUNTED, _Totals(NOT_COUNTED, "not reached"))
            rest.tensors += tensors

    def count(self, entries: list[Entry], holders: dict[str, _Totals]) -> None:
        counted, dtypes, bounds = self.counted, self.dtypes, self.bounds
        for n, (t, name, kind) in enumerate(entries):
            if n % CHECK_EVERY == 0 and bounds.up(f"{n:,} of {len(entries):,} tensors were counted"):
                self.uncounted(holders, len(entries) - n)
                return
            h = holders.get(name)
            if h is None:
                h = holders[name] = _Totals(name, kind)
            h.tensors += 1
            for key, source in storages(t):
                if key not in counted:
                    counted.add(key)
                    size = nbytes(key, source)
                    h.bytes += size
                    device = device_name(key)
                    h.devices[device] = h.devices.get(device, 0) + size
            try:
                dtype = t.dtype
                label = dtypes.get(dtype)
                if label is None:
                    label = dtypes[dtype] = str(dtype).replace("torch.", "")
                h.dtypes[label] = h.dtypes.get(label, 0) + 1
                if len(h.shapes) < 5:
                    shape = [int(n) for n in t.shape]
                    if shape not in h.shapes:
                        h.shapes.append(shape)
            except Exception:  # symbolic or storage-less subclasses
                h.dtypes["unknown"] = h.dtypes.get("unknown", 0) + 1

    def graphs(self, entries: list[Entry], holders: dict[str, _Totals]) -> None:
        nodes, saved_attrs, bounds = self.nodes, self.saved_attrs, self.bounds
        budget = CHECK_EVERY  # tensors looked at and nodes walked until the next pause
        for t, name, _ in entries:
            budget -= 1
            if budget <= 0:
                budget = CHECK_EVERY
                if bounds.up(f"{len(nodes):,} autograd graph nodes were walked (the graph figures are partial)"):
                    return
            try:
                root = t.grad_fn
            except Exception:
                root = None
            h = holders.get(name)
            if root is None or h is None:  # no graph, or a tensor left uncounted
                continue
            h.graph_tensors += 1
            for node in graph_nodes(root, nodes):
                h.graph_nodes += 1
                budget -= 1
                if budget <= 0:
                    budget = CHECK_EVERY
                    if bounds.up(f"{len(nodes):,} autograd graph nodes were walked (the graph figures are partial)"):
                        return
                for saved in saved_tensors(node, saved_attrs, self.tensor_type):
                    for key, source in storages(saved):
                        self.graph_keys.add(key)
                        if key not in self.counted:
                            self.counted.add(key)
                            h.graph_saved += 1
                            h.graph_saved_bytes += nbytes(key, source)
