"""The walk: every object reachable from Python's roots, breadth first, each once.

1. ``gc.get_objects()`` lists every object the collector tracks; the tensors among them are
   picked by type, in C (:func:`listed_tensors`). That list is then dropped (in slices): the
   walk works on references.
2. A breadth-first walk from the roots (:func:`roots`): every module's globals, then every
   thread's frames (outermost first, their locals). An object referenced exactly once (its
   reference count says so) can be reached by one edge only, so it needs no visited mark; only
   objects with several references go into the visited set, which keeps the set small and the
   walk at C-ish speed. Each object records its parent, so the first (shortest) path to every
   tensor is known (:mod:`leaklab._naming` names it). Memo caches (``functools.lru_cache``)
   are entered after everything else: a framework's cache of facts about each endpoint would
   otherwise name the application's closures by the cache rather than by where the
   application registered them.
"""

from __future__ import annotations

import array
import collections
import functools
import gc
import itertools
import sys
import threading
import types
from collections.abc import Iterable
from typing import Any

from leaklab._bounds import CHECK_EVERY, SLICE, Bounds
from leaklab._naming import Label
from leaklab._reflect import frame_locals, instance_dict, is_kind, own_frame, single_reference_count, where

__all__ = ["CACHE", "listed_tensors", "roots", "walk"]

#: The type of ``functools.lru_cache`` wrappers (the C one).
CACHE: type = type(functools.lru_cache(maxsize=1)(len))


def listed_tensors(kinds: set[type], bounds: Bounds) -> tuple[list[Any], int, collections.Counter[type]]:
    """The tensors among the objects the collector lists, how many objects it listed, and how
    many of each type: Python objects that hold no tensor (a registry's entries, per-user
    state, handlers) grow there, where no tensor census looks.

    ``kinds`` is every tensor type there is (subclasses register with their bases): a set
    lookup per object, in C, never the object's own (possibly overridden) ``__class__``; the
    types are counted in C too (``Counter.update``). ``gc.get_objects()`` is one C call (7 to
    23 ms at a million objects here): the longest stretch the census holds the GIL. The list is
    read and dropped in slices.
    """
    objs = gc.get_objects()  # not the objects gc.freeze() moved aside: the walk finds those
    objects = len(objs)
    tensors: list[Any] = []
    counts: collections.Counter[type] = collections.Counter()
    check = kinds.__contains__
    for start in range(0, objects, SLICE):
        part = objs[start : start + SLICE]
        classes = list(map(type, part))
        tensors.extend(itertools.compress(part, map(check, classes)))
        counts.update(classes)
        del part, classes
        if bounds.up(f"{start + SLICE:,} of {objects:,} objects were searched for tensors"):
            break
    bounds.release(objs)
    return tensors, objects, counts


def roots() -> tuple[list[Any], array.array[int], dict[int, Label]]:
    """Module globals first, then each thread's frames (main thread first, outermost first)."""
    order: list[Any] = []
    labels: dict[int, Label] = {}
    seen: set[int] = set()

    def add(obj: Any, label: Label) -> None:
        if id(obj) not in seen:
            seen.add(id(obj))
            labels[len(order)] = label
            order.append(obj)

    for key, module in list(sys.modules.items()):
        if is_kind(module, types.ModuleType):
            namespace = instance_dict(module)
            name = namespace.get("__name__") if namespace is not None else None
            if namespace is not None:
                add(namespace, Label((name if isinstance(name, str) else key,), "module global", "ns"))
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
                if not own_frame(frame):
                    add(frame_locals(frame), Label((f"{thread} {where(frame.f_code)}",), "frame", "locals"))
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
    order: list[Any],
    parent: array.array[int],
    kinds: set[type],
    reached: dict[int, int],
    found: list[Any],
    bounds: Bounds,
) -> None:
    """Breadth-first from the roots, each object once; tensors are recorded, not entered."""
    get, tracked, refcount = gc.get_referents, gc.is_tracked, sys.getrefcount
    # Memo caches (functools.lru_cache) are entered last: they hold what the code was called
    # with (a framework caching facts about each endpoint), not where the application keeps
    # it, and their paths are often as short as the application's own.
    later: list[Any] = []
    later_parent: array.array[int] = array.array("q")
    once = single_reference_count()
    visited = set(map(id, order))
    append, append_parent, mark = order.append, parent.append, visited.add

    def enter(referents: Iterable[Any], pos: int) -> None:
        # A function of its own, so that a child's references are what single_reference_count
        # measured: the referents list, the loop variable and getrefcount's argument.
        for child in filter(tracked, referents):
            if refcount(child) <= once:
                # Referenced once: this edge is its only way in, no visited mark needed.
                # (A tensor comes here only if gc.freeze() hid it from gc.get_objects(), so
                # that the census's own list does not refer to it.)
                if type(child) in kinds:
                    reached[id(child)] = pos
                    found.append(child)
                elif type(child) is CACHE:
                    later.append(child)
                    later_parent.append(pos)
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
                    elif type(child) is CACHE:
                        later.append(child)
                        later_parent.append(pos)
                    else:
                        append(child)
                        append_parent(pos)

    def late() -> bool:
        bounds.pause()
        if bounds.walk_late():
            bounds.stop(
                f"max_seconds: the walk had reached {len(order):,} objects when its share of the "
                f"{bounds.max_seconds:g} s was up; the tensors it had not reached are listed as not reached"
            )
            return True
        return False

    depth, level_end, check = 0, len(order), CHECK_EVERY
    pos = -1
    while True:
        # map() over the list sees what the loop appends: the queue is the list itself.
        for referents in map(get, itertools.islice(order, pos + 1, None)):
            pos += 1
            if pos == level_end:
                depth += 1
                level_end = len(order)
                if depth >= bounds.max_depth:
                    bounds.stop(f"max_depth: paths longer than {bounds.max_depth} steps were not followed")
                    break
            if pos >= check:
                check = pos + CHECK_EVERY
                if late():
                    break
            if len(referents) <= CHECK_EVERY:
                enter(referents, pos)
                continue
            # A big container (a list of a million): its children in slices, the clock read between.
            children = iter(referents)
            for _ in range(0, len(referents), CHECK_EVERY):
                enter(itertools.islice(children, CHECK_EVERY), pos)
                if late():
                    break
            del children
            bounds.release(referents)  # its references given back in slices too
            if bounds.stopped is not None:
                break
        if bounds.stopped is not None or not later:
            return
        # The memo caches met, entered after everything else (their depth: one more level).
        order.extend(later)
        parent.extend(later_parent)
        later.clear()
        del later_parent[:]
