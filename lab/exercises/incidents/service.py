"""The service that is paging: a FastAPI model server whose memory climbs with its traffic.

Its model, its requests and its answers are exercise 6's (``_contract.py``): 8 rows of 64
features in, 8 rows of 16 outputs and the mean output norm so far back. Nobody knows what
keeps the memory. Serve it, find the holder with ``leaklab scan --agent`` (the briefing that
``cargo xtask lab pyincident`` printed has the commands), fix it here, then run
``cargo xtask lab check pyincident``: the check scans it again and verifies its answers.
"""

## The Python incident drill's template (lab/exercises/src/drill/python.rs renders it). A line
## tagged `LEAK(cause) name` is in incident `name`'s service only, its `FIX(cause) name` twin in
## every other one, untagged lines in all of them, and `##` lines (these notes) in none; the
## learner's copy has no tags. Every incident is a cause of the zoo (lab/zoo/<cause>.py), where
## its public reports are cited. The service with every fix in is the reference fix.

# No `from __future__ import annotations`: FastAPI must see the request model class itself.
import collections
import gc
from typing import Any

from _contract import mlp

# Requests whose inputs look unlike the training data, kept for the debug page.
OOD_KEPT = 64  # FIX(exceptions_kept) exceptions: the debug page keeps a bounded number of messages
OOD_LIMIT = 0.5


class OutOfDistribution(Exception):
    """An input unlike the training data: served, and noted for the debug page."""


class Trace:
    """One request's trace: its spans, each pointing back at the trace for its parent id."""

    def __init__(self, x: Any) -> None:
        self.x = x
        self.spans: list[dict[str, Any]] = []

    def span(self, name: str, value: Any) -> None:
        self.spans.append({"name": name, "value": value, "trace": self})


def make_app() -> Any:
    import torch
    from fastapi import FastAPI
    from pydantic import BaseModel

    model = mlp()
    hidden = model[2]
    gc.disable()  # LEAK(gc_disabled_cycles) cycles: the collector off, for steadier latency
    stats: dict[str, Any] = {"served": 0, "total": 0.0}
    ood: list[Any] = []  # LEAK(exceptions_kept) exceptions: every exception kept, with its traceback
    ood: Any = collections.deque(maxlen=OOD_KEPT)  # FIX(exceptions_kept) exceptions: messages only, bounded
    activations: list[float] = []
    handles: list[Any] = []

    class Batch(BaseModel):
        inputs: list[list[float]]

    def check_distribution(x: Any, h: Any) -> None:
        if float(x.abs().max()) > OOD_LIMIT:
            raise OutOfDistribution(f"input beyond ±{OOD_LIMIT}; hidden norm {float(h.norm()):.3f}")

    def infer(x: Any, trace: Trace) -> Any:
        seen: list[Any] = []

        def watch(module: Any, args: Any, out: Any) -> None:
            seen.append(out)

        handle = hidden.register_forward_hook(watch)
        y = model(x)
        handle.remove()  # FIX(forward_hook) hook: the hook removed once the pass is done
        handles.append(handle)  # LEAK(forward_hook) hook: kept to remove later, never removed: each pass adds a hook holding its activations
        h = seen[-1]
        trace.span("hidden", h)
        activations.append(float(h.norm()))
        del activations[:-256]
        try:
            check_distribution(x, h)
        except OutOfDistribution as e:
            ood.append(e)  # LEAK(exceptions_kept) exceptions: the exception, its traceback and every frame's tensors
            ood.append(str(e))  # FIX(exceptions_kept) exceptions: the message, a string
        return y

    app = FastAPI(title="the service that is paging")

    @app.post("/predict")
    def predict(batch: Batch) -> dict[str, Any]:
        with torch.inference_mode():
            x = torch.tensor(batch.inputs)
            trace = Trace(x)
            y = infer(x, trace)
            trace.spans.clear()  # FIX(gc_disabled_cycles) cycles: the trace's cycle broken when the request ends
        stats["served"] += 1
        stats["total"] += float(y.norm())
        return {
            "outputs": y.tolist(),
            "mean_norm": stats["total"] / stats["served"],
        }

    @app.get("/debug/ood")
    def debug_ood() -> dict[str, Any]:
        return {"count": len(ood), "last": [str(e) for e in list(ood)[-5:]]}

    return app
