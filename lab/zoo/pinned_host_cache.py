"""Pinned host memory kept by CUDA's host caching allocator, for inputs of many sizes.

CUDA only: on a machine without a CUDA device the service says "CUDA not available" and its
test is device-only (``#[ignore = "needs a GPU"]``, run by the device check).

The cause, for a learner: ``tensor.pin_memory()`` copies a tensor into page-locked host memory
so that the copy to the GPU can run asynchronously. PyTorch takes that memory from its CUDA
host caching allocator, which keeps every block it has handed out for reuse and never gives it
back to the operating system; blocks are rounded up to a power of two. A service that pins
each request's input, of a size that changes from request to request, grows a pool of pinned
blocks that outlives the requests: every tensor is freed, the memory is not. No Python object
holds it (the census sees nothing) and glibc's ``malloc_trim`` cannot return it.

Report reproduced (read for this entry): vllm-project/vllm PR #48165 "[Bugfix] Opt out of
pinned host memory for shm multimodal decode": a worker's private memory grew by 324 MB in 5
minutes, all from ``pin_memory()`` copies of variable-sized multimodal inputs; the worker kept
1,088 pinned buffers for at most 16 sequences in flight, "cached by the allocator, not held by
live requests". The fix there: a pageable ``clone()`` instead of ``pin_memory()``.

The service: each request's body names a number of rows (16 to 3,787 of 1,024 floats, a new
count per request, so 64 kB to 15.5 MB, spanning nine power-of-two sizes); the input is built on
the host and sent to the GPU for a linear layer. Leaky: pinned, then copied
(``pin_memory()``, ``non_blocking=True``), as the report's decoder did. Fixed: copied from
pageable memory (no pinning), the PR's fix.

PREDICTION (written before any measurement; NOT MEASURED: no GPU was lent to the task that
wrote it):
- Instrument: the scan from outside (RSS of the process: pinned pages are resident); the
  census sees nothing.
- Leaky, under the small pod's budget (1 GiB, one request a second, a day): on a service that
  answers one request at a time the pool should grow per new size *class* and then hold (one
  block per power of two, reused once its copy's event completes): a plateau of some tens of
  MB, PASS. The report's unbounded growth came with many requests in flight; if blocks are not
  reused fast enough here either, the scan reads a leak and the budget FAILs. This is the
  question the entry is for.
- Fixed: PASS, flat (pageable buffers are freed to malloc, and trimmed back).
- Axis: per new input (size class), bounded by the classes in use. Owner: native (the CUDA
  host caching allocator).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant, require_cuda, rows_body, rows_of

FEATURES, MOST_ROWS = 1024, 4096

ENTRY = Entry(
    name="pinned_host_cache",
    title="Pinned host memory kept by CUDA's host caching allocator",
    reports=("vllm-project/vllm#48165",),
    symptom="A worker's host memory grows with pin_memory() copies of variable-sized inputs: "
    "the CUDA host caching allocator keeps every pinned block; a pageable copy stays flat.",
    instruments=("scan",),
    below_python=True,
    must_pass=False,
    # Predicted: bounded by the size classes on a one-at-a-time service (see PREDICTION).
    leaky=Expect(verdict="fail", axis="bounded", owner="native"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    known_miss_since="78fb553",
    known_miss="predicted before any GPU run: on a one-at-a-time service the pinned pool is "
    "expected to hold at its size classes (a plateau); the report's growth came with many "
    "requests in flight",
    budget=("--capacity", "1GiB", "--rate", "1", "--fail-if-oom-within", "1d"),
    predicted_in="78fb553",
    predicted_after_measuring=False,
    inputs="shapes",
    requests=400,
    warmup=20,
    # 16 + 9·i rows: a new count per request, 16 to 3,787 rows over 20 + 400 requests.
    body=lambda i: rows_body(i, min(16 + 9 * i, MOST_ROWS)),
    device="cuda",
)


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import Body, FastAPI, HTTPException

    require_cuda(ENTRY.name)
    torch.manual_seed(0)
    layer = torch.nn.Linear(FEATURES, 16).cuda().eval()
    app = FastAPI(title=f"pinned_host_cache ({variant})")

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        try:
            rows, seed = rows_of(body, MOST_ROWS)
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from e
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(rows, FEATURES, generator=g)  # decoded on the host
        if variant == "leaky":
            # LEAK(pinned_host_cache): a pinned copy per request; its block goes back to the
            # host caching allocator's pool, never to the OS, rounded up to a power of two.
            x = x.pin_memory().to("cuda", non_blocking=True)
        else:
            # FIX(pinned_host_cache): copied from pageable memory: nothing pinned, nothing kept.
            x = x.to("cuda")
        with torch.inference_mode():
            y = layer(x)
        return {"rows": rows, "mean": float(y.mean())}

    return app
