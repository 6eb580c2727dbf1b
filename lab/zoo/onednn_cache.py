"""oneDNN's primitive cache on CPU: memory that follows new input shapes, then stops.

The cause, for a learner: on CPU, PyTorch runs a convolution through oneDNN (formerly MKLDNN).
For every new input shape oneDNN creates a *primitive* (a kernel JIT-compiled for exactly that
shape, with its descriptors) and keeps it in an LRU cache, so that the next request of the same
shape skips the compilation; ideep, PyTorch's binding to oneDNN, keeps its own LRU of computed
parameters beside it. A service fed images of many sizes therefore grows with every size it has
not seen, until the caches are full (1,024 entries each by default), and then holds. Repeats of
a seen size add nothing. No Python object holds this memory: a tensor census, ``tracemalloc``
and ``gc`` see nothing; only the process's resident memory grows.

Reports reproduced:
- pytorch/pytorch#27971 "High memory usage for CPU inference on variable input shapes (10x
  compared to pytorch 1.1)": a conv net served on CPU with inputs of varying shapes used far
  more memory than with fixed shapes; the maintainers' logs (``MKLDNN_VERBOSE=1``) show a
  primitive created per new shape.
- pytorch/pytorch#98688 "Memory leak in Conv1d": CPU memory grew with dynamic-shape inputs; an
  Intel engineer answered that the primitive and primitive-description caches make memory
  grow "at the beginning when it hasn't reached the maximum cache capacity size" and that
  ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 LRU_CACHE_CAPACITY=1`` stop it.

The service: a 4-conv net (3→32→64→64→32 channels, 3×3, padding 1) on one thread, fed a
1×3×H×W image whose H and W the request's body carries; request i has a shape no earlier
request had (every H and W from 16 to 71, 3,136 sizes in a fixed shuffled order; shuffled
after the first scans, whose in-order shapes grew in lumps). Measured here before this entry
was written (torch 2.11 CPU, a plain loop, shapes in order H = 16 + i // 56, W = 16 + i % 56,
RssAnon): about +300 kB a new shape for the first ~350 shapes,
~120 MB by 450, then flat; with both knobs set, +4.5 MB over 400 shapes (mostly the first 50).

PREDICTION (written before the scan measured it):
- Instrument: the scan from outside (RSS and anonymous memory of the process tree). The agent's
  census should see nothing grow (native memory, reachable from no Python object).
- Leaky, under the budget below (a small pod: 1 GiB, 5 requests a second, fail if it runs out
  within a day): FAIL. The judged window (requests 20 to 270, every one a new shape) lies
  inside the cache's filling, ~300 kB a request, still climbing at its end: the scan reads a
  leak and projects 1 GiB in minutes.
- Fixed (the same requests with ``LRU_CACHE_CAPACITY=1 ONEDNN_PRIMITIVE_CACHE_CAPACITY=0``):
  PASS, flat (at most a few kB a request).
- Axis: per new input (new shape), bounded by the caches' capacity; repeats add nothing.
  Owner: native (oneDNN's and ideep's LRU caches).
- Under a budget with room for the bounded ~120 MB it passes: the scan cannot know the bound
  from a window inside the filling (a slope cannot tell a cache from a leak), but a window that
  starts past the fill (warm-up beyond ~450 distinct shapes) reads flat, and a generous budget
  (8 GiB, one request every 32 s, a week) projects past the week.

MEASURED (added after the scan; the prediction above is kept as written): the scan did not
fail the leaky variant. Inside the filling (judged windows of 250 and 360 new shapes) it read
a leak in 3 of 8 runs and a plateau in 5: the series slows as the caches fill and climbs in
steps of several MB, so the scan's noise estimate (5-13 MB) leaves the last half's bound below
zero; and a plateau passes under every budget (only a leak can fail). The entry therefore
judges a window that spans the fill (20 warm-up, 580 judged requests, every one a new shape):
plateau, pass, 3 of 3, rising 109-115 MB; fixed: plateau 1.1-1.5 kB a request, rise 1.4 MB,
pass 3 of 3. Repeats add nothing (50 shapes cycled, 300 repeats judged: flat), and with
``--agent`` the census found nothing grown while RSS rose 117 MB. ENTRY.leaky states that checkable verdict; telling a bounded cache from a leak,
and naming the axis, is the diagnosis issue's (#38). Figures and commands: docs/zoo.md.

BUDGET (added after the runs): measured at 5 requests a second, the budget is now one a
second (1 GiB, a day): every service here creeps ~1-2 kB a request, which a day at 5 a
second fails; the outcomes above are the same under the new budget (docs/zoo.md).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
import random
from typing import Annotated, Any, TypeGuard

from _zoo import Entry, Expect, Variant

# Distinct (H, W) per request: every side from 16 to 71, 3,136 shapes in all, in a fixed
# shuffled order (so that no stretch of requests is all small or all large images).
SIDE_MIN, SIDES = 16, 56
_ORDER = random.Random(27971).sample(range(SIDES * SIDES), SIDES * SIDES)


def shape_of(i: int) -> tuple[int, int]:
    """Request i's image size, distinct for every i below 3,136."""
    k = _ORDER[i % len(_ORDER)]
    return SIDE_MIN + k // SIDES, SIDE_MIN + k % SIDES


