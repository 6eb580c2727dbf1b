"""The signals ``leak_check`` reads after each call: cheap, and exact where they can be.

- :class:`Tallier`: every tensor the process holds from Python, each storage counted once, plus
  what their autograd graphs save. While the collector is frozen (``gc.freeze()`` after the
  warm-up) ``gc.get_objects()`` lists only the objects made since, so a tally costs what the
  judged calls made plus a weak reference per older tensor, not a walk of the whole process.
  It is the full census's arithmetic without its names, through the same storage keys and
  graph walk (:mod:`leaklab._storage`); the names come from the full censuses
  (:func:`leaklab.census.census`), after the warm-up and after the last call.
- :func:`cuda_allocated`: ``torch.cuda.memory_allocated()`` of each device, where this process
  has initialised CUDA (never initialising it).
- :func:`anonymous_bytes`: ``RssAnon`` of ``/proc/self/status``: every byte the process's heap
  holds (Python objects, malloc, C++ graph nodes), and the noise of pages and arenas with it.

Nothing here imports torch: the functions take the module the caller found already imported.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import itertools
import sys
import weakref
from typing import Any, NamedTuple

from leaklab._storage import graph_nodes, nbytes, saved_tensors, storages

__all__ = [
    "Tallier",
    "Tally",
    "anonymous_bytes",
    "cuda_allocated",
    "cuda_devices",
    "listed_tensors",
    "loaded_torch",
    "return_free_heap",
]


def loaded_torch() -> Any | None:
    """The ``torch`` module if this process has imported it, else None; never imports it.

    A function under test that uses no torch has no tensors to count, and importing torch for
    it would cost seconds and hundreds of megabytes of the very memory being watched.
    """
    torch = sys.modules.get("torch")
    return torch if torch is not None and hasattr(torch, "Tensor") else None


def anonymous_bytes() -> int | None:
    """``RssAnon`` of this process in bytes (about 16 µs), or None where /proc has no such line."""
    try:
        with open("/proc/self/status", "rb") as f:
            status = f.read()
    except OSError:
        return None
    at = status.find(b"RssAnon:")
    if at < 0:
        return None
    return int(status[at + 8 : status.index(b"kB", at)]) * 1024


def return_free_heap() -> bool:
    """Hands the free pages of malloc's heap back to the system (glibc's ``malloc_trim(0)``).

    Called before each sample of anonymous memory: what the warm-up and the first census
    allocated and freed would otherwise sit in the heap as free chunks that a leak fills without
    the anonymous memory moving (measured: a 4 KiB-a-call leak went unseen for 300 calls), and a
    clean function's freed scratch would count where it last landed. 0.02 ms a call in a torch
    process; False where the C library has no ``malloc_trim`` (musl, macOS).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Any | None:
    """glibc's ``malloc_trim``, looked up once (a ``dlopen`` each call cost 11 µs of 25)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def cuda_devices(torch: Any) -> list[int]:
    """The CUDA devices to watch: all of them once CUDA is initialised in this process, else none.

    ``torch.cuda.is_initialized()`` is False until some code has used CUDA, and asking for the
    device count or statistics before that would initialise it (and take a GPU context's memory).
    """
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():  # asks nothing of the driver
        return []
    return list(range(cuda.device_count()))


def cuda_allocated(torch: Any, device: int) -> int:
    """Bytes held by live tensors on ``device``, as the caching allocator counts them (exact)."""
    return int(torch.cuda.memory_allocated(device))


class Tally(NamedTuple):
    """The Python-visible tensors now: objects, their storages (each once), their graphs."""

    tensors: int  #: tensor objects, leaving out those that only stand for what a graph saved
    bytes: int  #: their storages, each counted once (views share theirs)
    graph_nodes: int  #: autograd nodes reachable from them, each once
    graph_saved_bytes: int  #: storages saved by those nodes and held by no tensor counted above

    @property
    def held(self) -> int:
        """Everything the tally keeps alive: storages plus graph-saved storages."""
        return self.bytes + self.graph_saved_bytes


_SLICE = 100_000  # objects per C-level filter call


def listed_tensors(torch: Any) -> list[Any]:
    """The tensors among the objects the garbage collector lists (the frozen ones are not listed)."""
    check = torch.Tensor.__subclasscheck__
    objects = gc.get_objects()
    tensors: list[Any] = []
    for start in range(0, len(objects), _SLICE):
        part = objects[start : start + _SLICE]
        # type() and __subclasscheck__ run no user code (isinstance would read __class__).
        tensors.extend(itertools.compress(part, map(check, map(type, part))))
    return tensors


class Tallier:
    """Tallies the tensors alive now, cheaply while the collector is frozen.

    :meth:`remember` is called just before ``gc.freeze()``: it keeps a weak reference to every
    tensor the collector lists, since frozen objects are listed no more. A tally then adds the
    tensors made since (what ``gc.get_objects()`` lists while frozen) to those remembered ones
    still alive: all of them, so that a tensor from before that grows in place (a loss summed
    with ``+=``, whose graph grows; a buffer ``resize_``d) counts too, for the price of a weak
    reference per tensor that existed then.

    Graphs are walked from the new tensors and from the remembered ones changed in place since
    (their version counter moved): a graph never grows but through one of those, and walking
    the unchanged ones again (a loss kept with its graph by an earlier test) would cost each
    tally their whole size for nothing that can grow.
    """

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.tensor_type: type = torch.Tensor
        self.remembered: list[tuple[weakref.ref[Any], int]] = []
        self.unremembered = 0  # tensors that take no weak reference (a few exotic subclasses)

    def remember(self) -> None:
        self.remembered.clear()
        for t in listed_tensors(self.torch):
            try:
                self.remembered.append((weakref.ref(t), _version(t)))
            except TypeError:
                self.unremembered += 1

    def tally(self) -> Tally:
        tensors = listed_tensors(self.torch)
        roots = list(tensors)
        listed = set(map(id, tensors))  # a frozen tensor is not listed, unless someone unfroze it
        for ref, version in self.remembered:
            t = ref()
            if t is not None and id(t) not in listed:
                tensors.append(t)
                if _version(t) != version:
                    roots.append(t)
        counted: set[Any] = set()
        total = 0
        for t in tensors:
            for key, source in storages(t):
                if key not in counted:
                    counted.add(key)
                    total += nbytes(key, source)
        nodes, saved_ids, saved_bytes = _graphs(roots, counted, self.tensor_type)
        # A saved tensor unpacked by an earlier tally keeps its Python object as long as the
        # graph keeps it (PyTorch preserves it), and is listed from then on: it is the graph's,
        # already in graph_nodes and bytes, not a tensor the calls keep.
        objects = sum(1 for t in tensors if id(t) not in saved_ids)
        return Tally(objects, total, nodes, saved_bytes)


def _version(t: Any) -> int:
    """The tensor's version counter (bumped by every in-place change); -1 where it has none."""
    try:
        return int(t._version)
    except Exception:
        return -1


def _graphs(tensors: list[Any], counted: set[Any], tensor_type: type) -> tuple[int, set[int], int]:
    """Graph nodes reachable from ``tensors``, the ids of the saved tensors among ``tensors``, and
    the bytes the nodes alone save (storages not in ``counted``, which this adds to)."""
    seen: dict[int, Any] = {}  # id -> node, kept so that no two nodes share an id meanwhile
    names: dict[type, tuple[str, ...]] = {}
    saved: dict[int, Any] = {}  # id -> saved tensor, kept for the same reason
    saved_bytes = 0
    for t in tensors:
        try:
            root = t.grad_fn
        except Exception:
            root = None
        if root is None:
            continue
        for node in graph_nodes(root, seen):
            for value in saved_tensors(node, names, tensor_type):
                saved[id(value)] = value
                for key, source in storages(value):
                    if key not in counted:
                        counted.add(key)
                        saved_bytes += nbytes(key, source)
    count, ids = len(seen), set(saved)
    seen.clear()
    saved.clear()
    return count, ids, saved_bytes
