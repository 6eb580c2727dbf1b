"""The tensors the walk did not reach: cyclic garbage awaiting the collector, or held from native code.

Their referrers are climbed (``gc.get_referrers``) and sorted the way the collector does it,
without running it: an object whose reference count exceeds the references found from Python
is held from outside; what such objects reach is "native", the rest is an unreachable cycle
awaiting the collector.
"""

from __future__ import annotations

import collections
import gc
import itertools
import operator
import sys
import types
from collections.abc import Iterator
from typing import Any

from leaklab._bounds import CHECK_EVERY, SLICE, Bounds
from leaklab._naming import Entry, Label, Namer
from leaklab._reflect import instance_dict, is_kind, own_frame, type_name
from leaklab._storage import storages

__all__ = ["NOT_REACHED", "ONE_CALL", "Unreached"]

#: The largest heap whose referrers of a few objects are found in one C call
#: (``gc.get_referrers``: 12 to 19 ms at 200,000 objects here); beyond it, in slices.
ONE_CALL = 200_000
#: The holder of the tensors not reached by a census that stopped early.
NOT_REACHED = "(not reached: the census stopped early)"


class Unreached:
    """Sorts the tensors the walk did not reach into native-held and unreachable cycles."""

    def __init__(self, namer: Namer, bounds: Bounds, tensor_type: type, objects: int) -> None:
        self.namer, self.bounds, self.tensor_type = namer, bounds, tensor_type
        self.objects = objects  # how many the collector listed: how long one scan of them takes
        self.objs: list[Any] | None = None  # every object, listed once where a level needs it

    def is_tensor(self, obj: object) -> bool:
        return issubclass(type(obj), self.tensor_type)

    def holders(self, tensors: list[Any], graph_keys: set[Any]) -> Iterator[Entry]:
        """(tensor, holder, kind) of each tensor that is native-held or in a cycle; empties ``tensors``.

        Those whose storage a graph counted (``graph_keys``) are that graph's: PyTorch keeps a
        saved tensor's Python object alive from C++.
        """
        tensors[:] = self.not_saved(tensors, graph_keys)
        if self.bounds.stopped is not None:
            # The census stopped early: these may well be reachable, so say only that.
            for t in tensors:
                yield t, NOT_REACHED, "not reached"
            tensors.clear()
            return
        if not tensors:
            return
        members, ids = self.climb(tensors)
        tensors.clear()  # from here on, `members` is the census's only reference to them
        sorted_out = None if self.bounds.stopped else self.refcounts(members, ids)
        from_native = None if sorted_out is None else self.native_parents(members, ids, sorted_out[1])
        if sorted_out is None or from_native is None:  # time was up: the tensors keep no name
            for obj in members:
                if self.is_tensor(obj):
                    yield obj, NOT_REACHED, "not reached"
            return
        parents = sorted_out[0]
        labels: dict[int, Label] = {}
        for n, obj in enumerate(members):
            if n % CHECK_EVERY == 0 and self.bounds.up(f"{n:,} unreached objects were sorted"):
                yield from ((t, NOT_REACHED, "not reached") for t in members[n:] if self.is_tensor(t))
                return
            if not self.is_tensor(obj):
                continue
            i = id(obj)
            if i in from_native:
                via = from_native[i]
                if via is None:
                    yield obj, "held from native code (no Python referrer)", "native"
                else:
                    label = self.namer.child_label(via, self.native_label(via, from_native, labels), obj)
                    yield obj, "held from native code: " + label.holder(), "native"
            elif i in parents:
                via = members[parents[i]]
                label = Label((type_name(via),), "unreachable cycle")
                owner = members[parents[id(via)]] if is_kind(via, dict) and id(via) in parents else None
                if owner is not None and instance_dict(owner) is via:
                    # An attribute dict is named by its object: `Node.t`, whether the census
                    # (or anything else) has asked for the object's __dict__ before or not.
                    label = Label((type_name(owner),), "unreachable cycle", "ns", self.namer.flavour(owner))
                label = self.namer.child_label(via, label, obj)
                yield obj, "unreachable cycle (awaiting gc): " + label.holder(), "unreachable cycle"
            # else: nothing refers to it but the census: it was freed while the census ran

    def not_saved(self, tensors: list[Any], graph_keys: set[Any]) -> list[Any]:
        """The tensors whose storage no graph saves. A function of its own, so that no loop
        variable of it still refers to a tensor when the reference counts are read."""
        kept: list[Any] = []
        for n, t in enumerate(tensors):
            if n % CHECK_EVERY == 0 and self.bounds.up(f"{n:,} unreached tensors were looked at"):
                kept.extend(tensors[n:])  # not looked at: kept as they are
                break
            if not all(k in graph_keys for k, _ in storages(t)):
                kept.append(t)
        return kept

    def climb(self, tensors: list[Any]) -> tuple[list[Any], set[int]]:
        """The tensors and everything that refers to them, transitively (the walk reached none).

        ``gc.get_referrers`` scans every object in one C call per level, holding the GIL: it is
        used for a few targets in a heap of at most :data:`ONE_CALL` objects; otherwise the
        referrers are searched in one list of all objects, taken once and read in slices.
        """
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
            if depth > self.bounds.max_depth:
                self.bounds.stop(f"max_depth: the referrers of unreached tensors are more than {depth - 1} steps deep")
                break
            found = self.referrers(level, own)
            if found is None:
                break
            scratch.append(found)
            own.add(id(found))
            level = []
            for r in found:
                i = id(r)
                if i in ids or i in own or (type(r) is types.FrameType and own_frame(r)):
                    continue
                ids.add(i)
                members.append(r)
                level.append(r)
        if self.objs is not None:
            self.bounds.release(self.objs)
            self.objs = None
        for lst in scratch[2:]:
            lst.clear()
        return members, ids

    def referrers(self, targets: list[Any], own: set[int]) -> list[Any] | None:
        """The objects that refer to one of ``targets``; None if time ran out."""
        if len(targets) <= 32 and self.objects <= ONE_CALL:
            return gc.get_referrers(*targets)
        if self.objs is None:
            self.objs = gc.get_objects()
            own.add(id(self.objs))
        objs = self.objs
        wanted = set(map(id, targets))
        found: list[Any] = []
        for start in range(0, len(objs), SLICE):
            # In slices: compress() runs in C until it finds a referrer, holding the GIL all along.
            part = objs[start : start + SLICE]
            refers = map(wanted.isdisjoint, map(map, itertools.repeat(id), map(gc.get_referents, part)))
            found.extend(o for o in itertools.compress(part, map(operator.not_, refers)) if id(o) not in own)
            del part
            if self.bounds.up(f"the referrers of {len(targets):,} unreached objects were being searched"):
                return None
        return found

    def refcounts(self, members: list[Any], ids: set[int]) -> tuple[dict[int, int], set[int]] | None:
        """Which members are referenced from outside the members (native code), as gc decides.

        None if time ran out.
        """
        edges = _edges(members, ids, self.bounds)
        if edges is None:
            return None
        internal, parents = edges
        members.append([])  # a probe referenced by `members` only: the census's own share
        counts = list(map(sys.getrefcount, members))
        members.pop()
        ours = counts.pop()
        external = {id(m) for m, n in zip(members, counts, strict=True) if n - ours - internal[id(m)] > 0}
        return parents, external

    def native_parents(self, members: list[Any], ids: set[int], external: set[int]) -> dict[int, Any] | None:
        """For each member reachable from an externally held member: its parent (None for a root).

        None if time ran out.
        """
        via: dict[int, Any] = dict.fromkeys(external)
        queue = [m for m in members if id(m) in external]
        for n, m in enumerate(queue):
            if n % CHECK_EVERY == 0 and self.bounds.up("native holders were being followed"):
                return None
            if self.is_tensor(m):
                continue
            for c in gc.get_referents(m):
                i = id(c)
                if i in ids and i not in via:
                    via[i] = m
                    queue.append(c)
        return via

    def native_label(self, obj: Any, via: dict[int, Any], labels: dict[int, Label]) -> Label:
        chain: list[Any] = []
        while id(obj) not in labels and via.get(id(obj)) is not None:
            chain.append(obj)
            obj = via[id(obj)]
        label = labels.get(id(obj)) or Label((type_name(obj),), "native")
        labels[id(obj)] = label
        for c in reversed(chain):
            label = self.namer.child_label(obj, label, c)
            labels[id(c)] = label
            obj = c
        return label


def _edges(members: list[Any], ids: set[int], bounds: Bounds) -> tuple[collections.Counter[int], dict[int, int]] | None:
    """References between members: how many each receives, and one referrer's index for each.

    A function of its own so that no loop variable of it is still bound (one more reference)
    when the caller reads the reference counts. None if time ran out.
    """
    internal: collections.Counter[int] = collections.Counter()
    parents: dict[int, int] = {}  # the index, not the object: that would be one more reference
    for n, m in enumerate(members):
        if n % CHECK_EVERY == 0 and bounds.up(f"{n:,} of {len(members):,} unreached objects were sorted"):
            return None
        for c in gc.get_referents(m):
            i = id(c)
            if i in ids:
                internal[i] += 1
                parents.setdefault(i, n)
    return internal, parents
