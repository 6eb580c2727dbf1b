"""A logging handler added to a shared logger by every client made: the SDK's null logger.

The cause, for a learner: Python's loggers are process-wide and never die (``getLogger(name)``
returns the same object forever). A library that adds a handler to a named logger each time one
of its objects is constructed leaves one more handler there for every construction: the
handler, its lock, a weak reference in ``logging._handlerList``. Nothing else holds them, no
tensor, and each is a few hundred bytes: a service that builds the client per request (per
webhook, per job) grows slowly and forever.

Report reproduced (read through the public tracker): PaddleHQ/paddle-python-sdk#144 "Memory leak:
Client.null_logger() adds a new NullHandler on every instantiation": with no ``logger``
argument, ``Client.null_logger()`` calls ``addHandler(NullHandler())`` on the shared
"null_logger" logger; 10,000 ``Client("fake_key")`` leave 10,000 handlers, "RSS grows ~5 MB per
10k Client instantiations, retained forever" (SDK 1.10.0, Python 3.12). Fixed by PR #145
("Instantiate null logger once": the handler added only where the logger has none).

The service: a webhook-style endpoint (``/predict``) that scores an event with a small model
(a 16 → 32 → 1 MLP) and builds the SDK's ``Client`` for the request, as a per-request client
factory does (paddle-python-sdk 1.10.0 from PyPI, sandbox options, no network). Fixed: the same
client built with the service's own logger (``Client(..., logger=LOG)``), the SDK's way to skip
``null_logger()``.

PREDICTION (written before any measurement, in the commit that adds this module):
- Instrument: the scan from outside with the agent (its Python trace names the lines).
- Growth: one NullHandler, its RLock and a weak reference a request, ~0.5 kB (the report's
  5 MB per 10,000). Leaky, under the budget below (1 GiB, a webhook endpoint at 20 events a
  second, fail if it runs out within a week: 0.5 kB × 20/s × 7 days ≈ 6 GB): FAIL. Axis per
  request (the same body every time: the handler is added regardless). Owner Python: objects
  that hold no tensor, the Python trace naming logging's lines (``addHandler``, the handler's
  ``__init__``, its lock).
- Declared here, before the run, a limit of the scan: half a kilobyte a request is near what it
  can prove over its judged requests (a slope bound of about 1-2 kB a request at 200; 2,000 are
  judged here, for a bound under 0.5 kB), while each request also makes and frees a client of
  ~30 sub-clients and a requests Session (garbage in cycles the collector frees): the leak may
  be read as a pass. Such a reading is a miss, declared here, shown as a miss.
- Fixed: PASS, flat (the clients are freed; no handler added). Axis none, owner none.

MEASURED (added after the runs; the prediction above is kept as written, in d148ef0): three runs
(`leaklab-lab run-lab --zoo --only logging_handler_per_client`, 2026-12-07, 2 cores): leaky
FAIL 3 of 3, anonymous memory 667-669 B ± 205 B a request over 2,000 judged requests, per
request, owner Python: the Python trace kept 558-672 B a request (76-87 requests), most at
paddle_billing/Client.py:105 (``null_logger.addHandler(NullHandler())``, 2 blocks a request),
then threading.py:101 (the handler's lock) and _weakrefset.py:88 (logging's weak reference);
fixed PASS 3 of 3, plateau, 106-111 B ± 205 B a request. As predicted; the declared miss did
not happen in these runs.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
import logging
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant

FEATURES = 16
LOG = logging.getLogger("zoo.webhooks")

ENTRY = Entry(
    name="logging_handler_per_client",
    title="An SDK client per request, each adding a handler to a shared logger",
    reports=("PaddleHQ/paddle-python-sdk#144", "PaddleHQ/paddle-python-sdk PR #145"),
    symptom="Every Client made without a logger added a NullHandler to the shared "
    "'null_logger' logger: RSS grew ~5 MB per 10,000 clients, retained forever.",
    instruments=("scan", "agent"),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-request", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    known_miss="half a kilobyte a request (a handler, its lock, a weak reference) is near what "
    "the scan can prove over 2,000 judged requests beside each request's garbage (a client of "
    "~30 sub-clients and a Session in cycles): the leaky twin may read as a pass",
    known_miss_since="d148ef0",
    budget=("--capacity", "1GiB", "--rate", "20", "--fail-if-oom-within", "7d"),
    predicted_in="d148ef0",
    predicted_after_measuring=False,
    inputs="same",
    requests=2000,
    warmup=100,
    body=lambda i: {
        "event_type": "transaction.completed",
        "amount": 1250,
        "features": [(k % 5) / 5.0 for k in range(FEATURES)],
    },
)


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import Body, FastAPI, HTTPException
    from paddle_billing import Client, Environment, Options

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    ).eval()
    options = Options(Environment.SANDBOX)
    app = FastAPI(title=f"logging_handler_per_client ({variant})")

    def client() -> Any:
        if variant == "leaky":
            # LEAK(logging_handler_per_client): no logger given: Client.null_logger() adds a
            # NullHandler to the process-wide "null_logger" logger, every time.
            return Client("pdl_sdbx_apikey_zoo", options=options)
        # FIX(logging_handler_per_client): the service's own logger: no handler added.
        return Client("pdl_sdbx_apikey_zoo", options=options, logger=LOG)

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        features = body.get("features") if isinstance(body, dict) else None
        if not isinstance(features, list) or len(features) != FEATURES:
            raise HTTPException(
                status_code=422,
                detail=f'the body must be {{"event_type": "...", "features": [{FEATURES} numbers]}}',
            )
        paddle = client()
        with torch.inference_mode():
            score = float(model(torch.tensor([features], dtype=torch.float32))[0, 0])
        paddle.log.info("scored an event")
        return {"score": score, "sandbox": paddle.options.environment.name}

    return app
