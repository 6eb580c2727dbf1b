"""The CUDA caching allocator's reserved-but-unallocated memory, under inputs of many sizes.

CUDA only: on a machine without a CUDA device the service says "CUDA not available" and its
test is device-only (``#[ignore = "needs a GPU"]``, run by the device check).

The cause, for a learner: PyTorch's CUDA caching allocator keeps freed blocks *reserved* for
reuse instead of returning them to the driver. A block may be split to serve a smaller
request; the remainder stays free but pinned inside its segment while the smaller tensor
lives. With requests of ever-changing sizes, new largest inputs ask for new segments and the
splits leave holes too small for the next request, so ``memory_reserved()`` (and what
``nvidia-smi`` shows) climbs while ``memory_allocated()`` does not: the out-of-memory message
then says "reserved by PyTorch but unallocated" and suggests
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Expandable segments grow one segment in
place (cuMemMap) instead of adding segments of new sizes; ``max_split_size_mb`` forbids
splitting large blocks.

Reports reproduced (read for this entry):
- pytorch/pytorch PR #96995 "Expandable blocks in allocator": "For programs with changing
  tensor sizes this can be especially helpful to avoid OOMs that happen the first time we see
  a new largest input and would otherwise have to allocate new segments".
- vllm-project/vllm PR #41268: a 270 MiB tensor placed in a cached 530 MiB segment split it,
  leaving a 260 MiB remainder that no later allocation fit and that the tensor pinned;
  ``max_split_size_mb=20`` during loading avoided the OOM.
- pytorch/pytorch#123548 (with PR #193400): with ``max_split_size_mb:128`` *and*
  ``expandable_segments:True`` together, reserved memory grew ~138 MiB a cycle (220 to
  14,060 MiB) while allocated stayed at 66-306 MiB, when a small block stayed alive after
  large ones were freed; either option alone stayed under 500 MiB.

The service: each request's body names a number of rows (a new count per request, 64 to
16,384 rows of 4,096 floats); the service runs two linear layers (4,096 → 8,192 → 4,096) on
it, and keeps one small tensor per request for the last 32 requests (a bounded history, as a
real service keeps recent outputs), so short-lived large blocks are freed around long-lived
small ones, the pattern that fences the holes. Leaky: the default allocator. Fixed:
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``Entry.env``, read when CUDA starts).

PREDICTION (written before any measurement; NOT MEASURED: no GPU was lent to the task that
wrote it):
- Instrument: the scan with ``--gpu`` (NVML: the process's GPU memory, which is what reserved
  memory costs); the exact ``torch.cuda.memory_allocated()`` stays flat, and the agent's CUDA
  snapshot (``/debug/leaklab``) would show the reserved-but-unallocated bytes per segment.
- Leaky, under the budget below (the GPU's memory, one request a second, a day): reserved
  memory climbs with each new largest input and with the holes, up to a few times the
  largest request's working set (16,384 × 8,192 × 4 B = 512 MiB for the hidden layer), then
  holds: a plateau, PASS, with a rise of a few GB that a 16 GB card would not survive; a
  window inside the climb reads a leak and FAILs.
- Fixed: PASS, a plateau near one working set.
- Axis: per new input (new largest size), bounded by the device. Owner: native (the caching
  allocator's reserved segments).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
from collections import deque
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant, require_cuda, rows_body, rows_of

FEATURES, HIDDEN, MOST_ROWS, KEPT = 4096, 8192, 16384, 32

ENTRY = Entry(
    name="cuda_reserved_slack",
    title="The caching allocator's reserved-but-unallocated memory under varying sizes",
    reports=(
        "pytorch/pytorch#96995",
        "vllm-project/vllm#41268",
        "pytorch/pytorch#123548",
    ),
    symptom="GPU memory reserved by PyTorch climbs with inputs of changing sizes while the "
    "memory of live tensors does not; expandable_segments keeps one growing segment.",
    instruments=("scan",),
    below_python=True,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="bounded", owner="native"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    known_miss_since="78fb553",
    known_miss="predicted before any GPU run: reserved memory is expected to climb to a bound "
    "(a plateau) rather than without end",
    # --gpu: the scan reads NVML, the process's GPU memory, against the card's capacity.
    budget=("--gpu", "--rate", "1", "--fail-if-oom-within", "1d"),
    predicted_in="78fb553",
    predicted_after_measuring=False,
    inputs="shapes",
    requests=300,
    warmup=20,
    # A new count per request, spread over 64 to 16,384 rows (53·i mod 16,321, a permutation).
    body=lambda i: rows_body(i, 64 + 53 * i % (MOST_ROWS - 63)),
    # FIX(cuda_reserved_slack): one segment that grows in place, set before CUDA starts.
    env={"fixed": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
    # Torch loads after the knob, in each variant's process: whether
    # PYTORCH_CUDA_ALLOC_CONF is read when torch loads or when CUDA first
    # allocates was not measured (no GPU here).
    preload=(),
    device="cuda",
)


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
    recent: deque[Any] = deque(maxlen=KEPT)
    app = FastAPI(title=f"cuda_reserved_slack ({variant})")

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        try:
            rows, seed = rows_of(body, MOST_ROWS)
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from e
        g = torch.Generator(device="cuda").manual_seed(seed)
        with torch.inference_mode():
            # LEAK(cuda_reserved_slack): blocks of a new size each request, freed around the
            # small ones kept below: the default allocator adds segments and splits them, and
            # keeps all of it reserved.
            # FIX(cuda_reserved_slack): the same code; Entry.env sets expandable_segments, so
            # the allocator grows one segment in place instead.
            y = net(torch.randn(rows, FEATURES, device="cuda", generator=g))
            recent.append(y[0].clone())  # a small long-lived block, fencing the holes
        return {
            "rows": rows,
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
        }

    return app
