"""Reference cycles holding tensors, in a service that disabled the garbage collector.

The cause, for a learner: CPython frees most objects the moment their last reference goes
(reference counting); only objects caught in a *cycle* wait for the cyclic garbage collector.
Services that disable it for steadier latency (``gc.disable()``, or ``gc.freeze()`` and long
thresholds) promise, in the words of Python's docs, that they create no cycles. One object per
request that refers to itself (a handle whose callback is its own bound method) then keeps
everything it holds forever: here a request's hidden activations. With the collector on, the
same code only shows a sawtooth.

Reports reproduced (read through the public tracker):
- meta-pytorch/torchrec PR #1226, "Remove refcycle in SequenceEmbeddingsAwaitable": "the
  reference cycle that points the callback of SequenceEmbeddingsAwaitable back to itself ...
  causes many GPU tensors to stay alive, since this refcycle holds references to Tensor
  objects (preventing them from being reclaimed until a gc collect)", citing Python's docs:
  "when disabling automatic garbage collection, we should ensure that our program removes all
  reference cycles."
- pytorch/pytorch#50185, "CUDACachingAllocator is not GC-aware": dead objects holding tensors
  in a cycle (``self.cycle = self``) count as live memory until a collection; the reporter's
  loop ran out of GPU memory.
- pytorch/pytorch PR #105032 (``warn_tensor_cycles``, the visualizer PyTorch added for cycles
  that hold tensors).

Mechanism through the real path: ``gc.disable()`` at start-up, and per request a ``Pending``
result handle (the awaitable of a two-stage pipeline) whose callback list holds its own bound
method; the handle holds the request's hidden activations (8 x 512 float32, 16,384 bytes).

PREDICTION, written before measuring (budget: --capacity 8GiB --rate 5
--fail-if-oom-within 2d, about 9.9 kB a request):
- instruments: the scan sees a per-request slope of the 16.4 kB of activations plus the
  handle and its cycle (expected 20-70 kB from outside); the agent's census reports the
  tensors as held by an unreachable cycle (garbage that the disabled collector never frees).
- leaky: fail, axis per-request, owner python.
- fixed (the callback no longer refers to the handle: no cycle, the collector still
  disabled): pass, axis none, owner none. Risk noted before measuring: if the web stack
  itself makes a cycle per request, the fixed variant grows too with gc disabled.

MEASURED afterwards (the scan, 400 judged requests after 50, the budget above; six runs
with --agent and two without, 2026-12-05): leaky FAIL 8/8, anonymous memory 16.8 to 33.3 kB a
request, the census naming ``unreachable cycle (awaiting gc): gc_disabled_cycles.Pending.hidden``
at +16.38 kB a request every run; fixed PASS 8/8, 0.00 to 0.05 kB a request (the web stack makes
no cycle per request under uvicorn), no holder grew. The pytest plugin passes the leaky variant:
it collects garbage after every call (lab/zoo/test_zoo_plugin.py).
"""

# No `from __future__ import annotations`: FastAPI must see the request model class itself.
from collections.abc import Callable
from typing import Any

from _zoo import Entry, Expect, Variant, batch_body

ROWS, FEATURES, HIDDEN, OUTPUTS = 8, 64, 512, 16


ENTRY = Entry(
    name="gc_disabled_cycles",
    title="Reference cycles holding tensors, with the garbage collector disabled",
    reports=(
        "meta-pytorch/torchrec#1226",
        "pytorch/pytorch#50185",
        "pytorch/pytorch#105032",
    ),
    symptom=(
        "An awaitable whose callback points back to itself kept many GPU tensors alive until a "
        "gc collect; with automatic collection disabled, never."
    ),
    instruments=("scan", "agent"),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-request", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "8GiB", "--rate", "5", "--fail-if-oom-within", "2d"),
    predicted_in="1195aaa",
    predicted_after_measuring=True,
    inputs="same",
    requests=400,
    warmup=50,
    body=lambda i: batch_body(ROWS, FEATURES, 19),
)


class Pending:
    """The first stage's result, finished by its callbacks when the second stage waits on it."""

    def __init__(
        self, hidden: Any, callbacks: list[Callable[[Any], Any]] | None = None
    ) -> None:
        self.hidden = hidden
        self.callbacks = callbacks if callbacks is not None else []
        self.waited = False

    def mark_waited(self, out: Any) -> Any:
        self.waited = True
        return out

    def wait(self) -> Any:
        out = self.hidden
        for callback in self.callbacks:
            out = callback(out)
        return out


def make_app(variant: Variant) -> Any:
    import gc

    import torch
    from fastapi import FastAPI
    from pydantic import BaseModel

    # The service's latency tuning: no collector pauses (the premise of the cause, both variants).
    gc.disable()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU()
    ).eval()
    head = torch.nn.Linear(HIDDEN, OUTPUTS).eval()

    class Batch(BaseModel):
        inputs: list[list[float]]

    def first_stage(x: torch.Tensor) -> Pending:
        pending = Pending(encoder(x))
        if variant == "leaky":
            # LEAK(gc_disabled_cycles): the callback is the handle's own bound method, so
            # pending -> callbacks -> bound method -> pending: a cycle that only the (disabled)
            # collector could free, with the request's activations inside.
            pending.callbacks.append(pending.mark_waited)
        else:
            # FIX(gc_disabled_cycles): a callback that does not refer back to the handle; the
            # handle dies by reference counting when the request ends.
            pending.callbacks.append(torch.relu)
        return pending

    app = FastAPI()

    @app.post("/predict")
    async def predict(batch: Batch) -> dict[str, Any]:
        x = torch.tensor(batch.inputs)
        with torch.inference_mode():
            pending = first_stage(x)
            y = head(pending.wait())
        return {"outputs": y.tolist(), "gc_enabled": gc.isenabled()}

    return app
