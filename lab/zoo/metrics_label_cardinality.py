"""Metrics labelled by user: a Prometheus series per user, kept for the life of the process.

The cause, for a learner: ``prometheus_client`` keeps one child per distinct combination of
label values of a metric (``metric.labels(user=...)``), in a dict inside the metric, for as long
as the process lives: Prometheus series are never forgotten by the client, because a counter
must keep counting from where it was. A label whose values are unbounded (a user id, an API
key, a request id, a model name a client typed) adds a child for every new value: a counter's
child is a few Python objects, a histogram's one value and one lock per bucket. Nothing else
holds them, no tensor is involved, and every scrape of ``/metrics`` writes them all.

Reports reproduced (read through the public tracker):
- BerriAI/litellm#12159 "memory leak when scraping Prometheus metrics (most likely due to label
  cardinality explosion)": with the Prometheus metrics enabled, "a severe resource leak when we
  scrape the metrics"; the reporter points at metrics "labelled with high cardinality fields
  like user_id and key_id ... many, many thousands of separate metrics that never get GC'ed",
  and re-opened it because the configured label filter was not applied.
- BerriAI/litellm PR #27272 "Cap Prometheus end-user metric cardinality": "one in-memory
  Prometheus child series per unique end_user label tuple with no cleanup path"; its
  reproduction with prometheus_client alone (1,000 ``labels(end_user=...)`` calls leave 1,000
  children in ``metric._metrics``), fixed by a bounded series tracker (max series and TTL).

The service: a small model (a 64 → 256 → 16 MLP, one thread) behind ``/predict``; each request
names its ``user`` and ``api_key`` (new ones per request, as a service with many users sees
them), and the service records three metrics the way litellm's proxy does: a request counter
and a token counter labelled by user, key and model, and a latency histogram (the client's
default 15 buckets) labelled the same. Fixed: the same metrics labelled by model only (the
bounded labels litellm's fix keeps; per-user figures belong in logs, not series).

PREDICTION (written before any measurement, in the commit that adds this module):
- Instrument: the scan from outside (anonymous memory) with the agent. Growth per new user:
  three children (two counters, one histogram of 15 buckets plus its sum, each value with its
  lock) and their label tuples and dict slots: roughly 2 to 4 kB a request, all Python objects.
- Leaky, under the budget below (1 GiB, 5 requests a second, fail if it runs out within two
  days): FAIL, at ~3 kB a request the headroom goes in under a day. Axis: per new input (a
  repeated user adds no child: the scan's repeat phase resends bodies already seen). Owner:
  Python (objects a module global reaches: the metrics' ``_metrics`` dicts).
- What today's scan will say of the owner: the census counts tensors, finds none growing, and
  the owner rule names native memory ("the census holds 0 B"): wrong. The instrument is to
  read the Python heap beside the tensors, so that objects that hold no tensor read as Python.
- Fixed: PASS, flat (three children in all, made in the warm-up). Axis none, owner none.

MEASURED (added after the runs; the prediction above is kept as written, in de85ad8):
- The first run, with the scan as it was (`cargo xtask run-lab --zoo`, 2026-12-07): leaky
  FAIL, anonymous memory 6.53 kB ± 1.02 kB a request, axis per new input, owner native ("the
  census holds 0 B"): wrong, as predicted for the owner; fixed PASS, flat. Its census's heap
  figures showed why the census could not help: the looks inside re-sent bodies already sent
  (the folder held warm-up + judged bodies only), so no child was made between them.
- The census then got the Python heap (objects by type), the agent a Python trace
  (tracemalloc over a window of requests, `POST pytrace`, opt-in), the scan `--python-trace`,
  the judge the rule that Python objects the trace kept make a native reading Python, and
  serve.py enough bodies that the windows after the judged requests send new ones. Three runs
  of this entry after that (`leaklab-lab run-lab --zoo --only metrics_label_cardinality`):
  leaky FAIL 3 of 3 at 6.56-6.58 kB ± 1.02 kB a request, per new input, owner Python: the
  trace kept 4.60-4.77 kB a request (77-86 requests), most at prometheus_client's
  values.py:25 (34-36 blocks a request: a value and its lock per bucket) and metrics.py:658;
  fixed PASS 3 of 3, flat, 150-217 B a request. As predicted, after the instrument changed.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
import time
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant

FEATURES, HIDDEN, OUTPUTS = 64, 256, 16
MODEL = "mlp-small"


def body(i: int) -> dict[str, Any]:
    """Request i: a user and a key no earlier request named, and one row of features."""
    return {
        "user": f"user-{i:06d}",
        "api_key": f"sk-{(i * 7919) % 1_000_003:07d}",
        "inputs": [((i + c) % 17) / 17.0 for c in range(FEATURES)],
    }


ENTRY = Entry(
    name="metrics_label_cardinality",
    title="Prometheus metrics labelled by user: a series per user, never forgotten",
    reports=("BerriAI/litellm#12159", "BerriAI/litellm PR #27272"),
    symptom="With Prometheus metrics labelled by user and key, the proxy's memory grew with "
    "every new user and was never given back: one child series per label combination.",
    instruments=("scan", "agent"),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-new-input", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "1GiB", "--rate", "5", "--fail-if-oom-within", "2d"),
    predicted_in="de85ad8",
    predicted_after_measuring=False,
    inputs="shapes",
    requests=400,
    warmup=50,
    body=body,
)


def make_app(variant: Variant) -> Any:
    import prometheus_client
    import torch
    from fastapi import Body, FastAPI, HTTPException

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUTPUTS),
    ).eval()
    registry = prometheus_client.CollectorRegistry()
    if variant == "leaky":
        # LEAK(metrics_label_cardinality): user and key as labels: a child per new value,
        # kept for the life of the process.
        labels: tuple[str, ...] = ("user", "api_key", "model")
    else:
        # FIX(metrics_label_cardinality): bounded labels only (the model); per-user figures
        # go to logs.
        labels = ("model",)
    requests = prometheus_client.Counter(
        "zoo_requests", "Requests served", labels, registry=registry
    )
    tokens = prometheus_client.Counter(
        "zoo_tokens", "Output values served", labels, registry=registry
    )
    latency = prometheus_client.Histogram(
        "zoo_latency_seconds", "Time to answer", labels, registry=registry
    )
    app = FastAPI(title=f"metrics_label_cardinality ({variant})")

    @app.post("/predict")
    async def predict(b: Annotated[Any, Body()]) -> dict[str, Any]:
        ok = isinstance(b, dict) and all(
            isinstance(b.get(k), str) for k in ("user", "api_key")
        )
        inputs = b.get("inputs") if isinstance(b, dict) else None
        if not ok or not isinstance(inputs, list) or len(inputs) != FEATURES:
            raise HTTPException(
                status_code=422,
                detail=f'the body must be {{"user": "...", "api_key": "...", "inputs": [{FEATURES} numbers]}}',
            )
        started = time.perf_counter()
        with torch.inference_mode():
            y = model(torch.tensor([inputs], dtype=torch.float32))
        values = {"user": b["user"], "api_key": b["api_key"], "model": MODEL}
        chosen = {k: values[k] for k in labels}
        requests.labels(**chosen).inc()
        tokens.labels(**chosen).inc(OUTPUTS)
        latency.labels(**chosen).observe(time.perf_counter() - started)
        return {"outputs": [float(v) for v in y[0]]}

    @app.get("/metrics")
    async def metrics() -> Any:
        from fastapi import Response

        return Response(
            prometheus_client.generate_latest(registry),
            media_type=prometheus_client.CONTENT_TYPE_LATEST,
        )

    return app
