"""cuDNN's per-shape execution-plan cache on CUDA: host memory that follows new input shapes.

CUDA only: on a machine without a CUDA device the service says "CUDA not available" and its
test is device-only (``#[ignore = "needs a GPU"]``, run by the device check).

The cause, for a learner: on a GPU, PyTorch runs a convolution through cuDNN's v8 API, which
builds an *execution plan* for each exact input shape and keeps it in a cache in **host**
memory, so the next request of that shape skips the search. It is ``onednn_cache``'s story one
layer down: the GPU's memory does not move, the process's resident memory climbs with every
shape not seen before, and no Python object holds any of it. The cache is an LRU of
``TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT`` entries, 10,000 by default, which PyTorch's own code
puts at "roughly 2GiB assuming 200KiB per ExecutionPlan" (pytorch/pytorch PR #104369), and it
is kept per thread.

Reports reproduced (read for this entry):
- pytorch/pytorch#104701 "System memory leak when using different input size of
  torch.nn.Conv3d": host RSS grows with the number of distinct conv input shapes, not with
  calls; a 2026 comment traces it to the cuDNN v8 plan cache (``torch.backends.cudnn.enabled
  = False`` removes the shape scaling), bounded by the LRU limit but per thread, and since
  cuDNN 9.10 a thread's cache is not freed when the thread exits.
- pytorch/pytorch#98688 "Memory leak in Conv1d": an NVIDIA engineer reproduced it as cuDNN v8
  execution plans taking more host memory than v7's data, cached per dynamic shape; the LRU of
  PR #104369 followed.

The service: ``onednn_cache``'s 4-conv net on the GPU, fed the same requests (request i an
image of a size no earlier request had), one thread running every request (the event loop's).
Leaky: the default cache (10,000 plans, never full here). Fixed: the cache capped at 64 plans
with ``TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT=64`` (``Entry.env``, read when the first conv runs).

PREDICTION (written before any measurement; NOT MEASURED: no GPU was lent to the task that
wrote it, so the figures below are the reports', not this entry's):
- Instrument: the scan from outside (RSS and anonymous memory of the process); the census
  sees nothing (native host memory); ``--gpu`` would show the GPU flat.
- Leaky, under the small pod's budget (1 GiB, one request a second, a day): FAIL, a leak.
  At ~200 KiB a plan (PR #104369's estimate) and four convs, ~800 kB a new shape: 580 new
  shapes ~460 MB, still climbing (the cap of 10,000 plans is ~2,500 shapes away).
- Fixed (64 plans): PASS, a plateau once 64 plans (16 shapes) are kept.
- Axis: per new input (shape), bounded only by the LRU's limit. Owner: native (cuDNN's plans).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant, require_cuda
from onednn_cache import build_net, image, shape_body

CAP = "64"

ENTRY = Entry(
    name="cudnn_plan_cache",
    title="cuDNN's per-shape execution plans, kept in host memory",
    reports=(
        "pytorch/pytorch#104701",
        "pytorch/pytorch#98688",
        "pytorch/pytorch#104369",
    ),
    symptom="A conv net on a GPU fed inputs of many sizes: the process's host memory grows "
    "with every new shape while GPU memory stays flat; TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT "
    "caps it.",
    instruments=("scan",),
    below_python=True,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-new-input", owner="native"),
    fixed=Expect(verdict="pass", axis="bounded", owner="native"),
    budget=("--capacity", "1GiB", "--rate", "1", "--fail-if-oom-within", "1d"),
    predicted_in="78fb553",
    predicted_after_measuring=False,
    inputs="shapes",
    requests=580,
    warmup=20,
    # FIX(cudnn_plan_cache): the plan cache's capacity, read when the first conv runs.
    env={"fixed": {"TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT": CAP}},
    # Torch loads after the knob, in each variant's process: whether
    # TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT is read when torch loads or when CUDA first
    # allocates was not measured (no GPU here).
    preload=(),
    body=shape_body,
    device="cuda",
)


def make_app(variant: Variant) -> Any:
    import os

    import torch
    from fastapi import Body, FastAPI, HTTPException

    require_cuda(ENTRY.name)
    if (
        variant == "fixed"
        and os.environ.get("TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT") != CAP
    ):
        raise RuntimeError(
            f"the fixed variant needs TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT={CAP} set first"
        )
    net = build_net().cuda()
    app = FastAPI(title=f"cudnn_plan_cache ({variant})")

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        try:
            x = image(body)
        except (TypeError, ValueError) as e:
            raise HTTPException(status_code=422, detail=str(e)) from e
        with torch.inference_mode():
            # LEAK(cudnn_plan_cache): each (H, W) not seen before makes cuDNN build execution
            # plans for the four convs and cache them in host memory, up to 10,000 plans.
            # FIX(cudnn_plan_cache): the same call; Entry.env caps the cache at CAP plans.
            y = net(x.cuda())
        return {"shape": list(y.shape), "mean": float(y.mean())}

    return app
