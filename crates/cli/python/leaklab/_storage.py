"""Storage keys and autograd graphs: what the census and the plugin's tally count, and how.

A tensor's bytes live in its storage, which views share: each storage is counted once, by a
key read from the tensor itself (its base address and device). An autograd graph keeps the
tensors its nodes saved for backward: its nodes are walked each once, and the saved tensors
whose storage no counted tensor holds are the graph's own bytes. The full census
(:mod:`leaklab.census`) and the tally after each call of ``leak_check``
(:mod:`leaklab._signals`) both count through these functions, so the two agree on every byte.

Nothing here imports torch: the tensors come from the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["StorageKey", "device_name", "graph_nodes", "nbytes", "saved_tensors", "storages"]

#: ``(base address, torch.device)``, or ``("object", id)`` for a tensor without a storage.
StorageKey = tuple[Any, Any]


def storages(t: Any) -> list[tuple[StorageKey, Any]]:
    """(key, source) of the storages behind a tensor: one, or indices and values when sparse.

    The key is the storage's base address and device, read from the tensor itself (cheap);
    ``source`` tells the storage's size when first met (:func:`nbytes`).
    """
    try:
        return [((t.data_ptr() - t.storage_offset() * t.element_size(), t.device), t)]
    except Exception:
        pass
    try:
        if t.is_sparse:
            return storages(t._indices()) + storages(t._values())
        s = t.untyped_storage()  # nested tensors and others without a plain data pointer
        return [((s.data_ptr(), s.device), t)]
    except Exception:  # subclasses without a storage (wrappers, fakes): count the object
        return [(("object", id(t)), None)]


def nbytes(key: StorageKey, source: Any) -> int:
    """The bytes of the storage ``key`` names (0 on the meta device and without a storage)."""
    if source is None or key[1].type == "meta":
        return 0
    try:
        return int(source.untyped_storage().nbytes())
    except Exception:
        return 0


def device_name(key: StorageKey) -> str:
    """``cpu``, ``cuda:0``; ``unknown`` for a tensor without a storage."""
    return "unknown" if key[0] == "object" else str(key[1])


def graph_nodes(root: Any, seen: dict[int, Any]) -> Iterator[Any]:
    """The autograd nodes reachable from ``root`` that ``seen`` lacks, each once (added to it).

    ``seen`` maps id to node and keeps the nodes alive, so that no two of them share an id.
    """
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        yield node
        try:
            edges = node.next_functions
        except Exception:
            edges = ()
        stack.extend(n for n, _ in edges if n is not None)


def saved_tensors(node: Any, cache: dict[type, tuple[str, ...]], tensor_type: type) -> list[Any]:
    """The tensors a graph node saved for backward (none once backward has freed them)."""
    tp = type(node)
    names = cache.get(tp)
    if names is None:
        names = tuple(a for a in dir(tp) if a.startswith("_saved_"))
        if hasattr(tp, "saved_tensors"):  # a custom autograd.Function's node
            names += ("saved_tensors",)
        cache[tp] = names
    found: list[Any] = []
    for name in names:
        try:
            value = getattr(node, name)
        except Exception:  # RuntimeError once backward freed them: nothing left to count
            continue
        if issubclass(type(value), tensor_type):
            found.append(value)
        elif type(value) in (tuple, list):
            found.extend(v for v in value if issubclass(type(v), tensor_type))
    return found
