"""Names: the path from a root to the container that holds a tensor, as a Python engineer reads it.

Names are built only for the ancestors of tensors, memoised, from the walk's parent chain
(:mod:`leaklab._walk`). A path is rebased at the nearest object with a name of its own (a
class, an importable function, a coroutine, a logger), so the same holder keeps the same name
however it was reached. A closure or a lambda has no such name: its path from the root (where
it was registered: a module global, app state, a module's hook dict, a thread's frame) comes
before its qualified name. Variable parts (list indices, dict keys) collapse to ``[…]``, and the trailing
ones are dropped: the holder is the container, not the slot. docs/agent.md has the rules with
examples.
"""

from __future__ import annotations

import _thread
import array
import contextvars
import gc
import sys
import types
from typing import Any

from leaklab._bounds import CHECK_EVERY, Bounds
from leaklab._reflect import (
    GENERATORS,
    SEQUENCES,
    TYPE_DICT,
    TYPE_MODULE,
    TYPE_MRO,
    TYPE_SHORT,
    class_name,
    filled_slots,
    frame_locals,
    instance_dict,
    is_kind,
    short_name,
    stored_names,
    where,
)

__all__ = ["ITEM", "NOT_NAMED", "Entry", "Label", "Namer"]

#: Variable parts of a path (list indices, dict keys) are written as this token.
ITEM = "[…]"
#: The holder of the tensors the walk reached but had no time left to name.
NOT_NAMED = "(not named: the census stopped early)"

Entry = tuple[Any, str, str]  # (tensor, holder, kind)


class Label:
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

    def child(self, token: str, kind: str | None = None, role: str = "", aux: Any = None) -> Label:
        tokens = self.tokens
        if token.startswith(".") and tokens and tokens[-1] in (token, token + "…"):
            # A chain of one attribute (a linked list) collapses: `.next.next.next` is `.next…`.
            tokens = (*tokens[:-1], token + "…")
        elif token:
            tokens = (*tokens, token)
        return Label(tokens, kind or self.kind, role, aux)

    def holder(self) -> str:
        end = len(self.tokens)
        while end > 1 and self.tokens[end - 1] == ITEM:
            end -= 1  # the holder is the container, not its slot
        return "".join(self.tokens[:end])


def _above(pos: int, parent: array.array[int]) -> set[int]:
    """``pos`` and every position on its path up to its root."""
    chain = set()
    while pos >= 0:
        chain.add(pos)
        pos = parent[pos]
    return chain


def _meet(pos: int, above: set[int], parent: array.array[int]) -> tuple[int, set[int]]:
    """Where the path of ``pos`` joins the path ``above`` (-1: different roots), and that path's
    part from there up.

    A holder's identity is the deepest object all its tensors are reached through: the list of a
    ``HISTORY[…]``, the dict of a ``_forward_hooks[…] → hook → cell 'noise'`` (each hook's cell its
    own). The walk reaches that object by one path in a census and maybe another in the next; the
    object itself stays the same.
    """
    while pos >= 0 and pos not in above:
        pos = parent[pos]
    if pos < 0:
        return -1, set()
    return pos, _above(pos, parent)


