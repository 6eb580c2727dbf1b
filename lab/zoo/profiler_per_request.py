"""A profiler session per request: its events are garbage the collector frees, late.

The cause, for a learner: ``torch.profiler.profile`` records every operator a block runs, and
``prof.events()`` turns the record into Python objects (one ``FunctionEvent`` per operator, its
children and its parent pointing at each other: reference cycles). A service that profiles each
request to report its own operator times, and drops the profiler afterwards, leaves those
cycles behind: reference counting cannot free them, only the cyclic collector can, and it
reaches objects that survived its younger generations (they were alive while the request ran)
only in a full collection, which CPython runs when the long-lived objects have grown by a
quarter. On a heap the size of torch's that is thousands of requests away: memory climbs in
between, then falls back. A ``gc.collect()`` now and then stops the climb.

Report reproduced (read through the public tracker): pytorch/pytorch#193348 "[Profiler]
Repeated short-lived CUDA profiles steadily increase host RSS; periodic gc.collect() stops
continued growth": on PyTorch 2.11.0+cu130, 1,000 short ``torch.profiler.profile`` contexts with
CUDA activity, each read with ``prof.events()`` and dropped, raised host RSS by about 318 MiB,
still rising at the end; ``gc.collect()`` every 25 contexts prevented the continued growth
after the profiler's first footprint ("delayed collection and/or allocator retention of
profiler event objects rather than CUDA tensor memory"). The zoo's entry profiles the CPU
activity only (no GPU here): what it keeps of the report is the Python side, the events.

The service: a small MLP (64 → 256 → 16) whose every request runs inside
``torch.profiler.profile(activities=[ProfilerActivity.CPU])`` and answers with its slowest
operator's CPU time, read from ``prof.events()``. Leaky: as the report's loop, the collector at
its defaults. Fixed: the report's workaround, ``gc.collect()`` every 25 requests.

PREDICTION (written before any measurement, in the commit that adds this module):
- Not a leak: garbage the collector frees. The scan runs with ``--collect`` (a full collection
  and ``malloc_trim(0)`` before the warm-up and after the judged requests: the question a user
  asks of such a growth).
- Leaky: anonymous memory climbs over the judged requests (tens of kB a request: a few hundred
  FunctionEvents and their dicts), and through the full collections it keeps little of it:
  PASS, axis garbage, owner Python (the census's unreachable cycles; the collector on).
- Declared here, before the run, a limit: where CPython's own full collection falls inside the
  judged requests, the series reads as a plateau or flat and nothing is seen to grow (axis
  none): a miss of the axis, declared, shown as a miss.
- Fixed: PASS, flat or a small sawtooth (a collection every 25 requests). Axis none, owner none.

MEASURED (added after the runs; the prediction above is kept as written, in e6d51b5). The
prediction was wrong on the mechanism, on CPU:
- The zoo's scan, three runs (`leaklab-lab run-lab --zoo --only profiler_per_request`,
  2026-12-07): leaky PASS, +3.78-4.62 kB a request (1.11-1.26 MB over the 250 requests), read
  as the service settling (0.24-0.28 % of its 458 MB, under the 1 % of SETTLED_SHARE): axis
  none, owner none; and through the full collections (`--collect`) it kept 1.06-1.09 MB, all of
  it: not read as garbage either. Fixed PASS, 0.6-5.4 kB a request, plateau.
- A plain loop of the same profile (3,001 requests, RssAnon every 500): with the collector at
  its defaults +8 MB, still rising at the end (~2.7 kB a profile) and not given back by a final
  `gc.collect()`; with `gc.collect()` every 25, +2 MB in the first 500, then flat. So the
  report's workaround holds, and its "allocator retention" too: the events are garbage the
  collector frees, late, and by then the allocator keeps their memory (pymalloc's arenas and
  glibc's heap, fragmented by the long-lived objects made in between).
- The entry's expectation now says what the variant is (pass under its budget: ~2.7-4.6 kB a
  request is 0.23-0.40 GB a day against 0.57 GB of headroom; per request; owner native, the
  allocator's), and the settling reading is declared as the scan's limit (after these runs).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
import gc
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant, batch_body

FEATURES, HIDDEN, OUTPUTS, ROWS = 64, 256, 16, 8
COLLECT_EVERY = 25  # the report's workaround

ENTRY = Entry(
    name="profiler_per_request",
    title="A torch.profiler session per request: its events, garbage freed late",
    reports=("pytorch/pytorch#193348", "pytorch/pytorch#22597"),
    symptom="Short-lived torch.profiler sessions, each read with prof.events() and dropped, "
    "raised host RSS by ~318 MiB over 1,000 on torch 2.11; gc.collect() every 25 stopped it.",
    instruments=("scan", "agent"),
    below_python=False,
    must_pass=True,
    # Predicted (e6d51b5): pass, garbage, python. Measured: the collector frees the events late
    # and the allocator keeps their memory (see MEASURED): per request, native.
    leaky=Expect(verdict="pass", axis="per-request", owner="native"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    known_miss="a growth of a few kB a request on a 458 MB process (0.24-0.28 % of its level "
    "over the judged requests) reads as the service settling (SETTLED_SHARE, 1 % of the level): "
    "axis none; the full collections keep all of it (the allocator's), so not garbage either",
    known_miss_since="b4b4bf5",
    budget=(
        "--capacity",
        "1GiB",
        "--rate",
        "1",
        "--fail-if-oom-within",
        "1d",
        "--collect",
    ),
    predicted_in="e6d51b5",
    predicted_after_measuring=False,
    inputs="same",
    requests=200,
    warmup=50,
    body=lambda i: batch_body(ROWS, FEATURES, 11),
)


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import Body, FastAPI, HTTPException
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUTPUTS),
    ).eval()
    app = FastAPI(title=f"profiler_per_request ({variant})")
    served = 0

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        nonlocal served
        inputs = body.get("inputs") if isinstance(body, dict) else None
        if not isinstance(inputs, list) or not inputs:
            raise HTTPException(
                status_code=422, detail='the body must be {"inputs": [[...]]}'
            )
        # LEAK(profiler_per_request): a profiler per request, its events read and dropped:
        # reference cycles that only a full collection frees.
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
            y = model(torch.tensor(inputs, dtype=torch.float32))
        slowest = max(prof.events(), key=lambda e: e.cpu_time_total)
        served += 1
        if variant == "fixed" and served % COLLECT_EVERY == 0:
            # FIX(profiler_per_request): the report's workaround, a collection every 25.
            gc.collect()
        return {
            "outputs": y.tolist(),
            "slowest": slowest.key,
            "slowest_us": float(slowest.cpu_time_total),
        }

    return app
