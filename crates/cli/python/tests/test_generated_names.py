"""Entries a service adds per request under generated names, in four kinds of container: a
module's buffers (``register_buffer(f"buf_{n}", ...)``), an instance's attributes
(``setattr``), Starlette's ``app.state`` and a module's globals. The census names each entry
as a holder of its own (its path ends in the generated name); the difference of two censuses
(``leaklab census-diff``, the rule the scan, the watch and the plugin share) reads each
container's entries as one holder with a count, and its fix names the act that adds them.
On main before the rule: one row per entry, ``svc.MODEL.buf_1000 (module global): +1 tensors``,
and the fix "stop keeping it in" that one entry.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from leaklab.census import census, census_diff
from starlette.datastructures import State

N = 12
ELEMENTS = 64  # float32: 256 bytes an entry


class Recorder:
    """A plain object that gets an attribute per request."""


MODEL = torch.nn.Linear(4, 4)
RECORDER = Recorder()
STATE = State()
KEPT = []  # a list of entries, named once however many it holds: not generated names


def serve(n: int) -> None:
    """What each request leaves behind: one entry per container, under a name made from n."""
    module = sys.modules[__name__]
    MODEL.register_buffer(f"buf_{n}", torch.full((ELEMENTS,), float(n)))
    setattr(RECORDER, f"out_{n}", torch.full((ELEMENTS,), float(n)))
    setattr(STATE, f"resp_{n}", torch.full((ELEMENTS,), float(n)))
    setattr(module, f"cache_{n}", torch.full((ELEMENTS,), float(n)))
    KEPT.append(torch.full((ELEMENTS,), float(n)))


@pytest.fixture(scope="module")
def grown() -> dict[str, Any]:
    serve(0)
    before = census()
    for n in range(1, N + 1):
        serve(n)
    after = census()
    return {g["holder"]: g for g in census_diff(before, after, N)["grown"]}


@pytest.mark.parametrize(
    "pattern",
    ["MODEL.buf_*", "RECORDER.out_*", "STATE.resp_*", "cache_*"],
)
def test_each_containers_generated_entries_are_one_holder_with_a_count(pattern: str, grown: dict[str, Any]) -> None:
    name = f"{__name__}.{pattern}"
    assert name in grown, f"no {name} among {sorted(grown)}"
    g = grown[name]
    assert g["entries"] == N
    assert g["tensors"] == N
    assert g["bytes"] == N * ELEMENTS * 4
    assert g["bytes_per_step"] == ELEMENTS * 4


def test_no_entry_is_a_row_of_its_own_and_a_list_stays_one_holder(grown: dict[str, Any]) -> None:
    singles = [h for h in grown if any(f"_{n}" in h for n in range(1, N + 1))]
    assert singles == [], singles
    kept = grown[f"{__name__}.KEPT"]
    assert kept["tensors"] == N and "entries" not in kept
