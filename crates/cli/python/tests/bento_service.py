"""servers.py's model as a BentoML 1.4 service (``bentoml serve bento_service:Model``), the agent's
middleware in each worker (``add_asgi_middleware``, its Python trace served): the leaky variant
keeps every output in the worker that computed it (``SERVERS_VARIANT``, read by servers.py at
import in each worker). ``BENTO_WORKERS`` (2) sets the workers, ``BENTO_TIMEOUT`` BentoML's
traffic timeout (its default, 60 s, unless set): its TimeoutMiddleware keeps each request's
context for that long (docs/servers.md)."""

from __future__ import annotations

import os

import bentoml
import torch
from leaklab.asgi import LeaklabDebug
from servers import run_model

TRAFFIC = {"timeout": float(os.environ["BENTO_TIMEOUT"])} if "BENTO_TIMEOUT" in os.environ else {}


@bentoml.service(workers=int(os.environ.get("BENTO_WORKERS", "2")), traffic=TRAFFIC)
class Model:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(512, 256)
        self.outputs: list[torch.Tensor] = []

    @bentoml.api
    def predict(self, inputs: list[list[float]]) -> dict[str, float]:
        return run_model(self.model, inputs, self.outputs)


Model.add_asgi_middleware(LeaklabDebug, workers_period=0.1, python_trace_max_seconds=60)
