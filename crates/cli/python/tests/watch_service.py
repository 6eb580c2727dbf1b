"""A small FastAPI service for the tests of ``leaklab watch`` and of the workers' shared folder.

``POST /work`` makes a fresh buffer of ``WATCH_KEEP`` bytes (32 KiB) per request; the ``leaky``
variant keeps every one, the ``fixed`` one only the last; the ``tensors`` variant keeps a tensor of
as many bytes a request (torch imported at startup), which the agent's census names by its holder,
``watch_service.TENSORS``. The ``clock`` variant keeps nothing per request, but a background
thread keeps a buffer every ``WATCH_CLOCK_PERIOD`` seconds, requests or not (``clock-fixed``:
only the last). ``GET /metrics`` has the service's own counter of the
``/work`` requests, ``watch_requests_total``, as prometheus_client writes it. Configured by
environment variables, since ``uvicorn --workers`` imports the app by name in each worker;
leaklab's agent is mounted, its workers' folder from ``LEAKLAB_WORKERS_DIR``.

    python watch_service.py --variant leaky --port 0 [--workers 2]

prints ``watch-service VARIANT listening on http://127.0.0.1:PORT`` before uvicorn binds it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import threading
import time
from typing import Any

import prometheus_client
from fastapi import FastAPI, Response
from leaklab.asgi import LeaklabDebug

VARIANT = os.environ.get("WATCH_VARIANT", "fixed")
KEEP = int(os.environ.get("WATCH_KEEP", "32768"))
CLOCK_PERIOD = float(os.environ.get("WATCH_CLOCK_PERIOD", "0.1"))
KEPT: list[bytes] = []
TICKS: list[bytes] = []
TENSORS: list[Any] = []

if VARIANT == "tensors":
    import torch

app = FastAPI()
app.add_middleware(LeaklabDebug, workers_period=float(os.environ.get("WATCH_WORKERS_PERIOD", "0.5")))


# Its own registry: run as a script, this file is imported a second time by uvicorn.
REGISTRY = prometheus_client.CollectorRegistry()
SERVED = prometheus_client.Counter("watch_requests", "Requests to /work", registry=REGISTRY)


@app.get("/metrics")
def metrics() -> Response:
    return Response(prometheus_client.generate_latest(REGISTRY), media_type=prometheus_client.CONTENT_TYPE_LATEST)


@app.post("/work")
async def work() -> dict[str, int]:
    SERVED.inc()
    data = b"\x01" * KEEP  # a fresh buffer, every page touched
    if VARIANT == "leaky":
        KEPT.append(data)  # LEAK(history): every request's buffer kept forever
    elif VARIANT == "tensors":
        TENSORS.append(torch.ones(KEEP, dtype=torch.uint8))  # LEAK(tensors): a tensor kept a request
    else:
        KEPT[:] = [data]  # FIX(history), FIX(tensors): only the last buffer kept, no tensor
    return {"kept": len(KEPT)}


def _tick() -> None:
    start = time.monotonic()
    for n in itertools.count(1):
        # On a steady clock: a late tick (the GIL, a busy machine) is made up, so the rate holds.
        time.sleep(max(0.0, start + n * CLOCK_PERIOD - time.monotonic()))
        tick = b"\x02" * KEEP
        if VARIANT == "clock":
            TICKS.append(tick)  # LEAK(clock): a buffer kept every period, requests or not
        else:
            TICKS[:] = [tick]  # FIX(clock): only the last one kept


if VARIANT in ("clock", "clock-fixed"):
    threading.Thread(target=_tick, daemon=True).start()


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--variant", choices=["leaky", "fixed", "tensors", "clock", "clock-fixed"], required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    os.environ["WATCH_VARIANT"] = args.variant
    port = args.port
    if port == 0:  # a free port, known (and printed) before uvicorn binds it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    print(f"watch-service {args.variant} listening on http://127.0.0.1:{port}", flush=True)
    uvicorn.run(
        "watch_service:app",
        host="127.0.0.1",
        port=port,
        workers=args.workers,
        app_dir=os.path.dirname(os.path.abspath(__file__)),
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
