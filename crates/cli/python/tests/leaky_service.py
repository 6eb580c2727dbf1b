"""A FastAPI + PyTorch service that keeps tensors in every way the census has a name for.

Each ``POST /leak/{kind}`` runs the model on a fresh input and keeps the output (or, for
``graph``, the autograd graph) in one kind of holder, exactly one tensor of ``OUT_BYTES`` per
request; ``/keep/bounded`` keeps it in a bounded deque, which must not be reported as growing.
The tests import it as ``leaky_service``, so the holders' names start with that module name.
"""

from __future__ import annotations

import collections
import logging
import logging.handlers
import queue
import threading
from typing import Any, ClassVar

import torch
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse
from leaklab.asgi import LeaklabDebug

ROWS, FEATURES, HIDDEN = 4, 64, 128
OUT_BYTES = ROWS * FEATURES * 4  # one float32 output: 1,024 bytes
# What the accumulated statistic's graph saves per request beside the weights: the input
# (AddmmBackward0's mat1, 4 x 64 floats) and the hidden activation (ReluBackward0's result,
# 4 x 128 floats, which the second AddmmBackward0 saves too: one storage).
GRAPH_SAVED_BYTES = ROWS * FEATURES * 4 + ROWS * HIDDEN * 4
# New nodes per request: AddmmBackward0 and TBackward0 per layer, ReluBackward0, MeanBackward0,
# AddBackward0 (the AccumulateGrad nodes of the weights are shared by every request).
GRAPH_NODES = 7

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, FEATURES))

HISTORY: list[torch.Tensor] = []  # module global
RECENT: collections.deque[torch.Tensor] = collections.deque(maxlen=8)  # bounded
FUTURES: list[Any] = []  # results handed to C++ (torch futures): held from native code


class Recorder:
    buffer: ClassVar[list[torch.Tensor]] = []  # class attribute


def build_handler() -> Any:
    outputs: list[torch.Tensor] = []

    def handle(y: torch.Tensor) -> None:
        outputs.append(y)  # closure cell

    return handle


HANDLE = build_handler()


def make_hook(x: torch.Tensor) -> Any:
    def hook(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        assert output.shape == x.shape  # closure cell: the hook keeps the request's tensor

    return hook


AUDIT = logging.getLogger("leaky_service.audit")
AUDIT.addHandler(logging.handlers.MemoryHandler(capacity=10**9, flushLevel=logging.CRITICAL + 1))
AUDIT.setLevel(logging.INFO)
AUDIT.propagate = False


class Pipeline:
    def __init__(self) -> None:
        self.acc: torch.Tensor | None = None

    def track(self, y: torch.Tensor) -> None:
        m = y.mean()
        self.acc = m if self.acc is None else self.acc + m  # a tensor statistic chains every graph


PIPELINE = Pipeline()


class Node:
    """Made into a reference cycle per request: garbage the collector has not freed yet."""

    t: torch.Tensor
    me: Node


INBOX: queue.SimpleQueue[torch.Tensor | None] = queue.SimpleQueue()
BATCHED = threading.Semaphore(0)


def batcher_loop() -> None:
    pending: list[torch.Tensor] = []  # a thread's local, kept while the thread waits
    while True:
        item = INBOX.get()
        if item is None:
            return
        pending.append(item)
        del item
        BATCHED.release()


def start_batcher() -> threading.Thread:
    thread = threading.Thread(target=batcher_loop, name="batcher", daemon=True)
    thread.start()
    return thread


def forward(seed: int, grad: bool = False) -> torch.Tensor:
    x = torch.randn(ROWS, FEATURES, generator=torch.Generator().manual_seed(seed))
    if grad:
        return MODEL(x)  # a graph is recorded: the weights require grad
    with torch.inference_mode():
        return MODEL(x)


app = FastAPI()
app.state.responses = []  # Starlette's State
app.state.model = torch.nn.Sequential(
    torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, FEATURES)
)
app.add_middleware(LeaklabDebug)


@app.post("/leak/{kind}")
def leak(kind: str, seed: int, request: Request) -> dict[str, str]:
    y = forward(seed, grad=kind == "graph")
    if kind == "history":
        HISTORY.append(y)
    elif kind == "state":
        request.app.state.responses.append(y)
    elif kind == "closure":
        HANDLE(y)
    elif kind == "hook":
        # A forward hook registered per request, its handle dropped: never removed.
        request.app.state.model[2].register_forward_hook(make_hook(y))
    elif kind == "class":
        Recorder.buffer.append(y)
    elif kind == "log":
        AUDIT.info("output %s", y)
    elif kind == "thread":
        INBOX.put(y)
    elif kind == "cycle":
        node = Node()
        node.me, node.t = node, y
    elif kind == "native":
        future = torch.futures.Future()
        future.set_result(y)
        FUTURES.append(future)
    elif kind == "graph":
        PIPELINE.track(y)
    elif kind == "bounded":
        RECENT.append(y)
    else:
        raise HTTPException(404, f"no kind {kind}")
    return {"kept": kind}


@app.get("/stream")
def stream(chunks: int = 3) -> StreamingResponse:
    return StreamingResponse((f"chunk {i}\n".encode() for i in range(chunks)), media_type="text/plain")
