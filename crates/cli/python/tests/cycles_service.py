"""A FastAPI + PyTorch service for the scan's tests of the collector's garbage.

``POST /predict`` runs a ``Linear(512, 256)`` forward on a batch of 8 (8 KiB out) under
``torch.inference_mode()`` and, per variant, keeps what follows. Its long-lived heap is large,
as a real service's is (torch imported, and a vocabulary of half a million small objects), so
the collector's full collections come tens of thousands of requests apart: a scan sees the
garbage pile up and never a full collection take it.

- ``cycles``: per request a reference cycle (a handle whose callback is its own bound method)
  holding the request's 8 KiB output, kept among the last 64 requests' handles (a bounded
  ``deque``) and then dropped: having outlived the collector's young collections, each waits in
  its oldest generation for its next full collection, which on a heap this large comes after
  thousands of requests. The collector is enabled at its default thresholds: garbage, not a
  leak.
- ``cycles-off``: the same cycles with the collector disabled (``gc.disable()``): never freed.
- ``cycles-kept``: the same cycles, each also appended to a module-level list, ``KEPT``: a leak
  the collector cannot free.
- ``native``: the same cycles (collector enabled), and 8 KiB a request from C's ``malloc``, never
  freed (every page touched): a native leak beside the garbage.

leaklab's agent is mounted with its trim probe allowed (``allow_trim``).

    python cycles_service.py --variant cycles --port 0

prints ``cycles-service VARIANT listening on http://127.0.0.1:PORT`` before uvicorn binds it.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import socket
from collections import deque
from typing import Any

import torch
from fastapi import FastAPI
from leaklab.asgi import LeaklabDebug
from pydantic import BaseModel

VARIANT = os.environ.get("CYCLES_VARIANT", "cycles")
KEEP = 8192
torch.set_num_threads(1)
MODEL = torch.nn.Linear(512, 256)
KEPT: list[Any] = []
VOCABULARY = {f"token{i}": [i, i + 1] for i in range(500_000)}  # long-lived, tracked by the collector
RECENT: deque[Any] = deque(maxlen=64)
LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]
LIBC.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

if VARIANT == "cycles-off":
    gc.disable()  # LEAK(cycles): the collector off, so no cycle is ever freed

app = FastAPI()
app.add_middleware(LeaklabDebug, allow_trim=True)


class Batch(BaseModel):
    inputs: list[list[float]]


class Handle:
    """A result handle whose callback list holds its own bound method: a reference cycle."""

    def __init__(self, held: torch.Tensor) -> None:
        self.held = held
        self.callbacks = [self.done]

    def done(self) -> None:
        self.held = None


@app.post("/predict")
def predict(batch: Batch) -> dict[str, float]:
    # A tokenizer's per-request objects, a dict a token, freed at once: the collector counts
    # them, so its young collections come every request or two (as in a service that
    # tokenises), and a handle still alive then is promoted, and dies in its oldest generation.
    tokens = [{"token": i} for i in range(1000)]
    with torch.inference_mode():
        out = MODEL(torch.tensor(batch.inputs, dtype=torch.float32))
    # 8 x 256 float32: 8 KiB, held by a cycle that reference counting never frees.
    handle = Handle(out.clone())
    RECENT.append(handle)  # the last 64 handles, each then dropped with its cycle
    if VARIANT == "cycles-kept":
        KEPT.append(handle)  # LEAK(cycles): every handle kept, out of the collector's reach
    elif VARIANT == "native":
        block = LIBC.malloc(KEEP)  # LEAK(native): C memory nobody frees, every page touched
        LIBC.memset(block, 1, KEEP)
    # FIX(cycles), FIX(native): the `cycles` variant drops the handle, its cycle left to the
    # collector, and allocates nothing from C.
    return {"mean": float(out.mean()), "tokens": len(tokens)}


@app.get("/gc")
def collections() -> dict[str, Any]:
    """The collector's own counts: full collections so far show whether one came mid-scan."""
    return {"stats": gc.get_stats(), "count": gc.get_count(), "threshold": gc.get_threshold()}


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--variant", choices=["cycles", "cycles-off", "cycles-kept", "native"], required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    os.environ["CYCLES_VARIANT"] = args.variant
    port = args.port
    if port == 0:  # a free port, known (and printed) before uvicorn binds it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    print(f"cycles-service {args.variant} listening on http://127.0.0.1:{port}", flush=True)
    uvicorn.run(
        "cycles_service:app",
        host="127.0.0.1",
        port=port,
        app_dir=os.path.dirname(os.path.abspath(__file__)),
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
