"""``no_grad()`` around a hop to a thread pool: the worker thread records graphs.

The cause, for a learner: ``torch.no_grad()`` (and ``inference_mode()``) set a flag on the
*calling thread*. ``with torch.no_grad(): await run_in_threadpool(model, x)`` looks safe, but
the model runs on a worker thread whose flag is still "record": its output carries a
``grad_fn`` and the graph saves every layer's input for a backward pass that never comes.
Anything that keeps a tensor derived from that output keeps the graph: here a running drift
monitor, ``total = total + y.norm()``, chains every request's graph to the next.

Reports reproduced (read through the public tracker):
- kyutai-labs/pocket-tts PR #16, "Fix memory leak by using no_grad in all threads":
  "`torch.no_grad` is thread local, I now run the autoregressive generation in a separate
  thread ... and forgot to add `torch.no_grad` to the function inside this thread."
- dotnet/TorchSharp#1445, "Inference leaks GPU memory in multi-threaded program": the same
  Linear layer run from ``Array.Parallel.iter`` kept 309 MiB of GPU memory where the
  single-threaded loop gave it back; the answer was ``torch.inference_mode()`` in the workers.

Mechanism through the real path: FastAPI/Starlette's ``run_in_threadpool`` (anyio's worker
threads) around an MLP whose weights require grad (as loaded models' do), under ``no_grad`` on
the event-loop thread.

PREDICTION, written before measuring (budget: --capacity 8GiB --rate 5
--fail-if-oom-within 2d, about 9.9 kB a request):
- instruments: the scan sees a per-request slope of the graph's saved tensors (input 8 x 64,
  two hidden activations 8 x 512 and the output: about 35 kB of storage, expected 35-80 kB
  from outside); the agent's census names the monitor (``app.state.monitor``) with growing
  autograd graph nodes and saved bytes.
- leaky: fail, axis per-request, owner python.
- fixed (``torch.inference_mode()`` inside the worker function): pass, axis none, owner none.

MEASURED afterwards (the scan, 400 judged requests after 50, the budget above; six runs
with --agent and two without, 2026-12-05): leaky FAIL 8/8, anonymous memory 68.3 to 70.7 kB a
request, the census naming ``app.state.monitor.total`` at +35.33 kB a request of graph-saved
bytes (+10 autograd nodes a request) every run; fixed PASS 8/8, 0.01 to 0.16 kB a request, no
holder grew.
The pytest plugin's leak_check fails it too (+35,332 B of tensors a call;
lab/zoo/test_zoo_plugin.py).
"""

# No `from __future__ import annotations`: FastAPI must see the request model class itself.
from typing import Any

from _zoo import Entry, Expect, Variant, batch_body

ROWS, FEATURES, HIDDEN, OUTPUTS = 8, 64, 512, 16


ENTRY = Entry(
    name="nograd_threadpool",
    title="no_grad() around a hop to a thread pool: the worker records graphs",
    reports=("kyutai-labs/pocket-tts#16", "dotnet/TorchSharp#1445"),
    symptom=(
        "A memory leak once generation moved to another thread: torch.no_grad is thread-local "
        "and the function inside the thread ran without it."
    ),
    # "plugin" added after measuring: leak_check fails the leaky variant too.
    instruments=("scan", "agent", "plugin"),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-request", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "8GiB", "--rate", "5", "--fail-if-oom-within", "2d"),
    predicted_in="1195aaa",
    predicted_after_measuring=True,
    inputs="same",
    # Judged requests halved from 400 for CI's CPU (2026-12-06). Ten runs each on a loaded
    # machine (load 13-17), through the zoo's driver: at 200, every verdict, axis and owner as
    # predicted; the leak 71.0-71.1 kB a request (8 GiB gone in 7 h at 5 a second, the budget
    # 2 d), the fix 0.03-0.21 kB (axis none); at 400, 71.0-71.1 and 0.00-0.12 kB.
    requests=200,
    warmup=50,
    body=lambda i: batch_body(ROWS, FEATURES, 11),
)


class Monitor:
    """A running sum of output norms, for a drift dashboard."""

    def __init__(self) -> None:
        self.total: Any = 0.0
        self.count = 0


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import FastAPI
    from pydantic import BaseModel
    from starlette.concurrency import run_in_threadpool

    torch.set_num_threads(1)
    torch.manual_seed(0)
    # Weights that require grad, as any loaded nn.Module's parameters do by default.
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUTPUTS),
    ).eval()

    class Batch(BaseModel):
        inputs: list[list[float]]

    def infer(x: torch.Tensor) -> torch.Tensor:
        # FIX(nograd_threadpool): set the mode on the thread that runs the model.
        with torch.inference_mode():
            y: torch.Tensor = model(x)
        return y

    app = FastAPI()
    app.state.monitor = Monitor()

    @app.post("/predict")
    async def predict(batch: Batch) -> dict[str, Any]:
        x = torch.tensor(batch.inputs)
        monitor: Monitor = app.state.monitor
        if variant == "leaky":
            with torch.no_grad():
                # LEAK(nograd_threadpool): no_grad is set on this (event-loop) thread only; the
                # worker records the graph, and the monitor's running total keeps every one.
                y = await run_in_threadpool(model, x)
        else:
            y = await run_in_threadpool(infer, x)
        monitor.total = monitor.total + y.norm()
        monitor.count += 1
        return {
            "outputs": y.detach().tolist(),
            "mean_norm": float(monitor.total.detach()) / monitor.count,
        }

    return app
