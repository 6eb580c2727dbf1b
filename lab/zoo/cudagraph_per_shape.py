"""CUDA graphs captured per input shape: a graph, and its memory, for every new size.

CUDA only: on a machine without a CUDA device the service says "CUDA not available" and its
test is device-only (``#[ignore = "needs a GPU"]``, run by the device check).

The cause, for a learner: a CUDA graph replays a recorded sequence of kernels with no Python
in between, which is why services capture their model once and replay it. A graph is recorded
for one exact shape, with static input and output buffers and a memory pool of its own for
its intermediates, all kept for as long as the graph is. A service that captures a graph for
every new input size it sees keeps one set per size: GPU memory grows with each size not seen
before and never stops while new sizes come. ``torch.compile(mode="reduce-overhead")`` does
the same on its own with dynamic shapes. The fix is to capture a few sizes (pad each batch up
to the next one, as vLLM captures a list of batch sizes) with one shared pool.

Reports reproduced (read for this entry):
- pytorch/pytorch#119640 "If dynamic shapes runtime CUDA graphs never quiesces, should loudly
  warn": PyTorch supports dynamic shapes with CUDA graphs "by CUDA graphing every distinct size
  we observe at runtime"; with sizes from 1 to 10,000 "that is far too many CUDA graphs"; a
  comment asks whether one should pad to a fixed set of shapes.
- pytorch/pytorch PR #188913: cudagraph trees record one graph per distinct dynamic-shape key
  with no upper bound, "while every recorded graph also retains its own pool memory"; it adds
  ``triton.cudagraph_max_recorded_sizes`` to cap the sizes recorded.
- pytorch/pytorch#128424 "torch.compile with reduce-overhead: very long compile time + GPU
  memory continuously to grow" (its title; the thread was not read further).

The service: an MLP (1,024 → 4,096 → 1,024) whose forward is captured with
``torch.cuda.graph``; each request's body names a batch of 1 to 1,024 rows, a new count per
request. Leaky: a graph captured per distinct row count, each with its own pool (the default),
kept in a dict. Fixed: rows padded up to the next power of two (eleven sizes at most), one
graph each, sharing one pool (``torch.cuda.graph_pool_handle()``), the output cropped.

PREDICTION (written before any measurement; NOT MEASURED: no GPU was lent to the task that
wrote it):
- Instrument: the scan with ``--gpu`` (NVML: the process's GPU memory); the agent's census
  sees the graphs' static buffers as tensors held by the service's dict.
- Leaky, under the budget below (the GPU's memory, one request a second, a day): FAIL, a leak
  of at least a graph's buffers a request (input, hidden and output at the request's size:
  up to 1,024 × (1,024 + 4,096 + 1,024) × 4 B = 24 MiB, ~12 MiB on average) while new sizes
  come, which at one a second fills an 80 GB card in about two hours.
- Fixed: PASS, flat once the eleven sizes are captured (within the warm-up for the smaller
  ones; the largest pools are shared).
- Axis: per new input (size). Owner: python (the dict of graphs holds them), native pools.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant, require_cuda, rows_body, rows_of

FEATURES, HIDDEN, MOST_ROWS = 1024, 4096, 1024

ENTRY = Entry(
    name="cudagraph_per_shape",
    title="CUDA graphs captured per input shape",
    reports=(
        "pytorch/pytorch#119640",
        "pytorch/pytorch#188913",
        "pytorch/pytorch#128424",
    ),
    symptom="A service that captures a CUDA graph for every new batch size grows its GPU "
    "memory with each size; capturing a few padded sizes with a shared pool holds it.",
    instruments=("scan",),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-new-input", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    # --gpu: the scan reads NVML, the process's GPU memory, against the card's capacity.
    budget=("--gpu", "--rate", "1", "--fail-if-oom-within", "1d"),
    predicted_in="78fb553",
    predicted_after_measuring=False,
    inputs="shapes",
    requests=300,
    warmup=20,
    # A new count per request: 1 + (337·i mod 1,024), a permutation of 1 to 1,024.
    body=lambda i: rows_body(i, 1 + 337 * i % MOST_ROWS),
    device="cuda",
)


def bucket(rows: int) -> int:
    """The padded batch: the next power of two."""
    return 1 << (rows - 1).bit_length()


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import Body, FastAPI, HTTPException

    require_cuda(ENTRY.name)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, FEATURES),
    )
    net = net.cuda().eval()
    graphs: dict[int, tuple[Any, Any, Any]] = {}
    pool = torch.cuda.graph_pool_handle()
    app = FastAPI(title=f"cudagraph_per_shape ({variant})")

    def graph_for(rows: int, shared: Any) -> tuple[Any, Any, Any]:
        """The graph of `rows` rows with its static input and output, captured once."""
        if rows not in graphs:
            static_in = torch.zeros(rows, FEATURES, device="cuda")
            with torch.inference_mode():
                net(static_in)  # warm the kernels up outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=shared):
                    static_out = net(static_in)
            graphs[rows] = (graph, static_in, static_out)
        return graphs[rows]

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        try:
            rows, seed = rows_of(body, MOST_ROWS)
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from e
        x = torch.randn(rows, FEATURES, generator=torch.Generator().manual_seed(seed))
        if variant == "leaky":
            # LEAK(cudagraph_per_shape): a graph per distinct batch size, each with buffers
            # and a private pool at that size, all kept in `graphs` for good.
            graph, static_in, static_out = graph_for(rows, None)
            static_in.copy_(x)
        else:
            # FIX(cudagraph_per_shape): pad to the next power of two (eleven graphs at most),
            # all in one shared pool; the padding rows are zeros, the output cropped below.
            graph, static_in, static_out = graph_for(bucket(rows), pool)
            static_in.zero_()
            static_in[:rows].copy_(x)
        graph.replay()
        return {"rows": rows, "mean": float(static_out[:rows].mean())}

    return app
