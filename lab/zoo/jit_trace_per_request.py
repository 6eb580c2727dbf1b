"""``torch.jit.trace`` per request: every trace leaves memory behind after its module is gone.

The cause, for a learner: tracing records the model's operations into a TorchScript graph, owned
by a compilation unit in C++ with a new class type for the traced module. Reports since 2020
find that memory grows with every trace and is not returned when the traced module is dropped
and the collector has run: what the graphs hold (their types, their constants) stays in C++,
where no Python object reaches it. A service that traces per request (to specialise on the
request's batch, or through a library that traces on each call) grows for good.

Reports reproduced (read through their public tracker, all open): pytorch/pytorch#35600
("Increased memory usage in repetitive torch.jit.trace calls": a resnet18 traced in a loop with
``check_trace=False`` under ``no_grad``, RSS 415.8, 456.7, 493.2, 547.8 MB after the first four
traces); pytorch/pytorch#96726 ("Memory not release after jit.trace/freeze": a comment traces
it to constants kept as attributes of the graph, "torch::jit::CompilationUnit holds the graph
and then holds the tensor"); pytorch/pytorch#58109 ("torch.jit.trace memory leak": an MLP
traced 2,000 times and deleted, ``gc.collect()`` every 200, memory printed growing).

The service: ``/predict`` traces its model (a 64 → 256 → 64 MLP, 2 Linear layers, ~133 kB of
weights) on the request's input with ``check_trace=False`` under ``inference_mode``, runs the
traced module once and answers. Fixed: the same model traced once, at start, and the traced
module reused (the request's shape never changes).

PREDICTION (written before any measurement, in the commit that adds this module):
- Instrument: the scan from outside with the agent.
- Growth: what each trace leaves in C++ (a graph of a few dozen nodes, its new class type,
  the constants the graph keeps): a few kB a request at least, up to the weights' 133 kB where
  they are kept as constants (as #35600's figures suggest for resnet18). Leaky, under the budget
  below (1 GiB, 5 requests a second, fail if it runs out within a day: over 2.5 kB a request
  fails): FAIL. Axis per request (the same body every time: every request traces). Owner native:
  no Python object holds what grows (the census sees no tensor gained; the Python trace sees
  little of it).
- Fixed: PASS, flat; axis none, owner none.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant

WIDTH, HIDDEN = 64, 256

ENTRY = Entry(
    name="jit_trace_per_request",
    title="torch.jit.trace per request",
    reports=("pytorch/pytorch#35600", "pytorch/pytorch#96726", "pytorch/pytorch#58109"),
    symptom="Tracing a model again and again grows memory that dropping the traced module "
    "and collecting does not return (a resnet18: +36 to +55 MB a trace over its first four).",
    instruments=("scan", "agent"),
    below_python=True,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-request", owner="native"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "1GiB", "--rate", "5", "--fail-if-oom-within", "1d"),
    predicted_in="67e4fd7",
    predicted_after_measuring=False,
    inputs="same",
    requests=400,
    warmup=50,
    body=lambda i: {"features": [(k % 9) / 9.0 for k in range(WIDTH)]},
)


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import Body, FastAPI, HTTPException

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, WIDTH)
    ).eval()
    example = torch.zeros(1, WIDTH)
    traced_once = None
    if variant == "fixed":
        # FIX(jit_trace_per_request): traced once, at start; every request runs that module.
        with torch.inference_mode():
            traced_once = torch.jit.trace(model, example, check_trace=False)
    app = FastAPI(title=f"jit_trace_per_request ({variant})")

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        features = body.get("features") if isinstance(body, dict) else None
        if not isinstance(features, list) or len(features) != WIDTH:
            raise HTTPException(
                status_code=422,
                detail=f'the body must be {{"features": [{WIDTH} numbers]}}',
            )
        x = torch.tensor([features], dtype=torch.float32)
        with torch.inference_mode():
            if traced_once is None:
                # LEAK(jit_trace_per_request): a new trace per request; dropping it after the
                # call returns what Python holds, not what the compilation unit keeps.
                traced = torch.jit.trace(model, x, check_trace=False)
            else:
                traced = traced_once
            out = traced(x)
        return {"score": float(out.sum())}

    return app
