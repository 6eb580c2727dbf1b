"""Exercise 6, solved: ``inference_mode`` set on the thread that runs the model.

Grad mode is per thread: the mode belongs inside the function the pool runs. The running
total then adds plain tensors with no graph behind them (``float(...)`` of each norm would do
as well: a statistic needs numbers).
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

    def infer(x: torch.Tensor) -> torch.Tensor:
        # FIX(nograd_threadpool): set the mode on the worker thread, where the model runs.
        with torch.inference_mode():
            y: torch.Tensor = model(x)
        return y

    app = FastAPI(title="exercise 6: a thread-pool hop (solved)")
    app.state.total = 0.0
    app.state.count = 0

    @app.post("/predict")
    async def predict(batch: Batch) -> dict[str, Any]:
        x = torch.tensor(batch.inputs)
        y = await run_in_threadpool(infer, x)
        app.state.total = app.state.total + y.norm()
        app.state.count += 1
        return {
            "outputs": y.detach().tolist(),
            "mean_norm": float(app.state.total) / app.state.count,
        }

    return app
