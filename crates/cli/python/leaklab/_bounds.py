"""The census's bounds: its deadline, checked in every phase, and its turns with other threads.

Every phase of the census (listing the objects, the walk, the names, the storages, the graphs,
the referrer scans) works in slices of :data:`CHECK_EVERY` objects or fewer, and between two
slices calls :meth:`Bounds.pause`: it hands the GIL to any thread waiting for it (the event
loop) and looks at the clock. The collector is off during a slice (a collection started by
the census's own allocations would hold the GIL for its whole pass) and, where the process had
it on, back on during the pause, so that the application's own threads never run long with it
off. What the census reports stays alive meanwhile: its own lists refer to it.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["CHECK_EVERY", "RELEASE", "SLICE", "WALK_SHARE", "Bounds"]

# Objects (or graph nodes) between two pauses. Measured on the bench (a 1 ms asyncio ticker
# beside a census of 300k objects): every 8,192 objects the loop kept about 110 ticks/s of its
# 820; every 1,024 about 400, for 7 % more CPU in the census.
CHECK_EVERY = 1024
#: Objects per C call over all objects (a few ms), with a pause between two.
SLICE = 20_000
#: References dropped between two pauses when a big list is given back: a decrement each, where
#: the objects live on (a millisecond or two for 100,000 here).
RELEASE = 100_000
#: The share of ``max_seconds`` the walk may take, so that what it found has time to be named
#: and counted before the deadline.
WALK_SHARE = 0.75


class Bounds:
    """The deadline and depth of one census, why it stopped early, and its pauses."""

    def __init__(self, max_seconds: float, max_depth: int, collector: bool) -> None:
        self.max_seconds, self.max_depth = max_seconds, max_depth
        self.started = time.perf_counter()
        self.deadline = self.started + max_seconds
        self.walk_deadline = self.started + WALK_SHARE * max_seconds
        self.collector = collector  # whether the process had the collector on
        self.stopped: str | None = None

    def late(self) -> bool:
        return time.perf_counter() > self.deadline

    def walk_late(self) -> bool:
        return time.perf_counter() > self.walk_deadline

    def pause(self) -> None:
        """Hand the GIL to a waiting thread, with the collector as the process had it."""
        if self.collector:
            gc.enable()
        time.sleep(0)
        if self.collector:
            gc.disable()

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why

    def up(self, what: str) -> bool:
        """Pause; then, if time is up, stop (``max_seconds: <what> when ... s were up``) and say so."""
        self.pause()
        if self.late():
            self.stop(f"max_seconds: {what} when {self.max_seconds:g} s were up")
            return True
        return False

    def release(self, objects: list[Any]) -> None:
        """Drop a big list's references in slices from its end, pausing between two.

        Freeing a list of a million references in one go is one C call that holds the GIL.
        """
        while objects:
            del objects[-RELEASE:]
            self.pause()
