"""Reading the user's objects without running their code: the rules every part of the census keeps.

The census touches arbitrary objects of the user's process, so it never runs their code: no
isinstance() (it reads ``__class__``, which a proxy may compute), no getattr() on instances, no
overridable methods. Types are checked with ``issubclass(type(x), ...)``, attributes read
through the C descriptors of ``type`` and ``object``, dicts through dict's own methods.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

#: The census's own modules: their frames are not roots (they hold what the census is walking).
OWN_MODULES = frozenset(
    {
        "leaklab.census",
        "leaklab.asgi",
        "leaklab._bounds",
        "leaklab._naming",
        "leaklab._process",
        "leaklab._reflect",
        "leaklab._storage",
        "leaklab._unreached",
        "leaklab._walk",
    }
)
SEQUENCES = (list, tuple, set, frozenset, collections.deque)
GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)

TYPE_DICT = type.__dict__["__dict__"]
TYPE_MRO = type.__dict__["__mro__"]
TYPE_NAME = type.__dict__["__qualname__"]
TYPE_MODULE = type.__dict__["__module__"]
TYPE_SHORT = type.__dict__["__name__"]


def is_kind(obj: object, kinds: type | tuple[type, ...]) -> bool:
    return issubclass(type(obj), kinds)


def class_name(cls: type) -> str:
    module = TYPE_MODULE.__get__(cls)
    name = TYPE_NAME.__get__(cls)
    return name if module in (None, "builtins") or not isinstance(module, str) else f"{module}.{name}"


def short_name(obj: object) -> str:
    name: str = TYPE_SHORT.__get__(type(obj))
    return name


def type_name(obj: object) -> str:
    return class_name(type(obj))


def mro_of(obj: object) -> tuple[type, ...]:
    mro: tuple[type, ...] = TYPE_MRO.__get__(type(obj))
    return mro


def instance_dict(obj: object) -> dict[str, Any] | None:
    """``obj.__dict__`` through its C descriptor; None where there is none (or a custom one)."""
    for cls in mro_of(obj):
        descriptor = TYPE_DICT.__get__(cls).get("__dict__")
        if descriptor is not None:
            if type(descriptor) not in (types.GetSetDescriptorType, types.MemberDescriptorType):
                return None  # a Python-level __dict__ (a property): calling it would run user code
            try:
                namespace = descriptor.__get__(obj, cls)
            except Exception:
                return None
            return namespace if is_kind(namespace, dict) else None
    return None


def filled_slots(obj: object) -> Iterator[tuple[str, Any]]:
    """The filled ``__slots__`` of ``obj``, read through their member descriptors."""
    for cls in mro_of(obj):
        namespace = TYPE_DICT.__get__(cls)
        names = namespace.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            descriptor = namespace.get(name)
            if type(descriptor) is types.MemberDescriptorType:
                try:
                    yield name, descriptor.__get__(obj, cls)
                except AttributeError:  # an empty slot
                    continue


def subclasses(cls: type) -> set[type]:
    found = {cls}
    stack = [cls]
    while stack:
        subclasses: list[type] = type.__subclasses__(stack.pop())
        for sub in subclasses:
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


def single_reference_count() -> int:
    """What ``sys.getrefcount`` says, inside the walk's loop, of an object referenced once.

    Measured rather than assumed: the loop's own references (the referents list, the loop
    variable, the call's argument) differ between Python versions.
    """
    probe: list[list[int]] = [[]]
    for child in filter(gc.is_tracked, gc.get_referents(probe)):
        return sys.getrefcount(child)
    raise AssertionError("a list's referents must include its element")


def own_frame(frame: types.FrameType) -> bool:
    return dict.get(frame.f_globals, "__name__") in OWN_MODULES


def qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname is Python 3.11+


def where(code: types.CodeType) -> str:
    # The line where the function starts, not where the frame is now: the name must not change
    # between two censuses while the frame moves.
    return f"{qualname(code)} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def frame_locals(frame: types.FrameType) -> Any:
    # A dict on Python 3.12 and older (the frame's own, updated on each read); a write-through
    # proxy from 3.13, copied so that the walk has a container to start from.
    f_locals = frame.f_locals
    return f_locals if type(f_locals) is dict else dict(f_locals)


def stored_names(code: types.CodeType) -> Iterator[str]:
    """The attribute names a function's code (and the code nested in it) stores."""
    yield from code.co_names
    for const in code.co_consts:
        if type(const) is types.CodeType:
            yield from stored_names(const)
