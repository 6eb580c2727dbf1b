"""The zoo's shared parts: what an entry declares about itself, and how it is served.

Each cause is one module beside this file (``lab/zoo/<name>.py``). Its docstring tells the
cause as a learner reads it: the public report it reproduces (repository and issue or PR), the
symptom as reported, and, written *before* it was measured, the prediction: the instrument that
should see it, the expected verdict under a stated budget, the growth axis and the owner. Its
``ENTRY`` says the same for programs (the zoo driver, ``cargo xtask run-lab --zoo``, reads every
``ENTRY`` through ``serve.py --list``), and its ``make_app(variant)`` builds the FastAPI service,
the leaky path marked ``LEAK(cause)`` and its fixed twin ``FIX(cause)`` beside it.

A cause module imports only the standard library and this file at its top: torch and FastAPI
are imported inside ``make_app``, so that listing the zoo costs nothing and an entry's
environment knobs (``Entry.env``) are set before its libraries read them. ``serve.py
--variants`` imports what every variant imports (``Entry.preload``) once, then forks each
variant's service from that process in turn: importing torch is most of a start-up.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeGuard

Variant = Literal["leaky", "fixed"]
VARIANTS: tuple[Variant, ...] = ("leaky", "fixed")

# The axis along which memory grows, one word each (docs/zoo.md explains them):
# per-request    every request adds (a Python holder, a graph, a hook)
# per-new-input  only inputs not seen before add (a cache keyed by shape or value)
# per-new-thread every new thread adds (thread-local native state)
# other-process  a child process grows while the service process stays flat
# bounded        grows, then stops at a capacity (a cache with a cap)
# given-back     grows and holds, but the allocator returns it when asked (malloc_trim)
# garbage        grows between the collector's full collections, which free it (cycles)
# none           nothing grows
Axis = Literal[
    "per-request",
    "per-new-input",
    "per-new-thread",
    "other-process",
    "bounded",
    "given-back",
    "garbage",
    "none",
]

# Where the growing memory lives: a Python object reachable from a root (the census names
# it), native memory no Python object holds (a library's cache, the allocator), or another
# process of the service's tree.
Owner = Literal["python", "native", "other-process", "none"]

Verdict = Literal["fail", "pass"]

# Where the cause lives: on any machine, or only where there is a CUDA device. A "cuda" entry's
# ``make_app`` says "CUDA not available" elsewhere (``require_cuda``), and its test is a
# device-only one (``#[ignore = "needs a GPU"]`` in crates/runner/tests/zoo.rs).
Device = Literal["cpu", "cuda"]

# How the scan's request bodies are made: one body sent again and again ("same"), numbers
# nudged per request (the scan's --vary: new by value, same shape), or a folder of bodies of
# distinct shapes written by ``Entry.bodies`` ("shapes").
Inputs = Literal["same", "vary", "shapes"]


@dataclass(frozen=True)
class Expect:
    """What one variant should get: the verdict under ``Entry.budget``, the axis and owner."""

    verdict: Verdict
    axis: Axis
    owner: Owner


@dataclass(frozen=True)
class Entry:
    """One cause of the zoo, as the driver and the docs read it."""

    name: str
    title: str
    # Public reports reproduced, e.g. "pytorch/pytorch#27971" (repository#number).
    reports: tuple[str, ...]
    # The symptom as the report tells it, in a sentence.
    symptom: str
    # "scan" (from outside: RSS / anonymous memory of the process tree) and/or "agent" (the
    # census inside names the holder) and/or "plugin" (the pytest leak_check, in-process).
    instruments: tuple[str, ...]
    below_python: bool
    # Must not be judged a leak: its "leaky" variant is what a naive check calls a leak.
    must_pass: bool
    # What each variant is: the verdict a right answer gives under ``budget``, the axis and the
    # owner (a leak's leaky variant fails, even where today's scan misses it: ``known_miss``).
    leaky: Expect
    fixed: Expect
    # The scan's budget flags, the same for both variants, e.g.
    # ("--capacity", "512MiB", "--rate", "10", "--fail-if-oom-within", "7d").
    budget: tuple[str, ...]
    # The commit that first held this module: ``leaky`` and ``fixed`` are its prediction, kept
    # as written there (issue 49). Where that commit already held the module's first reading
    # (its MEASURED section), ``predicted_after_measuring`` says so: the zoo's table marks its
    # rows and does not count them as predicted. A new entry's prediction lands in a commit of
    # its own before its first measurement.
    predicted_in: str
    predicted_after_measuring: bool
    inputs: Inputs = "same"
    # Requests judged and warm-up, the smallest run that shows the mechanism.
    requests: int = 400
    warmup: int = 50
    # Environment set before make_app runs, per variant (a knob such as
    # ONEDNN_PRIMITIVE_CACHE_CAPACITY): after ``preload``, so a knob read when its library
    # loads rather than when it is first used needs that library left out of ``preload``.
    # Not glibc's MALLOC_* variables: glibc reads them when the process starts, before
    # serve.py sets these (use mallopt in make_app).
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    # A limit of the instrument, declared before a run showed it (a bounded native cache read
    # as a plateau, copy-on-write the summed anonymous memory does not show): the reading may
    # then see less than ``leaky``/``fixed`` state (a leak read as a pass, a growth read as
    # none), and the zoo counts it as a miss, with this reason, never as a pass. Empty: any
    # miss is a defect the zoo's test fails on.
    known_miss: str = ""
    # The commit that declared ``known_miss`` (its first words there, before the run).
    known_miss_since: str = ""
    # The body of one request (inputs "same"/"vary"); with "shapes", the body of request i.
    body: Callable[[int], dict[str, Any]] | None = None
    # Headers every request carries besides ``content-type: application/json`` ("Name: value",
    # the scan's --header): what the service's protocol asks of a client.
    headers: tuple[str, ...] = ()
    device: Device = "cpu"
    # Modules make_app imports, besides those every service imports (FastAPI, uvicorn,
    # leaklab's agent): ``serve.py --variants`` imports them once and forks each variant from
    # that process (import torch: 1.6-2.3 s of CPU a process). Only what the service imports
    # anyway, so that a forked service holds what a fresh one would.
    preload: tuple[str, ...] = ("torch",)

    def expect(self, variant: Variant) -> Expect:
        return self.leaky if variant == "leaky" else self.fixed

    def describe(self) -> dict[str, Any]:
        """The entry as JSON for the driver (no callables)."""
        doc = asdict(self)
        doc.pop("body")
        return doc


def require_cuda(name: str) -> None:
    """Raise, in words, where there is no CUDA device: a CUDA-only cause cannot run there."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"CUDA not available: {name} reproduces a CUDA-only cause; "
            "run it where a GPU is (its test is device-only)"
        )