class Namer:
    """Names the holders of tensors; caches what it read of each mapping and class."""

    def __init__(self, torch: Any) -> None:
        logging = sys.modules.get("logging")
        self.logger_type: type | None = getattr(logging, "Logger", None)
        self.module_type: type | None = getattr(getattr(torch, "nn", None), "Module", None)
        # id(mapping) -> (mapping, {id(value): key}); the mapping is kept so its id stays its own.
        self.keys: dict[int, tuple[Any, dict[int, Any]]] = {}
        self.attr_names: dict[type, tuple[str, ...]] = {}
        #: holder -> ``id()`` of the deepest object all its tensors are reached through (None:
        #: they share none), filled by :meth:`holders`.
        self.identities: dict[str, int | None] = {}

    def holders(
        self,
        found: list[Any],
        reached: dict[int, int],
        order: list[Any],
        parent: array.array[int],
        labels: dict[int, Label],
        bounds: Bounds,
    ) -> list[Entry]:
        """(tensor, holder, kind) of each tensor the walk reached, from its parent's label."""
        entries: list[Entry] = []
        # Every tensor in a list or dict has its container's holder: computed once per container
        # position, and once per rendered container path (ten thousand records in one list).
        slots: dict[int, tuple[str, str]] = {}
        paths: dict[tuple[str, ...], tuple[str, str]] = {}
        # holder -> (position of the deepest object all its tensors are reached through, or -1
        # where they share none; the positions above it, to meet the next tensor's path).
        meets: dict[str, tuple[int, set[int]]] = {}
        for n, t in enumerate(found):
            if n % CHECK_EVERY == 0 and bounds.up(f"{n:,} of {len(found):,} reached tensors were named"):
                entries.extend((t, NOT_NAMED, "not reached") for t in found[n:])
                break
            p = reached[id(t)]
            known = slots.get(p)
            if known is None:
                label = self.label(p, order, parent, labels)
                if not label.role and (is_kind(order[p], dict) or is_kind(order[p], SEQUENCES)):
                    known = paths.get(label.tokens)
                    if known is None:
                        child = label.child(ITEM)
                        known = paths[label.tokens] = (child.holder(), child.kind)
                    slots[p] = known
                else:
                    label = self.child_label(order[p], label, t)
                    known = (label.holder(), label.kind)
            entries.append((t, *known))
            meet = meets.get(known[0])
            if meet is None:
                meets[known[0]] = (p, _above(p, parent))
            elif meet[0] != p and meet[0] >= 0:
                meets[known[0]] = _meet(p, meet[1], parent)
        self.keys.clear()
        self.identities = {name: id(order[m]) if m >= 0 else None for name, (m, _) in meets.items()}
        return entries

    def label(self, pos: int, order: list[Any], parent: array.array[int], labels: dict[int, Label]) -> Label:
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
                items = list(dict.items(mapping) if is_kind(mapping, dict) else mapping.items())
            except Exception:  # a mapping that cannot be listed: name the slot, not the key
                items = []
            cached = self.keys[id(mapping)] = (mapping, {id(v): k for k, v in items})
        return cached[1].get(id(child), ITEM)

    def flavour(self, obj: object) -> str | None:
        """Instances whose attribute dicts are read as attributes under another name."""
        if self.module_type is not None and is_kind(obj, self.module_type):
            return "nn"
        tp = type(obj)
        if TYPE_SHORT.__get__(tp) == "State" and str(TYPE_MODULE.__get__(tp)).startswith("starlette"):
            return "state"
        if self.logger_type is not None and is_kind(obj, self.logger_type):
            return "logger"
        return None

    def attribute(self, label: Label, flavour: str | None, name: str, child: object) -> Label:
        if flavour == "nn" and name in ("_parameters", "_buffers", "_modules") and is_kind(child, dict):
            return label.child("", role="ns", aux="nn")  # model.0.weight, as state_dict names it
        if flavour == "state" and name == "_state" and is_kind(child, dict):
            return label.child("", role="ns")  # app.state.responses
        if flavour == "logger" and name == "handlers":
            return label.child("", kind="log records", role="handlers")
        kind = "log records" if short_name(child) == "LogRecord" else None
        return label.child("." + name, kind=kind)

    def child_label(self, parent: Any, label: Label, child: Any) -> Label:
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
            return label.child(" " + short_name(child), kind="log records")
        if role == "context":
            # A context's values sit in a trie whose shape depends on its size: name the variable.
            if short_name(child).startswith("hamt"):
                return label.child("", role="context", aux=label.aux)
            for var, value in contextvars.Context.items(label.aux):
                if value is child:
                    return label.child(f" → ContextVar '{var.name}'")
            return label.child(" → ContextVar")
        if type(parent) is contextvars.Context:
            return label.child("", role="context", aux=parent)
        if role == "thread-local" and is_kind(child, dict):
            return label.child(" (thread-local)", role="ns")  # the attributes one thread set
        if is_kind(parent, _thread._local) and is_kind(child, dict):
            return label.child("", role="thread-local")  # {thread's weak key: its attribute dict}
        if is_kind(parent, dict) or is_kind(parent, SEQUENCES):
            return label.child(ITEM)
        if is_kind(parent, type):
            return self.class_child(parent, label, child)
        if is_kind(parent, types.ModuleType):
            namespace = instance_dict(parent)
            if namespace is not None and child is namespace:
                return Label((str(namespace.get("__name__")),), "module global", "ns")
            return label.child(" → " + short_name(child))
        if type(parent) is types.FunctionType:
            return self.function_child(parent, label, child)
        if type(parent) is types.MethodType:
            return label.child(".__self__" if child is parent.__self__ else ".__func__")
        if type(parent) is types.CellType:
            return label.child(" → cell", role="cell")
        if type(parent) in GENERATORS:
            return self.generator_child(parent, child)
        if type(parent) is types.FrameType:
            if child is parent.f_back:
                return label.child(".f_back")
            frame = label.child(f" → frame {where(parent.f_code)}", role="locals")
            return self.child_label(frame_locals(parent), frame, child)
        if type(parent) is types.TracebackType:
            return label.child(".tb_frame" if child is parent.tb_frame else ".tb_next")
        return self.instance_child(parent, label, child)

    def class_child(self, cls: type, label: Label, child: Any) -> Label:
        # The class's namespace dict is the one referent of its mappingproxy.
        namespace = gc.get_referents(TYPE_DICT.__get__(cls))
        if namespace and child is namespace[0]:
            return Label((class_name(cls),), "class attribute", "ns")
        if child is TYPE_MRO.__get__(cls):
            return label.child(".__mro__")
        return label.child(" → " + short_name(child))

    def function_child(self, fn: types.FunctionType, label: Label, child: Any) -> Label:
        qualname = fn.__qualname__
        if "<" in qualname:
            # A closure or a lambda, made at run time: its name says what it is, not where it is
            # kept. Its path from the root does (a hook is kept where it was registered:
            # `svc.MODEL.2._forward_hooks[…] → make_hook.<locals>.hook`).
            anchor = label.child(" → " + qualname, kind="closure")
        else:
            # Importable as `module.qualname`: a root of its own, however it was reached.
            anchor = Label((f"{fn.__module__}.{qualname}",), "closure")
        if child is fn.__closure__:
            return anchor.child("", role="closure", aux=fn.__code__.co_freevars)
        if child is fn.__defaults__:
            return anchor.child(" → defaults")
        if child is fn.__kwdefaults__:
            return anchor.child(" → defaults", role="ns")
        if child is instance_dict(fn):
            return anchor.child("", role="ns")
        return anchor.child(" → " + short_name(child))

    def generator_child(self, gen: Any, child: Any) -> Label:
        # A suspended coroutine is named by its function, however the event loop holds it.
        code = getattr(gen, "gi_code", None) or getattr(gen, "cr_code", None) or gen.ag_code
        frame = getattr(gen, "gi_frame", None) or getattr(gen, "cr_frame", None) or getattr(gen, "ag_frame", None)
        anchor = Label((f"{short_name(gen)} {where(code)}",), "frame", "locals")
        return self.child_label(frame_locals(frame), anchor, child) if frame is not None else anchor.child(" local")

    def instance_child(self, obj: Any, label: Label, child: Any) -> Label:
        flavour = self.flavour(obj)
        if flavour == "logger":
            namespace = instance_dict(obj)
            name = namespace.get("name") if namespace is not None else "?"
            label = Label((f"logging '{name}'",), "log records")
        for name, value in filled_slots(obj):
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
        namespace = instance_dict(obj)
        if namespace is not None:
            if child is namespace:
                return label.child("", role="ns", aux=flavour)
            key = self.key_of(namespace, child)
            if isinstance(key, str):
                return self.attribute(label, flavour, key, child)
        if is_kind(obj, BaseException):
            for name in ("args", "__traceback__", "__context__", "__cause__"):
                if BaseException.__dict__[name].__get__(obj) is child:
                    return label.child("." + name)
        return label.child(" → " + short_name(child))

    def attribute_names(self, tp: type) -> tuple[str, ...]:
        """Names the methods of ``tp`` store on ``self`` that no class in its MRO defines.

        A name a class defines could be a descriptor (a property) whose reading runs code.
        """
        names = self.attr_names.get(tp)
        if names is None:
            mro = TYPE_MRO.__get__(tp)
            defined: set[str] = set()
            candidates: set[str] = set()
            for cls in mro:
                namespace = TYPE_DICT.__get__(cls)
                defined.update(namespace)
                for value in namespace.values():
                    if type(value) in (staticmethod, classmethod):
                        value = value.__func__
                    if type(value) is types.FunctionType:
                        candidates.update(stored_names(value.__code__))
            names = tuple(sorted(candidates - defined))
            # A class with many (nn.Module and its kin) has its __dict__ built already, as a
            # rule (its own code reads it): one look at the dict is cheaper than many misses.
            names = self.attr_names[tp] = names if len(names) <= 64 else ()
        return names
