"""The Python twin of leaklab's service: the same model, the same variants, FastAPI + PyTorch.

It is what the lab's users would otherwise run (the reference scenario is a FastAPI container),
so it serves as the peer in `cargo xtask bench` and as the cross-check of the leaks: its leaky
variants must keep about the same bytes per request as the Rust ones, on the probe both share
(glibc's malloc heap, read with mallinfo2; PyTorch's CPU tensors are malloc'ed).

    python twin_service.py --variant refs-leaky --weights default.safetensors --port 8001

The weights come from the Rust model (`leaklab-service export-weights`), so both compute one
function. Each leaky line is marked LEAK(cause), its fixed twin FIX(cause), as in crates/service.

Like a real service it exposes Prometheus metrics at /metrics (prometheus_client's process
collector: process_resident_memory_bytes; on CUDA also torch.cuda.memory_allocated() and
memory_reserved() as gauges), which is what `leaklab scan --metrics` reads from outside. It
mounts leaklab's agent (`leaklab.asgi.LeaklabDebug`) as a user would: the tensor census at
/debug/leaklab/tensors names what keeps the leaky variants' tensors (the pipeline lives in
`app.state.pipeline`: graph-leaky's `.acc`, refs-leaky's `.history`, cache-leaky's `.cache`), and
with `--device cuda --record-memory-history N` PyTorch's own snapshot pickle is at
/debug/leaklab/snapshot, for `leaklab snapshot explain`.
"""

import argparse
import collections
import ctypes
import json
import os
import socket
import sys
import threading
import time

import prometheus_client
import pydantic_core
import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, ValidationError
from safetensors.torch import load_file

try:
    from leaklab.asgi import LeaklabDebug
except ImportError:  # run from the source tree without the wheel installed: its package is here
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "cli", "python"))
    from leaklab.asgi import LeaklabDebug

VARIANTS = {
    # name: (graph, refs, cache) with None meaning "feature absent", as in variant.rs
    "graph-leaky": ("leaky", None, None),
    "graph-fixed": ("fixed", None, None),
    "refs-leaky": ("fixed", "leaky", None),
    "refs-fixed": ("fixed", "fixed", None),
    "cache-leaky": ("fixed", None, "leaky"),
    "cache-fixed": ("fixed", None, "fixed"),
    "baseline": ("fixed", "fixed", "fixed"),
    "seed": ("leaky", "leaky", "leaky"),
}


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = MallInfo2


def heap_bytes():
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_model(weights_path):
    with open(weights_path + ".json") as f:
        config = json.load(f)
    tensors = load_file(weights_path)
    layers = []
    for i in range(config["depth"] + 1):
        fan_in = config["input"] if i == 0 else config["hidden"]
        fan_out = config["output"] if i == config["depth"] else config["hidden"]
        linear = torch.nn.Linear(fan_in, fan_out)
        linear.weight.data.copy_(tensors[f"l{i}.weight"])
        linear.bias.data.copy_(tensors[f"l{i}.bias"])
        layers.append(linear)
        if i < config["depth"]:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers), config


class Pipeline:
    def __init__(self, variant, model, config, cache_bytes, device="cpu"):
        self.graph, self.refs, self.cache_mode = VARIANTS[variant]
        self.model, self.config, self.device = model.to(device), config, device
        self.acc, self.total, self.count = None, 0.0, 0
        self.history = [] if self.refs == "leaky" else collections.deque(maxlen=1024)
        self.cache = {} if self.cache_mode == "leaky" else collections.OrderedDict()
        self.cache_bytes, self.cache_capacity = 0, cache_bytes
        self.requests = 0

    def preprocess(self, inputs):
        key = hash(tuple(map(tuple, inputs)))
        if self.cache_mode is not None and key in self.cache:
            if self.cache_mode == "fixed":
                self.cache.move_to_end(key)
            return self.cache[key], True
        raw = torch.tensor(inputs, dtype=torch.float32, device=self.device)
        x = (raw - raw.mean(-1, keepdim=True)) / (raw.std(-1, unbiased=False, keepdim=True) + 1e-6)
        if self.cache_mode == "leaky":
            self.cache[key] = x  # LEAK(cache): nothing ever leaves this dict
        elif self.cache_mode == "fixed":
            size = x.numel() * x.element_size()
            if size <= self.cache_capacity:
                self.cache[key] = x
                self.cache_bytes += size
                while self.cache_bytes > self.cache_capacity:  # FIX(cache): evict to the byte bound
                    _, old = self.cache.popitem(last=False)
                    self.cache_bytes -= old.numel() * old.element_size()
        return x, False

    def forward(self, x):
        if self.graph == "leaky":
            return self.model(x)  # LEAK(graph): autograd records the graph
        with torch.inference_mode():  # FIX(graph): nothing recorded, inference tensors out
            return self.model(x)

    def telemetry(self, y):
        if self.graph == "leaky":
            mean = y.mean()
            self.acc = mean if self.acc is None else self.acc + mean  # LEAK(graph): a tensor statistic chains every graph
        else:
            self.total += y.mean().item()  # FIX(graph): a float
        self.count += 1
        if self.refs == "leaky":
            self.history.append(y)  # LEAK(refs): the output tensor, kept forever
        elif self.refs == "fixed":
            self.history.append(y.detach().cpu().abs().max().item())  # FIX(refs): a number, bounded

    def infer(self, inputs):
        x, cached = self.preprocess(inputs)
        y = self.forward(x)
        outputs = y.detach().cpu().tolist()
        self.telemetry(y)
        self.requests += 1
        return outputs, cached


