"""An LSTM served from a thread pool, with OpenMP's own threads under it.

The cause, for a learner: PyTorch runs an operator's inner loops on OpenMP threads (as many as
``torch.get_num_threads()``, by default the machine's cores). A service that also runs its model
on a pool of Python threads (a ``ThreadPoolExecutor``, ``run_in_executor``) calls into OpenMP
from several threads at once, and each calling thread gets an OpenMP team of its own. The
report found memory that grew for as long as such a service ran, with an LSTM, and traced it to
OpenMP creating and destroying threads again and again (each thread's stack and the allocator's
per-thread arena are what is left behind); ``torch.set_num_threads(1)`` (no OpenMP team) or
``OMP_NUM_THREADS=1`` stopped it.

Report reproduced (read through the public tracker): pytorch/pytorch#41486 "LSTMs leak memory in
CPU PyTorch 1.5.1, 1.6, and 1.7 on Linux": an LSTM run from a ``ThreadPoolExecutor``. A
maintainer (colesbury): "This looks like a leak due to OpenMP mixing with threads. You can
disable OpenMP by calling ``torch.set_num_threads(1)`` or by setting the environment variable
``OMP_NUM_THREADS=1``"; "the OpenMP library seems to be constantly creating and destroying
threads"; and it did not happen with PyTorch built from source against the system's GNU OpenMP,
only with the builds that ship their own libgomp (conda's then). The pip wheel of torch 2.11
ships its own libgomp too.

The service: one ``nn.LSTM`` (32 inputs, 64 hidden, one layer, batch first) in eval mode under
``inference_mode``, each request's 4 sequences of 50 steps run side by side on a
``ThreadPoolExecutor`` of 4 threads. Leaky: torch's default intra-op threads (the machine's
cores: OpenMP teams under each pool thread). Fixed: ``torch.set_num_threads(1)``, the report's
fix.

PREDICTION (written before any measurement, in the commit that adds this module):
- Instrument: the scan from outside (anonymous memory of the process), the agent for the owner.
- If torch 2.11's bundled libgomp still churns threads as the report's did: leaky FAIL under the
  budget below (memory per request, without end), axis per request, owner native (thread
  stacks and arenas: no Python object, no tensor). Fixed: PASS, flat.
- What may instead happen: the churn came from a libgomp of 2020 (and PR pytorch/pytorch#52815,
  fixing OpenMP threads thrashing between team sizes, came after); then both variants read
  flat and the entry goes under "tried and not reproduced" in docs/zoo.md with what was tried.
  Which of the two is not known before the run; the first is this entry's prediction.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant

INPUTS, HIDDEN, SEQUENCES, STEPS = 32, 64, 4, 50
POOL = 4

ENTRY = Entry(
    name="lstm_threadpool_openmp",
    title="An LSTM run from a thread pool, OpenMP's teams under each thread",
    reports=("pytorch/pytorch#41486",),
    symptom="An LSTM served from a ThreadPoolExecutor grew CPU memory without end on PyTorch "
    "1.5-1.7 builds that ship their own libgomp; torch.set_num_threads(1) stopped it.",
    instruments=("scan",),
    below_python=True,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-request", owner="native"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "1GiB", "--rate", "1", "--fail-if-oom-within", "1d"),
    predicted_in="this commit",
    predicted_after_measuring=False,
    inputs="same",
    requests=200,
    warmup=50,
    body=lambda i: {"seed": 7},
)


def make_app(variant: Variant) -> Any:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from fastapi import Body, FastAPI, HTTPException

    if variant == "fixed":
        # FIX(lstm_threadpool_openmp): no OpenMP team under the pool's threads (the report's fix).
        torch.set_num_threads(1)
    # LEAK(lstm_threadpool_openmp): the default, torch.get_num_threads() == the machine's cores:
    # each pool thread that calls the LSTM gets an OpenMP team of its own.
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(INPUTS, HIDDEN, batch_first=True).eval()
    pool = ThreadPoolExecutor(max_workers=POOL, thread_name_prefix="lstm")
    app = FastAPI(title=f"lstm_threadpool_openmp ({variant})")

    def run(seed: int) -> float:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(1, STEPS, INPUTS, generator=gen)
        with torch.inference_mode():
            out, _ = lstm(x)
        return float(out[0, -1].norm())

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        seed = body.get("seed") if isinstance(body, dict) else None
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise HTTPException(
                status_code=422, detail='the body must be {"seed": <an integer>}'
            )
        # The request's sequences side by side on the pool's threads, as the report's did.
        loop = asyncio.get_running_loop()
        norms = await asyncio.gather(
            *(loop.run_in_executor(pool, run, seed + k) for k in range(SEQUENCES))
        )
        return {"norms": norms}

    return app
