"""The tensor census: every live tensor reachable from Python, grouped by the object that holds it.

A leak scan from outside says *that* memory grows; a CUDA snapshot says where the kept memory was
*born*. The census answers the next question, *who keeps it*: it names, for every live tensor,
the path from a root to the container that holds it, in the words a Python engineer reads
(``service.HISTORY``, ``main.app.state.responses``, ``svc.build_handler.<locals>.handle → cell
'outputs'``), and sums per holder the bytes of the tensors' storages (each storage once: views
share it) and of what their autograd graphs keep alive. Taken twice, after a warm-up and after N
requests, the holders whose bytes grew are the leak, and the names say where it is kept.

How it walks (the costs are in docs/agent.md):

1. ``gc.get_objects()`` lists every object the collector tracks; the tensors among them are
   picked by type, in C. That list is then dropped: the walk works on references.
2. A breadth-first walk from the roots: every module's globals, then every thread's frames
   (outermost first, their locals). An object referenced exactly once (its reference count says
   so) can be reached by one edge only, so it needs no visited mark; only objects with several
   references go into the visited set, which keeps the set small and the walk at C-ish speed.
   Each object records its parent, so the first (shortest) path to every tensor is known.
3. Names are built only for the ancestors of tensors, memoised, from the parent chain. A path is
   rebased at the nearest object with a name of its own (a class, a function, a coroutine, a
   logger), so the same holder keeps the same name however it was reached. Variable parts (list
   indices, dict keys) collapse to ``[…]``, and the trailing ones are dropped: the holder is the
   container, not the slot.
4. Tensors the walk did not reach are either in cyclic garbage the collector has not freed yet
   or held only from native code. Their referrers are climbed (``gc.get_referrers``) and sorted
   the way the collector does it, without running it: an object whose reference count exceeds
   the references found from Python is held from outside; what such objects reach is "native",
   the rest is an unreachable cycle awaiting the collector.
5. Each storage is counted once in the whole census (keyed by data pointer and device), for the
   first holder that reaches it; then the autograd graphs of the tensors that carry one are
   walked (``grad_fn``, ``next_functions`` and the nodes' ``_saved_*`` attributes), each node
   once, and the saved tensors whose storage no Python-visible tensor holds are the graph's own
   bytes. A loss accumulated across requests is one tensor whose node count grows.

The walk runs Python code and hands the GIL to any thread waiting for it every 1,024 objects,
so the event loop keeps serving (at about half its pace on the bench) while it runs; the
longest stretch it holds the GIL without a break is the one ``gc.get_objects()`` call. A tensor
``gc.freeze()`` hid from that call is still found by the walk. ``max_seconds`` and
``max_depth`` bound it; a census that stopped early says why and keeps what it found. Importing
this module imports no torch: :func:`census` imports it when it runs.
"""

from __future__ import annotations

import _thread
import array
import collections
import contextvars
import gc
import itertools
import operator
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any, TypedDict

from leaklab._signals import saved_tensors

SCHEMA = "leaklab.census/1"

#: Variable parts of a path (list indices, dict keys) are written as this token.
ITEM = "[…]"

