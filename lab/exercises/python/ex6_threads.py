"""Exercise 6: ``no_grad()`` around a hop to a thread pool (grad mode is thread-local).

The service runs its model on Starlette's thread pool, so as not to block the event loop, and
keeps a running sum of the outputs' norms for a drift dashboard. ``torch.no_grad()`` is set
around the hop, on the event loop's thread; the model runs on a worker thread.

Fix it so that memory stops growing per request and every answer (and the running mean) stays
the same. ``cargo xtask lab check 6`` checks both. The zoo's entry ``nograd_threadpool``
(lab/zoo/, docs/zoo.md) tells the cause.
"""

# No `from __future__ import annotations`: FastAPI must see the request model class itself.
from typing import Any

from _contract import mlp


def make_app() -> Any:
    import torch
    from fastapi import FastAPI
    from pydantic import BaseModel
    from starlette.concurrency import run_in_threadpool

    model = mlp()

    class Batch(BaseModel):
        inputs: list[list[float]]

    app = FastAPI(title="exercise 6: a thread-pool hop")
    app.state.total = 0.0
    app.state.count = 0

    @app.post("/predict")
    async def predict(batch: Batch) -> dict[str, Any]:
        x = torch.tensor(batch.inputs)
        with torch.no_grad():
            # LEAK(nograd_threadpool): no_grad is set on this (event-loop) thread only; the
            # worker thread records the graph, and the running total keeps every one.
            y = await run_in_threadpool(model, x)
        app.state.total = app.state.total + y.norm()
        app.state.count += 1
        return {
            "outputs": y.detach().tolist(),
            "mean_norm": float(app.state.total) / app.state.count,
        }

    return app