def rows_body(i: int, rows: int) -> dict[str, Any]:
    """Request i's body for an entry whose requests differ in size: ``rows`` and a seed."""
    return {"rows": rows, "seed": i}


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def rows_of(body: Any, most: int) -> tuple[int, int]:
    """The body's ``rows`` (1 to ``most``) and ``seed``; ValueError, said plainly, otherwise."""
    if isinstance(body, dict):
        rows, seed = body.get("rows"), body.get("seed", 0)
        if _is_int(rows) and _is_int(seed) and 1 <= rows <= most:
            return rows, seed
    raise ValueError(
        f'the body must be {{"rows": <1..{most}>, "seed": <an integer>}}, got {body!r}'
    )


def matrix_of(body: Any, key: str, rows: int, width: int) -> list[list[float]]:
    """The body's ``key``: ``rows`` lists of ``width`` numbers; ValueError, said plainly,
    otherwise."""
    value = body.get(key) if isinstance(body, dict) else None
    if (
        isinstance(value, list)
        and len(value) == rows
        and all(isinstance(r, list) and len(r) == width for r in value)
    ):
        return value
    raise ValueError(f'the body must be {{"{key}": [{rows} lists of {width} numbers]}}')


def batch_body(
    rows: int, features: int, period: int, offset: float = 0.0
) -> dict[str, Any]:
    """One batch as a request body, ``{"inputs": [[...features...] * rows]}``: value ``c`` of
    row ``r`` is ``((r * features + c) % period) / period + offset``. The same body for every
    request, for the entries whose leak needs no new input (a different ``period`` per entry
    keeps their bodies apart)."""
    return {
        "inputs": [
            [((r * features + c) % period) / period + offset for c in range(features)]
            for r in range(rows)
        ]
    }


def zoo_site() -> None:
    """Makes the zoo's own packages importable here, after the venv's: those an entry needs
    that must not be importable by every service sharing the venv (``cargo xtask test`` and
    ``run-lab --zoo`` install them into ``sys.prefix/leaklab-zoo-site``; xtask/src/provision.rs
    says which, and why)."""
    import sys

    site = os.path.join(sys.prefix, "leaklab-zoo-site")
    if not os.path.isdir(site):
        raise RuntimeError(
            f"{site} is missing: `cargo xtask test` (or `cargo xtask run-lab --zoo`) installs "
            "the zoo's own packages there"
        )
    if site not in sys.path:
        sys.path.append(site)


def agent_middleware() -> Any:
    """leaklab's agent (``LeaklabDebug``): the installed package's, else the source tree's."""
    try:
        from leaklab.asgi import LeaklabDebug
    except (
        ImportError
    ):  # the source tree without the wheel installed: the package is here
        import sys

        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "..", "crates", "cli", "python"))
        from leaklab.asgi import LeaklabDebug
    return LeaklabDebug


def serve(app: Any, label: str, port: int = 0, native_max_seconds: float = 0.0) -> None:
    """Serve ``app`` on loopback, printing ``LABEL pid PID listening on http://127.0.0.1:PORT``
    first (the line leaklab's tests and the zoo driver wait for), with leaklab's agent mounted
    (its native trace allowed for ``native_max_seconds``, off at 0)."""
    import uvicorn

    # allow_trim: the zoo's scans ask the trim probe (--trim) whether a growth that held is the
    # allocator's to give back (the diagnosis's given-back axis); python_trace_max_seconds: they
    # ask the Python trace (--python-trace) what Python objects a window of requests kept. Both
    # run after all they judge.
    app.add_middleware(
        agent_middleware(),
        allow_trim=True,
        native_max_seconds=native_max_seconds,
        python_trace_max_seconds=30.0,
    )
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it each answer waits ~40 ms on Nagle and the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    # Listen before saying so: connections made right after the line queue until uvicorn
    # serves them, rather than being refused.
    sock.listen(128)
    host, port = sock.getsockname()
    print(
        f"leaklab-zoo {label} pid {os.getpid()} listening on http://{host}:{port}",
        flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


def to_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True)