__all__ = [
    "ITEM",
    "SCHEMA",
    "CensusDoc",
    "CensusError",
    "GraphStats",
    "Growth",
    "Holder",
    "Phases",
    "Totals",
    "census",
    "diff",
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


class Growth(TypedDict):
    """A holder that grew between two censuses (:func:`diff`)."""

    holder: str
    kind: str
    bytes: int  #: bytes + graph saved bytes, after minus before
    tensors: int
    graph_nodes: int


class CensusError(RuntimeError):
    """The census cannot run in this process (torch is not installed)."""


def _import_torch() -> Any:
    # Typed as Any on purpose: the census must work across torch versions and mypy need not
    # analyse torch to check this package.
    try:
        import torch
    except ImportError as e:
        raise CensusError(
            f"the tensor census needs torch, and this Python ({sys.executable}) cannot import it: {e}"
        ) from e
    return torch


def census(*, max_seconds: float = 10.0, max_depth: int = 1000, top: int = 0) -> CensusDoc:
    """Take a tensor census of this process.

    ``max_seconds`` bounds the wall time of the walk and ``max_depth`` the length of a path from a
    root; a census that hits either says so in ``stopped_early`` and keeps what it found.
    ``top`` keeps only the largest holders in ``holders`` (0: all of them).
    """
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, not {max_seconds!r}")
    if max_depth < 1:
        raise ValueError(f"max_depth must be at least 1, not {max_depth!r}")
    if top < 0:
        raise ValueError(f"top must be 0 (all holders) or positive, not {top!r}")
    torch = _import_torch()
    enabled = gc.isenabled()
    # A collection started by our own allocations would free the cycles we are reporting and
    # hold the GIL for its whole pass: keep the collector off while we walk.
    gc.disable()
    try:
        return _Census(torch, max_seconds, max_depth).run(top)
    finally:
        if enabled:
            gc.enable()


def diff(before: CensusDoc, after: CensusDoc, min_bytes: int = 1) -> list[Growth]:
    """The holders whose bytes (tensors plus graph saved bytes) grew by at least ``min_bytes``.

    Holders are matched by name; one that is new in ``after`` grew from nothing. Largest first.
    """
    old = {h["holder"]: h for h in before["holders"]}
    grown: list[Growth] = []
    for h in after["holders"]:
        o = old.get(h["holder"])
        size = h["bytes"] + h["graph"]["saved_bytes"]
        was = o["bytes"] + o["graph"]["saved_bytes"] if o else 0
        if size - was >= min_bytes:
            grown.append(
                Growth(
                    holder=h["holder"],
                    kind=h["kind"],
                    bytes=size - was,
                    tensors=h["tensors"] - (o["tensors"] if o else 0),
                    graph_nodes=h["graph"]["nodes"] - (o["graph"]["nodes"] if o else 0),
                )
            )
    grown.sort(key=lambda g: (-g["bytes"], g["holder"]))
    return grown


# --- the walk -------------------------------------------------------------------------------------
#
# The walk touches arbitrary objects of the user's process, so it never runs their code: no
# isinstance() (it reads `__class__`, which a proxy may compute), no getattr() on instances, no
# overridable methods. Types are checked with issubclass(type(x), ...), attributes read through
# the C descriptors of `type` and `object`, dicts through dict's own methods.

_OWN_MODULES = frozenset({"leaklab.census", "leaklab.asgi"})
_SEQUENCES = (list, tuple, set, frozenset, collections.deque)
_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
# Objects (or graph nodes) between two pauses: the census lets other threads have the GIL
# (time.sleep(0)) and looks at the clock. Measured on the bench (a 1 ms asyncio ticker beside a
# census of 300k objects): every 8,192 objects the loop kept about 110 ticks/s of its 820;
# every 1,024 about 400, for 7 % more CPU in the census.
_CHECK_EVERY = 1024
_SLICE = 20_000  # objects per C call over all objects (a few ms), with a pause between two

_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_NAME = type.__dict__["__qualname__"]
_TYPE_MODULE = type.__dict__["__module__"]
_TYPE_SHORT = type.__dict__["__name__"]


def _is(obj: object, kinds: type | tuple[type, ...]) -> bool:
    return issubclass(type(obj), kinds)


def _class_name(cls: type) -> str:
    module = _TYPE_MODULE.__get__(cls)
    name = _TYPE_NAME.__get__(cls)
    return name if module in (None, "builtins") or not isinstance(module, str) else f"{module}.{name}"


def _short(obj: object) -> str:
    name: str = _TYPE_SHORT.__get__(type(obj))
    return name


def _type_name(obj: object) -> str:
    return _class_name(type(obj))


def _mro(obj: object) -> tuple[type, ...]:
    mro: tuple[type, ...] = _TYPE_MRO.__get__(type(obj))
    return mro


def _instance_dict(obj: object) -> dict[str, Any] | None:
    """``obj.__dict__`` through its C descriptor; None where there is none (or a custom one)."""
    for cls in _mro(obj):
        descriptor = _TYPE_DICT.__get__(cls).get("__dict__")
        if descriptor is not None:
            if type(descriptor) not in (types.GetSetDescriptorType, types.MemberDescriptorType):
                return None  # a Python-level __dict__ (a property): calling it would run user code
            try:
                namespace = descriptor.__get__(obj, cls)
            except Exception:
                return None
            return namespace if _is(namespace, dict) else None
    return None


def _slots(obj: object) -> Iterator[tuple[str, Any]]:
    """The filled ``__slots__`` of ``obj``, read through their member descriptors."""
    for cls in _mro(obj):
        namespace = _TYPE_DICT.__get__(cls)
        names = namespace.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            descriptor = namespace.get(name)
            if type(descriptor) is types.MemberDescriptorType:
                try:
                    yield name, descriptor.__get__(obj, cls)
                except AttributeError:  # an empty slot
                    continue


def _subclasses(cls: type) -> set[type]:
    found = {cls}
    stack = [cls]
    while stack:
        subclasses: list[type] = type.__subclasses__(stack.pop())
        for sub in subclasses:
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


def _single_reference_count() -> int:
    """What ``sys.getrefcount`` says, inside the walk's loop, of an object referenced once.

    Measured rather than assumed: the loop's own references (the referents list, the loop
    variable, the call's argument) differ between Python versions.
    """
    probe: list[list[int]] = [[]]
    for child in filter(gc.is_tracked, gc.get_referents(probe)):
        return sys.getrefcount(child)
    raise AssertionError("a list's referents must include its element")


def _own_frame(frame: types.FrameType) -> bool:
    return dict.get(frame.f_globals, "__name__") in _OWN_MODULES


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname is Python 3.11+


def _where(code: types.CodeType) -> str:
    # The line where the function starts, not where the frame is now: the name must not change
    # between two censuses while the frame moves.
    return f"{_qualname(code)} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def _locals(frame: types.FrameType) -> Any:
    # A dict on Python 3.12 and older (the frame's own, updated on each read); a write-through
    # proxy from 3.13, copied so that the walk has a container to start from.
    f_locals = frame.f_locals
    return f_locals if type(f_locals) is dict else dict(f_locals)


def _stored_names(code: types.CodeType) -> Iterator[str]:
    """The attribute names a function's code (and the code nested in it) stores."""
    yield from code.co_names
    for const in code.co_consts:
        if type(const) is types.CodeType:
            yield from _stored_names(const)


def _edges(members: list[Any], ids: set[int]) -> tuple[collections.Counter[int], dict[int, int]]:
    """References between members: how many each receives, and one referrer's index for each.

    A function of its own so that no loop variable of it is still bound (one more reference)
    when the caller reads the reference counts.
    """
    internal: collections.Counter[int] = collections.Counter()
    parents: dict[int, int] = {}  # the index, not the object: that would be one more reference
    for n, m in enumerate(members):
        for c in gc.get_referents(m):
            i = id(c)
            if i in ids:
                internal[i] += 1
                parents.setdefault(i, n)
    return internal, parents


class _Label:
    """The name of one object on a path, and how to read the names of its children."""

    __slots__ = ("aux", "kind", "role", "tokens")

    def __init__(self, tokens: tuple[str, ...], kind: str, role: str = "", aux: Any = None) -> None:
        self.tokens = tokens  # rendered pieces: an anchor first, then steps
        self.kind = kind
        # How this object's children are named: "" by the object's type; "ns" a namespace dict
        # (attributes: module, class or instance dict, Starlette State, nn.Module parameters);
        # "locals" a frame's locals; "closure" a function's closure tuple; "cell" a closure cell;
        # "handlers" a logger's handler list; "context" a contextvars.Context and its trie;
        # "thread-local" a threading.local's dicts, one per thread.
        self.role = role
        self.aux = aux  # "ns": the namespace's flavour; "closure": the function's free variables

    def child(self, token: str, kind: str | None = None, role: str = "", aux: Any = None) -> _Label:
        tokens = self.tokens
        if token.startswith(".") and tokens and tokens[-1] in (token, token + "…"):
            # A chain of one attribute (a linked list) collapses: `.next.next.next` is `.next…`.
            tokens = (*tokens[:-1], token + "…")
        elif token:
            tokens = (*tokens, token)
        return _Label(tokens, kind or self.kind, role, aux)

    def holder(self) -> str:
        end = len(self.tokens)
        while end > 1 and self.tokens[end - 1] == ITEM:
            end -= 1  # the holder is the container, not its slot
        return "".join(self.tokens[:end])


class _Totals:
    __slots__ = (
        "bytes",
        "devices",
        "dtypes",
        "graph_nodes",
        "graph_saved",
        "graph_saved_bytes",
        "graph_tensors",
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
        )


Entry = tuple[Any, str, str]  # (tensor, holder, kind)


class _Census:
    def __init__(self, torch: Any, max_seconds: float, max_depth: int) -> None:
        self.torch = torch
        self.tensor_type: type = torch.Tensor
        self.max_seconds, self.max_depth = max_seconds, max_depth
        self.started = time.perf_counter()
        self.cpu_started = time.thread_time()
        self.deadline = self.started + max_seconds
        self.stopped: str | None = None
        logging = sys.modules.get("logging")
        self.logger_type: type | None = getattr(logging, "Logger", None)
        self.module_type: type | None = getattr(getattr(torch, "nn", None), "Module", None)
        # id(mapping) -> (mapping, {id(value): key}); the mapping is kept so its id stays its own.
        self.keys: dict[int, tuple[Any, dict[int, Any]]] = {}
        self.counted: set[Any] = set()  # storage keys counted, by a holder or a graph
        self.graph_keys: set[Any] = set()  # storage keys some graph saves
        self.nodes: dict[int, Any] = {}  # graph nodes walked: id -> node, kept so ids stay unique
        self.saved_attrs: dict[type, tuple[str, ...]] = {}
        self.attr_names: dict[type, tuple[str, ...]] = {}
        self.dtypes: dict[Any, str] = {}  # torch.float32 -> "float32"

    def is_tensor(self, obj: object) -> bool:
        return issubclass(type(obj), self.tensor_type)

    def late(self) -> bool:
        return time.perf_counter() > self.deadline

    def pause(self) -> bool:
        """Hand the GIL to a thread waiting for it (the event loop), then say if time is up."""
        time.sleep(0)
        return self.late()

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why

    def run(self, top: int) -> CensusDoc:
        taken_at = time.time()
        clock = self.started
        spent: dict[str, float] = collections.defaultdict(float)

        def lap(phase: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            spent[phase] += now - clock
            clock = now

        # 1: the objects, and the tensors among them.
        objs = gc.get_objects()  # not the objects gc.freeze() moved aside: the walk finds those
        objects = len(objs)
        tensors: list[Any] = []
        # Every tensor type there is (subclasses register with their bases): a set lookup per
        # object, in C, never the object's own (possibly overridden) __class__.
        kinds = _subclasses(self.tensor_type)
        check = kinds.__contains__
        for start in range(0, objects, _SLICE):
            part = objs[start : start + _SLICE]
            tensors.extend(itertools.compress(part, map(check, map(type, part))))
            time.sleep(0)  # let a waiting thread have the GIL
        del objs, part
        lap("objects")

        # 2: the walk.
        order, parent, labels = self.roots()
        reached: dict[int, int] = {}  # id(tensor) -> position of its parent in `order`
        found: list[Any] = []
        self.walk(order, parent, kinds, reached, found)
        visited = len(order)
        lap("walk")

        # 3: the reached tensors' holders, from their parents' labels; their storages.
        entries: list[Entry] = []
        # Every tensor in a list or dict has its container's holder: computed once per container
        # position, and once per rendered container path (ten thousand records in one list).
        slots: dict[int, tuple[str, str]] = {}
        paths: dict[tuple[str, ...], tuple[str, str]] = {}
        for t in found:
            p = reached[id(t)]
            known = slots.get(p)
            if known is None:
                label = self.label(p, order, parent, labels)
                if not label.role and (_is(order[p], dict) or _is(order[p], _SEQUENCES)):
                    known = paths.get(label.tokens)
                    if known is None:
                        child = label.child(ITEM)
                        known = paths[label.tokens] = (child.holder(), child.kind)
                    slots[p] = known
                else:
                    label = self.child_label(order[p], label, t)
                    known = (label.holder(), label.kind)
            entries.append((t, *known))
        unreached = [t for t in tensors if id(t) not in reached]
        del tensors, reached, found, order, parent, labels, slots, paths
        self.keys.clear()
        holders: dict[str, _Totals] = {}
        self.count(entries, holders)
        lap("tensors")

        # 4: their graphs. Python-visible storages are all counted by now, so what a graph
        # saves beside them is the graph's own.
        self.graphs(entries, holders)
        lap("graphs")

        # 5: the tensors the walk did not reach. Those whose storage a graph just counted are
        # that graph's (PyTorch keeps a saved tensor's Python object alive from C++).
        unreached = [t for t in unreached if not all(k in self.graph_keys for k, _ in self.storages(t))]
        more = list(self.unreached(unreached))  # empties `unreached` as it takes the tensors over
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
            seconds=round(clock - self.started, 6),
            cpu_seconds=round(time.thread_time() - self.cpu_started, 6),
            complete=self.stopped is None,
            stopped_early=self.stopped,
            objects=objects,
            frozen=gc.get_freeze_count(),
            visited=visited,
            max_seconds=self.max_seconds,
            max_depth=self.max_depth,
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
        )

    # --- 2: the roots and the walk ---------------------------------------------------------------

    def roots(self) -> tuple[list[Any], array.array[int], dict[int, _Label]]:
        """Module globals first, then each thread's frames (main thread first, outermost first)."""
        order: list[Any] = []
        labels: dict[int, _Label] = {}
        seen: set[int] = set()

        def add(obj: Any, label: _Label) -> None:
            if id(obj) not in seen:
                seen.add(id(obj))
                labels[len(order)] = label
                order.append(obj)

        for key, module in list(sys.modules.items()):
            if _is(module, types.ModuleType):
                namespace = _instance_dict(module)
                name = namespace.get("__name__") if namespace is not None else None
                if namespace is not None:
                    add(namespace, _Label((name if isinstance(name, str) else key,), "module global", "ns"))
        names = {t.ident: t.name for t in threading.enumerate()}
        main = threading.main_thread().ident
        current = sys._current_frames()
        stack: list[types.FrameType] = []
        try:
            for ident in sorted(current, key=lambda i: (i != main, names.get(i, ""), i)):
                frame: types.FrameType | None = current[ident]
                while frame is not None:
                    stack.append(frame)
                    frame = frame.f_back
                thread = f"thread '{names[ident]}'" if ident in names else f"thread {ident}"
                for frame in reversed(stack):
                    if not _own_frame(frame):
                        add(_locals(frame), _Label((f"{thread} {_where(frame.f_code)}",), "frame", "locals"))
                stack.clear()
        finally:
            # `current` holds this very frame: a cycle that would outlive the census (and keep
            # everything it refers to) wherever the collector is off.
            current.clear()
            stack.clear()
            frame = None
        # Parent positions as machine integers: 8 bytes each, no int object per visited object.
        return order, array.array("q", [-1]) * len(order), labels

    def walk(
        self,
        order: list[Any],
        parent: array.array[int],
        kinds: set[type],
        reached: dict[int, int],
        found: list[Any],
    ) -> None:
        """Breadth-first from the roots, each object once; tensors are recorded, not entered."""
        get, tracked, refcount = gc.get_referents, gc.is_tracked, sys.getrefcount
        once = _single_reference_count()
        visited = set(map(id, order))
        append, append_parent, mark = order.append, parent.append, visited.add
        depth, level_end, check = 0, len(order), _CHECK_EVERY
        pos = -1
        # map() over the list sees what the loop appends: the queue is the list itself.
        for referents in map(get, order):
            pos += 1
            if pos == level_end:
                depth += 1
                level_end = len(order)
                if depth >= self.max_depth:
                    self.stop(f"max_depth: paths longer than {self.max_depth} steps were not followed")
                    return
            if pos >= check:
                check = pos + _CHECK_EVERY
                if self.pause():
                    self.stop(
                        f"max_seconds: the walk had gone through {pos:,} objects when {self.max_seconds:g} s "
                        "were up; the tensors it had not reached are listed as not reached"
                    )
                    return
            for child in filter(tracked, referents):
                if refcount(child) <= once:
                    # Referenced once: this edge is its only way in, no visited mark needed.
                    # (A tensor comes here only if gc.freeze() hid it from gc.get_objects(), so
                    # that the census's own list does not refer to it.)
                    if type(child) in kinds:
                        reached[id(child)] = pos
                        found.append(child)
                    else:
                        append(child)
                        append_parent(pos)
                else:
                    i = id(child)
                    if i not in visited:
                        mark(i)
                        if type(child) in kinds:
                            reached[i] = pos
                            found.append(child)
                        else:
                            append(child)
                            append_parent(pos)

    # --- 3: names ---------------------------------------------------------------------------------

    def label(self, pos: int, order: list[Any], parent: array.array[int], labels: dict[int, _Label]) -> _Label:
        chain: list[int] = []
        while pos not in labels:
            chain.append(pos)
            pos = parent[pos]
        label = labels[pos]
        for p in reversed(chain):
            label = self.child_label(order[pos], label, order[p])
            labels[p] = label
            pos = p
        return label

    def key_of(self, mapping: Any, child: object) -> Any:
        cached = self.keys.get(id(mapping))
        if cached is None:
            try:
                items = list(dict.items(mapping) if _is(mapping, dict) else mapping.items())
            except Exception:  # a mapping that cannot be listed: name the slot, not the key
                items = []
            cached = self.keys[id(mapping)] = (mapping, {id(v): k for k, v in items})
        return cached[1].get(id(child), ITEM)

    def flavour(self, obj: object) -> str | None:
        """Instances whose attribute dicts are read as attributes under another name."""
        if self.module_type is not None and _is(obj, self.module_type):
            return "nn"
        tp = type(obj)
        if _TYPE_SHORT.__get__(tp) == "State" and str(_TYPE_MODULE.__get__(tp)).startswith("starlette"):
            return "state"
        if self.logger_type is not None and _is(obj, self.logger_type):
            return "logger"
        return None

    def attribute(self, label: _Label, flavour: str | None, name: str, child: object) -> _Label:
        if flavour == "nn" and name in ("_parameters", "_buffers", "_modules") and _is(child, dict):
            return label.child("", role="ns", aux="nn")  # model.0.weight, as state_dict names it
        if flavour == "state" and name == "_state" and _is(child, dict):
            return label.child("", role="ns")  # app.state.responses
        if flavour == "logger" and name == "handlers":
            return label.child("", kind="log records", role="handlers")
        kind = "log records" if _short(child) == "LogRecord" else None
        return label.child("." + name, kind=kind)

    def child_label(self, parent: Any, label: _Label, child: Any) -> _Label:
        """The label of ``child``, reached from ``parent`` (labelled ``label``)."""
        role = label.role
        if role == "ns":
            key = self.key_of(parent, child)
            return self.attribute(label, label.aux, key, child) if isinstance(key, str) else label.child(ITEM)
        if role == "locals":
            key = self.key_of(parent, child)
            return label.child(f" local '{key}'" if isinstance(key, str) else " local")
        if role == "closure":
            names: tuple[str, ...] = label.aux
            for i, cell in enumerate(tuple.__iter__(parent)):
                if cell is child:
                    return label.child(f" → cell '{names[i] if i < len(names) else '?'}'", role="cell")
            return label.child(" → cell", role="cell")
        if role == "cell":
            return label.child("")
        if role == "handlers":
            return label.child(" " + _short(child), kind="log records")
        if role == "context":
            # A context's values sit in a trie whose shape depends on its size: name the variable.
            if _short(child).startswith("hamt"):
                return label.child("", role="context", aux=label.aux)
            for var, value in contextvars.Context.items(label.aux):
                if value is child:
                    return label.child(f" → ContextVar '{var.name}'")
            return label.child(" → ContextVar")
        if type(parent) is contextvars.Context:
            return label.child("", role="context", aux=parent)
        if role == "thread-local" and _is(child, dict):
            return label.child(" (thread-local)", role="ns")  # the attributes one thread set
        if _is(parent, _thread._local) and _is(child, dict):
            return label.child("", role="thread-local")  # {thread's weak key: its attribute dict}
        if _is(parent, dict) or _is(parent, _SEQUENCES):
            return label.child(ITEM)
        if _is(parent, type):
            return self.class_child(parent, label, child)
        if _is(parent, types.ModuleType):
            namespace = _instance_dict(parent)
            if namespace is not None and child is namespace:
                return _Label((str(namespace.get("__name__")),), "module global", "ns")
            return label.child(" → " + _short(child))
        if type(parent) is types.FunctionType:
            return self.function_child(parent, child)
        if type(parent) is types.MethodType:
            return label.child(".__self__" if child is parent.__self__ else ".__func__")
        if type(parent) is types.CellType:
            return label.child(" → cell", role="cell")
        if type(parent) in _GENERATORS:
            return self.generator_child(parent, child)
        if type(parent) is types.FrameType:
            if child is parent.f_back:
                return label.child(".f_back")
            frame = label.child(f" → frame {_where(parent.f_code)}", role="locals")
            return self.child_label(_locals(parent), frame, child)
        if type(parent) is types.TracebackType:
            return label.child(".tb_frame" if child is parent.tb_frame else ".tb_next")
        return self.instance_child(parent, label, child)

    def class_child(self, cls: type, label: _Label, child: Any) -> _Label:
        # The class's namespace dict is the one referent of its mappingproxy.
        namespace = gc.get_referents(_TYPE_DICT.__get__(cls))
        if namespace and child is namespace[0]:
            return _Label((_class_name(cls),), "class attribute", "ns")
        if child is _TYPE_MRO.__get__(cls):
            return label.child(".__mro__")
        return label.child(" → " + _short(child))

    def function_child(self, fn: types.FunctionType, child: Any) -> _Label:
        anchor = _Label((f"{fn.__module__}.{fn.__qualname__}",), "closure")
        if child is fn.__closure__:
            return anchor.child("", role="closure", aux=fn.__code__.co_freevars)
        if child is fn.__defaults__:
            return anchor.child(" → defaults")
        if child is fn.__kwdefaults__:
            return anchor.child(" → defaults", role="ns")
        if child is _instance_dict(fn):
            return anchor.child("", role="ns")
        return anchor.child(" → " + _short(child))

    def generator_child(self, gen: Any, child: Any) -> _Label:
        # A suspended coroutine is named by its function, however the event loop holds it.
        code = getattr(gen, "gi_code", None) or getattr(gen, "cr_code", None) or gen.ag_code
        frame = getattr(gen, "gi_frame", None) or getattr(gen, "cr_frame", None) or getattr(gen, "ag_frame", None)
        anchor = _Label((f"{_short(gen)} {_where(code)}",), "frame", "locals")
        return self.child_label(_locals(frame), anchor, child) if frame is not None else anchor.child(" local")

    def instance_child(self, obj: Any, label: _Label, child: Any) -> _Label:
        flavour = self.flavour(obj)
        if flavour == "logger":
            namespace = _instance_dict(obj)
            name = namespace.get("name") if namespace is not None else "?"
            label = _Label((f"logging '{name}'",), "log records")
        for name, value in _slots(obj):
            if value is child:
                return self.attribute(label, flavour, name, child)
        # Attributes the class's own methods set (`self.acc = ...`), read one by one: asking
        # for __dict__ would make Python 3.11+ build one for an object that keeps its values
        # inline, changing the heap the census describes.
        for name in self.attribute_names(type(obj)):
            try:
                value = object.__getattribute__(obj, name)
            except Exception:
                continue
            if value is child:
                return self.attribute(label, flavour, name, child)
        namespace = _instance_dict(obj)
        if namespace is not None:
            if child is namespace:
                return label.child("", role="ns", aux=flavour)
            key = self.key_of(namespace, child)
            if isinstance(key, str):
                return self.attribute(label, flavour, key, child)
        if _is(obj, BaseException):
            for name in ("args", "__traceback__", "__context__", "__cause__"):
                if BaseException.__dict__[name].__get__(obj) is child:
                    return label.child("." + name)
        return label.child(" → " + _short(child))

    def attribute_names(self, tp: type) -> tuple[str, ...]:
        """Names the methods of ``tp`` store on ``self`` that no class in its MRO defines.

        A name a class defines could be a descriptor (a property) whose reading runs code.
        """
        names = self.attr_names.get(tp)
        if names is None:
            mro = _TYPE_MRO.__get__(tp)
            defined: set[str] = set()
            candidates: set[str] = set()
            for cls in mro:
                namespace = _TYPE_DICT.__get__(cls)
                defined.update(namespace)
                for value in namespace.values():
                    if type(value) in (staticmethod, classmethod):
                        value = value.__func__
                    if type(value) is types.FunctionType:
                        candidates.update(_stored_names(value.__code__))
            names = tuple(sorted(candidates - defined))
            # A class with many (nn.Module and its kin) has its __dict__ built already, as a
            # rule (its own code reads it): one look at the dict is cheaper than many misses.
            names = self.attr_names[tp] = names if len(names) <= 64 else ()
        return names

    # --- 4: what the walk did not reach ---------------------------------------------------------

    def unreached(self, tensors: list[Any]) -> Iterator[Entry]:
        if not tensors:
            return
        if self.stopped is not None:
            # The walk stopped early: these may well be reachable, so say only that.
            for t in tensors:
                yield t, "(not reached: the census stopped early)", "not reached"
            return
        members, ids = self.climb(tensors)
        tensors.clear()  # from here on, `members` is the census's only reference to them
        parents, external = self.refcounts(members, ids)
        from_native = self.native_parents(members, ids, external)
        labels: dict[int, _Label] = {}
        for obj in members:
            if not self.is_tensor(obj):
                continue
            i = id(obj)
            if i in from_native:
                via = from_native[i]
                if via is None:
                    yield obj, "held from native code (no Python referrer)", "native"
                else:
                    label = self.child_label(via, self.native_label(via, from_native, labels), obj)
                    yield obj, "held from native code: " + label.holder(), "native"
            elif i in parents:
                via = members[parents[i]]
                label = _Label((_type_name(via),), "unreachable cycle")
                owner = members[parents[id(via)]] if _is(via, dict) and id(via) in parents else None
                if owner is not None and _instance_dict(owner) is via:
                    # An attribute dict is named by its object: `Node.t`, whether the census
                    # (or anything else) has asked for the object's __dict__ before or not.
                    label = _Label((_type_name(owner),), "unreachable cycle", "ns", self.flavour(owner))
                label = self.child_label(via, label, obj)
                yield obj, "unreachable cycle (awaiting gc): " + label.holder(), "unreachable cycle"
            # else: nothing refers to it but the census: it was freed while the census ran

    def climb(self, tensors: list[Any]) -> tuple[list[Any], set[int]]:
        """The tensors and everything that refers to them, transitively (the walk reached none)."""
        members: list[Any] = list(tensors)
        ids = set(map(id, members))
        # The census's own lists refer to the objects too: they are left out by id, kept alive
        # meanwhile (so no other object takes their id) and emptied at the end (so none of them
        # outlives the census in a cycle).
        scratch: list[list[Any]] = [tensors, members]
        own = {id(tensors), id(members), id(scratch)}
        level = list(tensors)
        depth = 0
        while level:
            scratch.append(level)
            own.add(id(level))
            depth += 1
            if depth > self.max_depth or self.late():
                self.stop("the referrers of unreached tensors were not all climbed (max_depth or max_seconds)")
                break
            found = self.referrers(level, own)
            scratch.append(found)
            own.add(id(found))
            level = []
            for r in found:
                i = id(r)
                if i in ids or i in own or (type(r) is types.FrameType and _own_frame(r)):
                    continue
                ids.add(i)
                members.append(r)
                level.append(r)
        for lst in scratch[2:]:
            lst.clear()
        return members, ids

    def referrers(self, targets: list[Any], own: set[int]) -> list[Any]:
        # gc.get_referrers compares every reference with every target: fast for a few targets,
        # quadratic for many; then one C-level pass over all objects with a set is cheaper.
        if len(targets) <= 32:
            return gc.get_referrers(*targets)
        wanted = set(map(id, targets))
        objs = gc.get_objects()
        found: list[Any] = []
        for start in range(0, len(objs), _SLICE):
            # In slices: compress() runs in C until it finds a referrer, holding the GIL all along.
            time.sleep(0)
            part = objs[start : start + _SLICE]
            refers = map(wanted.isdisjoint, map(map, itertools.repeat(id), map(gc.get_referents, part)))
            found.extend(o for o in itertools.compress(part, map(operator.not_, refers)) if id(o) not in own)
        del objs, part
        return found

    def refcounts(self, members: list[Any], ids: set[int]) -> tuple[dict[int, int], set[int]]:
        """Which members are referenced from outside the members (native code), as gc decides."""
        internal, parents = _edges(members, ids)
        members.append([])  # a probe referenced by `members` only: the census's own share
        counts = list(map(sys.getrefcount, members))
        members.pop()
        ours = counts.pop()
        external = {id(m) for m, n in zip(members, counts, strict=True) if n - ours - internal[id(m)] > 0}
        return parents, external

    def native_parents(self, members: list[Any], ids: set[int], external: set[int]) -> dict[int, Any]:
        """For each member reachable from an externally held member: its parent (None for a root)."""
        via: dict[int, Any] = dict.fromkeys(external)
        queue = [m for m in members if id(m) in external]
        for m in queue:
            if self.is_tensor(m):
                continue
            for c in gc.get_referents(m):
                i = id(c)
                if i in ids and i not in via:
                    via[i] = m
                    queue.append(c)
        return via

    def native_label(self, obj: Any, via: dict[int, Any], labels: dict[int, _Label]) -> _Label:
        chain: list[Any] = []
        while id(obj) not in labels and via.get(id(obj)) is not None:
            chain.append(obj)
            obj = via[id(obj)]
        label = labels.get(id(obj)) or _Label((_type_name(obj),), "native")
        labels[id(obj)] = label
        for c in reversed(chain):
            label = self.child_label(obj, label, c)
            labels[id(c)] = label
            obj = c
        return label

    # --- 5: storages and graphs -------------------------------------------------------------------

    def storages(self, t: Any) -> list[tuple[Any, Any]]:
        """(key, source) of the storages behind a tensor: one, or indices and values when sparse.

        The key is the storage's base address and device, read from the tensor itself (cheap);
        ``source`` tells the storage's size when first met (:meth:`nbytes`).
        """
        try:
            return [((t.data_ptr() - t.storage_offset() * t.element_size(), t.device), t)]
        except Exception:
            pass
        try:
            if t.is_sparse:
                return self.storages(t._indices()) + self.storages(t._values())
            s = t.untyped_storage()  # nested tensors and others without a plain data pointer
            return [((s.data_ptr(), s.device), t)]
        except Exception:  # subclasses without a storage (wrappers, fakes): count the object
            return [(("object", id(t)), None)]

    @staticmethod
    def nbytes(key: Any, source: Any) -> int:
        if source is None or key[1].type == "meta":
            return 0
        try:
            return int(source.untyped_storage().nbytes())
        except Exception:
            return 0

    def count(self, entries: list[Entry], holders: dict[str, _Totals]) -> None:
        counted, dtypes = self.counted, self.dtypes
        for t, name, kind in entries:
            h = holders.get(name)
            if h is None:
                h = holders[name] = _Totals(name, kind)
            h.tensors += 1
            for key, source in self.storages(t):
                if key not in counted:
                    counted.add(key)
                    size = self.nbytes(key, source)
                    h.bytes += size
                    device = "unknown" if key[0] == "object" else str(key[1])
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
        nodes, saved_attrs = self.nodes, self.saved_attrs
        budget = _CHECK_EVERY
        for t, name, _ in entries:
            try:
                root = t.grad_fn
            except Exception:
                root = None
            if root is None:
                continue
            h = holders[name]
            h.graph_tensors += 1
            stack = [root]
            while stack:
                node = stack.pop()
                if id(node) in nodes:
                    continue
                nodes[id(node)] = node
                h.graph_nodes += 1
                budget -= 1
                if budget == 0:
                    budget = _CHECK_EVERY
                    if self.pause():
                        self.stop(
                            f"max_seconds: {len(nodes):,} autograd graph nodes walked when {self.max_seconds:g} s "
                            "were up; the graph figures are partial"
                        )
                        return
                for saved in saved_tensors(node, saved_attrs, self.tensor_type):
                    for key, source in self.storages(saved):
                        self.graph_keys.add(key)
                        if key not in self.counted:
                            self.counted.add(key)
                            h.graph_saved += 1
                            h.graph_saved_bytes += self.nbytes(key, source)
                try:
                    edges = node.next_functions
                except Exception:
                    edges = ()
                stack.extend(n for n, _ in edges if n is not None)