def shape_body(i: int) -> dict[str, Any]:
    h, w = shape_of(i)
    return {"h": h, "w": w, "seed": i}


KNOBS_OFF = {"LRU_CACHE_CAPACITY": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}

ENTRY = Entry(
    name="onednn_cache",
    title="oneDNN's primitive cache: a conv net on inputs of many sizes",
    reports=("pytorch/pytorch#27971", "pytorch/pytorch#98688"),
    symptom="CPU memory of a conv net grows with every new input shape, ~120 MB over the first "
    "~1,000 shapes here, then holds; the caches' two knobs keep it flat.",
    instruments=("scan",),
    below_python=True,
    must_pass=False,
    # Predicted "fail"; the scan reads the fill as a plateau (see MEASURED above), and a
    # plateau passes under any budget: this is the verdict it can check today.
    known_miss="a bounded per-shape cache is read as a plateau, which passes under any budget "
    "(+107-120 MB over 580 new shapes); the diagnosis names it: per new input, bounded "
    "(+200-215 kB a new shape, +0 a repeat), owner native",
    known_miss_since="f7222e6",
    leaky=Expect(verdict="fail", axis="per-new-input", owner="native"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    # A small pod: 1 GiB, one request a second, fail if memory runs out within a day.
    budget=("--capacity", "1GiB", "--rate", "1", "--fail-if-oom-within", "1d"),
    predicted_in="82832cb",
    predicted_after_measuring=True,
    inputs="shapes",
    # Past the caches' fill (~450 shapes), so that the scan sees the rise and the hold.
    requests=580,
    warmup=20,
    # FIX(onednn_cache): the caches' capacities, read by oneDNN and ideep when they first cache
    # (set after `import torch`, before the first conv: +1.8 MB over 300 new shapes, as when set
    # before torch loads, against +93.6 MB without; 2026-12-06), so torch may be preloaded.
    env={"fixed": KNOBS_OFF},
    body=shape_body,
)


def build_net() -> Any:
    """The 4-conv net, in eval mode, on one intra-op thread (stable figures)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 32, 3, padding=1),
    )
    return net.eval()


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def image(body: Any) -> Any:
    """The request's 1×3×H×W image: its pixels as the body sends them (``{"image": [3 rows of
    H rows of W numbers]}``, as a client sends a tensor in JSON), or drawn from the body's seed
    (``{"h": 32, "w": 48, "seed": 0}``: the body stays small); TypeError or ValueError, said
    plainly, for a body that is neither."""
    import torch

    if not isinstance(body, dict):
        raise TypeError(
            'the body must be a JSON object such as {"h": 32, "w": 48, "seed": 0}'
        )
    if "image" in body:
        try:
            pixels = torch.tensor(body["image"], dtype=torch.float32)
        except (TypeError, ValueError) as e:
            raise TypeError(f"image must be 3 rows of H rows of W numbers: {e}") from e
        if pixels.dim() != 3 or pixels.shape[0] != 3:
            raise ValueError(f"image must be 3×H×W, got {tuple(pixels.shape)}")
        if not (1 <= pixels.shape[1] <= 512 and 1 <= pixels.shape[2] <= 512):
            raise ValueError(
                f"image size {pixels.shape[1]}x{pixels.shape[2]} is out of range"
            )
        return pixels.unsqueeze(0)
    h, w, seed = body.get("h"), body.get("w"), body.get("seed", 0)
    if not (_is_int(h) and _is_int(w) and _is_int(seed)):
        raise TypeError(f"h, w and seed must be integers, got {h!r}, {w!r}, {seed!r}")
    if not (1 <= h <= 512 and 1 <= w <= 512):
        raise ValueError(f"image size {h}x{w} is out of range: give 1 <= h, w <= 512")
    return torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(seed))


def make_app(variant: Variant) -> Any:
    import os

    import torch
    from fastapi import Body, FastAPI, HTTPException

    if variant == "fixed" and any(os.environ.get(k) != v for k, v in KNOBS_OFF.items()):
        # The knobs only work when set before the first conv: serve.py sets them from Entry.env.
        raise RuntimeError(
            f"the fixed variant needs {KNOBS_OFF} in the environment before its first conv"
        )
    net = build_net()
    app = FastAPI(title=f"onednn_cache ({variant})")

    # `async def`: the model runs on the event loop's thread, one thread for every request.
    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        try:
            x = image(body)
        except (TypeError, ValueError) as e:
            raise HTTPException(status_code=422, detail=str(e)) from e
        with torch.inference_mode():
            # LEAK(onednn_cache): each (H, W) not seen before makes oneDNN JIT-compile and cache
            # new conv primitives (and ideep cache their parameters), up to 1,024 entries each.
            # FIX(onednn_cache): the same call; Entry.env sets LRU_CACHE_CAPACITY=1 and
            # ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 for the fixed variant, so nothing is kept.
            y = net(x)
        return {"shape": list(y.shape), "mean": float(y.mean())}

    return app
