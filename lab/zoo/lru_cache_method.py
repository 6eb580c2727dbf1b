"""``functools.lru_cache`` on a method of a per-request object: the cache keeps every instance.

The cause, for a learner: ``@functools.lru_cache`` (and ``@functools.cache``) on a method caches
on the *function*, which lives as long as its class: the cache's key is the call's arguments,
``self`` first. Every instance the method is called on is kept by the class's cache, with
everything it holds (its input tensors) and the result, until its entry is evicted; with
``maxsize=None`` (``functools.cache``) that is never. A service that builds one such object a
request (a request's batch, document or prompt with a cached ``features()``) keeps them all.
flake8-bugbear and ruff flag it (B019, "cached-instance-method": "the cache may retain instance
references, preventing garbage collection").

Reports reproduced (read through their public trackers): pytest-dev/pytest PR #9148 ("Avoid
`@lru_cache` on methods": "it also captures `self` and leaks it until the entry is evicted (if
ever)"); meta-pytorch/botorch PR #1650 ("Don't use functools.lru_cache on methods": "It can
cause memory leaks"); PyCQA/flake8 PR #1573 ("fix memory leak caused by lru_cache of a
method"); dbt-labs/metricflow PR #1446 (the decorator "holds a reference to the class instance,
preventing GC of the instance using the decorator until the associated entry is evicted").

The service: ``/predict`` wraps the request's features (4 rows of 256 numbers) in a ``Batch``
and answers with its ``embedding()`` (a 256 → 256 ``Linear`` under ``inference_mode``), a
method the service caches so that a handler asking twice pays once. Leaky: the method
decorated with ``@functools.cache`` (``lru_cache(maxsize=None)``). Fixed: ``functools.cached_property``
(the value kept in the instance's own ``__dict__``, freed with it), the fix the reports name.

PREDICTION (written before any measurement, in the commit that adds this module):
- Instrument: the scan from outside with the agent (its census walks from the class).
- Growth: each request keeps its ``Batch``, its input (4 × 256 float32, 4 KiB) and its
  embedding (4 KiB), the key tuple and the cache's dict entry: ~8.5 kB a request. Leaky, under
  the budget below (1 GiB, 5 requests a second, fail if it runs out within a day: 8.5 kB ×
  5/s × 86,400 s ≈ 3.7 GB): FAIL. Axis per request (the same body every time: each request's
  new instance is a new key). Owner Python: tensors reachable from a root, the census naming a
  holder under the ``Batch`` class's ``embedding`` (the cache reached through the wrapper).
- Fixed: PASS, flat; axis none, owner none.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
import functools
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant, matrix_of

ROWS, WIDTH = 4, 256

ENTRY = Entry(
    name="lru_cache_method",
    title="functools.lru_cache on a method of a per-request object",
    reports=(
        "pytest-dev/pytest PR #9148",
        "meta-pytorch/botorch PR #1650",
        "PyCQA/flake8 PR #1573",
        "dbt-labs/metricflow PR #1446",
    ),
    symptom="lru_cache on a method captures self and keeps each instance until its entry is "
    "evicted, if ever: every object the method was called on stays in memory.",
    instruments=("scan", "agent"),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-request", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "1GiB", "--rate", "5", "--fail-if-oom-within", "1d"),
    predicted_in="ae25e4d",
    predicted_after_measuring=False,
    inputs="same",
    requests=400,
    warmup=50,
    body=lambda i: {
        "features": [[(r + k) % 7 / 7.0 for k in range(WIDTH)] for r in range(ROWS)]
    },
)


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import Body, FastAPI, HTTPException

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, WIDTH).eval()
    app = FastAPI(title=f"lru_cache_method ({variant})")

    class Batch:
        """One request's rows, and what the model makes of them."""

        def __init__(self, rows: list[list[float]]) -> None:
            self.x = torch.tensor(rows, dtype=torch.float32)

        if variant == "leaky":
            # LEAK(lru_cache_method): the cache belongs to the class's function and its key
            # holds `self`: every Batch, its input and its embedding stay, never evicted.
            @functools.cache  # noqa: B019 (the cause this entry reproduces)
            def embedding(self) -> Any:
                with torch.inference_mode():
                    return model(self.x)

        else:
            # FIX(lru_cache_method): cached on the instance itself, freed with it.
            @functools.cached_property
            def _embedding(self) -> Any:
                with torch.inference_mode():
                    return model(self.x)

            def embedding(self) -> Any:
                return self._embedding

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        try:
            rows = matrix_of(body, "features", ROWS, WIDTH)
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None
        batch = Batch(rows)
        out = batch.embedding()
        return {"norm": float(out.norm()), "first": float(batch.embedding()[0, 0])}

    return app
