"""A warning whose text carries the request's values: Python's warnings registry keeps each one.

The cause, for a learner: ``warnings.warn`` shows a warning once per place (the ``default``
action) by remembering every (text, category, line) it has shown in the calling module's
``__warningregistry__``, a dict that is never emptied. The key holds the *text*: a warning that
formats the offending values into its message adds one entry, text and all, for every new
value. A service that warns about odd inputs by printing them keeps every such input's text, for
the life of the process, and prints each once more.

Reports reproduced (read through their public trackers): python/cpython#97557 ("Memory leak:
warnings module", open: ``warnings.warn(str(random.random()), DeprecationWarning)`` in a loop,
the container's memory "constantly increased"; "having an application with a lot of
dependencies - you have no idea which module use warnings module, so in production you will
have memory leak"); POSYDON-code/POSYDON#364 ("Possible memory leak in warnings": "adds an entry
to the warnings registry (a dictionary) for each warning with a different text";
``warnings.warn(f"Test {i}", UserWarning)`` 30,000,000 times "will take >4GB of memory"; fixed
with a registry of their own that keys on the place, not the text).

The service: ``/predict`` scores a row of 64 features with a small model (64 → 256 → 16) and,
where the top score is under a confidence threshold (every request here), warns with a
``UserWarning`` naming the input (its 64 values, rounded, ~0.9 kB of text). Each request's
features are new (``inputs="shapes"``: request i's row no other request sends; the scan's
repeat phase sends earlier rows again). Fixed: the warning's text is constant and the values go
to a log line (``logging``), the shape of POSYDON's fix (the registry keyed without the data).

PREDICTION (written before any measurement, in the commit that adds this module):
- Instrument: the scan from outside with the agent (its Python trace names the line).
- Growth: one registry entry a new input: the message string (~0.9 kB), its key tuple and the
  dict's slot, ~1.1 kB a request. Leaky, under the budget below (1 GiB, 10 requests a second,
  fail if it runs out within a week: 1.1 kB × 10/s × 7 days ≈ 6.7 GB): FAIL. Axis per new input
  (a row sent again finds its text in the registry and adds nothing). Owner Python: objects that
  hold no tensor, the Python trace naming the ``warnings.warn`` line of the service.
- Fixed: PASS, flat; axis none, owner none.

DECLARED after its first runs (a limit of the instrument they showed, in the commit that sets
``known_miss``): the leak may be read as a plateau at 600 judged requests (below).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
import logging
import warnings
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant

FEATURES, HIDDEN, OUTPUTS = 64, 256, 16
CONFIDENT = 0.99  # above what this untrained model ever gives: every request warns
LOG = logging.getLogger("zoo.low_confidence")


def body(i: int) -> dict[str, Any]:
    """Request i: a row of features no other request sends (to the four decimals the warning
    prints). As first written (cba3322) the rows came back every 997 requests, so the
    requests after the judged ones, where the agent's Python trace looks, sent rows already
    seen: the trace saw nothing kept and the owner read native. Fixed after its first runs to
    do what this line says, the prediction unchanged."""
    return {
        "inputs": [
            ((i * 7919 + c * 31) % 1_000_003) / 1_000_003 for c in range(FEATURES)
        ]
    }


ENTRY = Entry(
    name="warnings_unique_text",
    title="A warning whose text carries the request's values",
    reports=("python/cpython#97557", "POSYDON-code/POSYDON#364"),
    symptom="warnings.warn with a different text each time adds an entry to the warnings "
    "registry per text: memory grew without end (30 million texts: over 4 GB).",
    instruments=("scan", "agent"),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-new-input", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    known_miss="about 1 kB a request over 600 judged requests is at the detector's limit on the "
    "host noise floor: a leak must prove that the last half of its floor still climbs, and that "
    "half's bound does not clear zero, so the leak may read as a plateau, which passes; where it "
    "is found, its 300 repeats' bound (-1.82 kB .. 627 B a repeat) tells neither axis "
    "(undetermined)",
    known_miss_since="67c57c9",
    budget=("--capacity", "1GiB", "--rate", "10", "--fail-if-oom-within", "7d"),
    predicted_in="cba3322",
    predicted_after_measuring=False,
    inputs="shapes",
    requests=600,
    warmup=50,
    body=body,
)


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import Body, FastAPI, HTTPException

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUTPUTS),
    ).eval()
    app = FastAPI(title=f"warnings_unique_text ({variant})")

    def low_confidence(row: list[float], top: float) -> None:
        if variant == "leaky":
            # LEAK(warnings_unique_text): the values in the text: the registry keeps one
            # entry, text and all, for every input it has not seen.
            values = ", ".join(f"{v:.4f}" for v in row)
            warnings.warn(
                f"low confidence {top:.4f} for input [{values}]", stacklevel=1
            )
        else:
            # FIX(warnings_unique_text): one constant text (one registry entry, shown once);
            # the values go to the log, which keeps nothing.
            warnings.warn(
                "low confidence for an input (its values are logged)", stacklevel=1
            )
            LOG.info("low confidence %.4f for input %s", top, row)

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        row = body.get("inputs") if isinstance(body, dict) else None
        if not isinstance(row, list) or len(row) != FEATURES:
            raise HTTPException(
                status_code=422,
                detail=f'the body must be {{"inputs": [{FEATURES} numbers]}}',
            )
        with torch.inference_mode():
            scores = torch.softmax(
                model(torch.tensor([row], dtype=torch.float32)), dim=1
            )
        top = float(scores.max())
        if top < CONFIDENT:
            low_confidence(row, top)
        return {"label": int(scores.argmax()), "confidence": top}

    return app