class InferRequest(BaseModel):
    inputs: list[list[float]]


class TorchCudaCollector:
    """torch.cuda.memory_allocated() and memory_reserved() as gauges, read at each scrape: what
    a service that watches its GPU memory exports."""

    def collect(self):
        if not torch.cuda.is_available():
            return
        allocated = GaugeMetricFamily("torch_cuda_memory_allocated_bytes", "Bytes held by live CUDA tensors")
        reserved = GaugeMetricFamily("torch_cuda_memory_reserved_bytes", "Bytes the CUDA caching allocator holds")
        allocated.add_metric([], torch.cuda.memory_allocated())
        reserved.add_metric([], torch.cuda.memory_reserved())
        yield allocated
        yield reserved


def make_app(pipeline, variant, sample_capacity=200_000, record_memory_history=0):
    app = FastAPI()
    # Where a FastAPI service keeps what it loads at start-up; the census names the leaks from it.
    app.state.pipeline = pipeline
    app.add_middleware(LeaklabDebug, record_memory_history=record_memory_history)
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.ProcessCollector(registry=registry)
    registry.register(TorchCudaCollector())
    served = prometheus_client.Counter("twin_requests", "Requests served", registry=registry)
    lock = threading.Lock()
    samples = collections.deque(maxlen=sample_capacity)
    features = pipeline.config["input"]

    def infer_locked(body, request):
        if not body.inputs or any(len(row) != features for row in body.inputs):
            raise HTTPException(status_code=422, detail=f"every row needs {features} features")
        pipeline = request.app.state.pipeline
        with lock:
            started = time.perf_counter()
            outputs, cached = pipeline.infer(body.inputs)
            latency_us = int((time.perf_counter() - started) * 1e6)
            # The same JSON as the Rust service's RequestSample; the allocator fields are 0
            # because PyTorch exposes no CPU allocator statistics: compare on heap_bytes.
            samples.append({
                "request": pipeline.requests, "latency_us": latency_us,
                "stage_live_bytes": {"preprocess": 0, "forward": 0, "postprocess": 0, "telemetry": 0},
                "memory": {"cpu": {"live_bytes": 0, "peak_bytes": 0, "live_blocks": 0, "alloc_count": 0, "free_count": 0,
                                   "alloc_bytes_total": 0},
                           "rss_bytes": rss_bytes(), "heap_bytes": heap_bytes(), "cuda": None, "nvml": None},
            })
            served.inc()
            return {"request": pipeline.requests, "variant": variant, "cached": cached, "outputs": outputs}

    # The body read and checked by pydantic-core's own JSON parser, the answer written by its
    # writer: FastAPI's way (json.loads, then the validation of 4,096 Python floats; the answer
    # through jsonable_encoder, or json.dumps) cost 1.25 and 2.20 ms of CPU a request against
    # 0.16 and 0.27 ms (8 × 512 floats each way, 300 calls, 2026-12-06); the same JSON either way.
    # The work on the thread pool, as a sync route's, the answer written on the event loop: written
    # on the worker thread, the bench's heap reading of graph-leaky rose from 89.0 to 90.2 kB.
    request_schema = {"content": {"application/json": {"schema": InferRequest.model_json_schema()}}, "required": True}

    @app.post("/v1/infer", openapi_extra={"requestBody": request_schema})
    async def infer(request: Request):
        try:
            body = InferRequest.model_validate_json(await request.body())
        except ValidationError as e:
            # FastAPI's 422, its errors placed under "body" as its own validation places them.
            errors = [{**err, "loc": ["body", *err["loc"]]} for err in json.loads(e.json(include_url=False))]
            raise HTTPException(status_code=422, detail=errors) from e
        answer = await run_in_threadpool(infer_locked, body, request)
        return Response(pydantic_core.to_json(answer), media_type="application/json")

    @app.get("/metrics")
    def metrics():
        return Response(prometheus_client.generate_latest(registry), media_type=prometheus_client.CONTENT_TYPE_LATEST)

    @app.get("/debug/memory/samples")
    def debug_samples(since: int = 0):
        with lock:
            return [s for s in samples if s["request"] > since]

    @app.get("/healthz")
    def healthz():
        return "ok"

    return app


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    parser.add_argument("--weights", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--cache-bytes", type=int, default=None)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--record-memory-history", type=int, default=0, metavar="N",
                        help="on CUDA: leaklab's agent records the allocator's last N events with Python stacks, "
                             "served at /debug/leaklab/snapshot")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA not available: no CUDA device is visible to this process")
    if args.record_memory_history and args.device != "cuda":
        parser.error("--record-memory-history records the CUDA allocator: use it with --device cuda")
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model, config = build_model(args.weights)
    cache_bytes = args.cache_bytes or 32 * 4 * config["batch"] * config["input"]
    app = make_app(Pipeline(args.variant, model, config, cache_bytes, args.device), args.variant,
                   record_memory_history=args.record_memory_history)
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and without it each answer waited ~40 ms for Nagle's delayed ACK (the zoo measured
    # 48 ms a request before, 2.4 ms after).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(2048)  # accept into the backlog from now on, before uvicorn starts serving
    host, port = sock.getsockname()
    # The lab driver reads this line, as it does the Rust service's.
    print(f"leaklab-twin {args.variant} listening on http://{host}:{port}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
