"""An API server that hands its inference to a worker process, as LitServe and BentoML do, for
the scan's test of a growth in another process.

The API process (FastAPI, leaklab's agent mounted, ``LEAKLAB_WORKERS_DIR`` shared) starts one
worker process at start-up and forwards each ``POST /predict`` to it over a pipe, a line each
way. The worker serves no HTTP: it serves leaklab's agent itself (``leaklab.serve_agent()``,
registered in the same folder) and runs a ``Linear(512, 256)`` on the batch; the ``leaky``
variant keeps every output (8 KiB) in ``KEPT``, the ``fixed`` one only the last.

    python worker_service.py --variant leaky --port 0

prints ``worker-service VARIANT listening on http://127.0.0.1:PORT`` before uvicorn binds it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

# At the module's top: FastAPI resolves the endpoint's annotations (strings here) in its globals.
from fastapi import FastAPI, Request

VARIANT = os.environ.get("WORKER_VARIANT", "leaky")


def worker() -> None:
    """The inference worker: a line of JSON in, a line out; the agent served from a thread."""
    import torch
    from leaklab import serve_agent

    torch.set_num_threads(1)
    model = torch.nn.Linear(512, 256)
    kept: list[Any] = []
    globals()["KEPT"] = kept
    serve_agent(workers_dir=os.environ["LEAKLAB_WORKERS_DIR"], workers_period=0.1)
    print("ready", flush=True)
    for line in sys.stdin:
        with torch.inference_mode():
            out = model(torch.tensor(json.loads(line)["inputs"], dtype=torch.float32))
        if VARIANT == "leaky":
            kept.append(out.clone())  # LEAK(worker): every output kept, in the worker
        else:
            kept[:] = [out.clone()]  # FIX(worker): only the last output kept
        print(json.dumps({"mean": float(out.mean())}), flush=True)


def api() -> Any:
    from leaklab.asgi import LeaklabDebug

    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker", "--variant", VARIANT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    lock = threading.Lock()
    app = FastAPI()
    app.add_middleware(LeaklabDebug, workers_period=0.1)

    @app.post("/predict")
    async def predict(request: Request) -> Any:
        body = await request.body()
        with lock:  # one exchange on the pipe at a time
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(json.dumps(json.loads(body)) + "\n")
            child.stdin.flush()
            return json.loads(child.stdout.readline())

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--variant", choices=["leaky", "fixed"], required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help="run as the inference worker")
    args = parser.parse_args()
    os.environ["WORKER_VARIANT"] = args.variant
    if args.worker:
        worker()
        return
    port = args.port
    if port == 0:  # a free port, known (and printed) before uvicorn binds it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    print(f"worker-service {args.variant} listening on http://127.0.0.1:{port}", flush=True)
    uvicorn.run(api(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
