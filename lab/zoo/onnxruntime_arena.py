"""ONNX Runtime's CPU memory arena: grows with each new largest input, never shrinks.

The cause, for a learner: ONNX Runtime allocates a session's intermediate tensors from a
memory arena (a BFC allocator) rather than from malloc each run. When a run needs more than the
arena holds, the arena extends itself by a new region, by default at least twice the last one
(``kNextPowerOfTwo``), and it keeps every region for the session's life: memory follows the
largest input the service has ever seen, in doubling steps, and nothing a run frees goes back to
the system. With inputs of growing length (a sequence model, a batch that varies) the process
climbs as long as new records are set. No Python object holds it: a census, ``tracemalloc``
and ``gc`` see nothing.

Reports: microsoft/onnxruntime#11627, "Why does `enable_cpu_mem_arena` have such a large effect
on memory usage during inference?": one ``ort_sess.run()`` of a ~2 MB model took the process
from ~206 MiB to ~5.8 GiB; setting ``enable_cpu_mem_arena`` to False "completely addresses
the issue". triton-inference-server/onnxruntime_backend#102, "Memory Leaks Cause Server OOMs
(CPU, TF2/ONNX)": fixed-size inputs gave stable memory, and the reporter suspected the default
``arena_extend_strategy=kNextPowerOfTwo``. microsoft/onnxruntime PR #25800 (an execution
provider's arena, reconfigured): "the arena grew constantly when prompting with different
prompt lengths. No arena shrinkage was triggered to return older tensors."

The service: a two-layer MLP (64 → 1,024 → 64, ReLU, mean over the sequence) built in code
with ``onnx.helper``, its sequence axis dynamic, run by ``onnxruntime.InferenceSession`` on the
CPU with one thread. Request i's body names ``rows`` = 16 + 8·i (the scan's "shapes" bodies):
every request is the longest yet, so its hidden activations (rows × 1,024 × 4 B, up to
14.8 MB) set a new record. Leaky: the default session options (the arena on). Fixed:
``SessionOptions.enable_cpu_mem_arena = False``, so each run's buffers go to malloc and back;
and glibc's mmap threshold pinned at 128 kB (``mallopt``), because glibc raises that threshold
after a large block is freed and then keeps such blocks in its heaps (see ``malloc_retention``):
in a plain loop here (600 runs, rows 8 to 2,404), arena off alone held +181 MB of RssAnon
where the arena held +29 MB; arena off with the threshold pinned held +9 MB, all of it in the
first 150 runs.

PREDICTION (written before the scan measured it):
- Instrument: the scan from outside (RSS, anonymous memory); the census sees nothing.
- Leaky, under the budget below (1 GiB, one request a second, a day): FAIL, a staircase of
  arena extensions rising ~30-60 MB over the window (~50-150 kB a request), climbing while the
  largest input keeps growing.
- Fixed: PASS, flat or a small plateau (a creep of a kB or two a request).
- Axis: leaky per new input (each new largest input; a high-water mark that is never given
  back, bounded only by the largest input the service accepts); fixed none.
  Owner: native (ONNX Runtime's BFC arena).

MEASURED (added after the scan; the prediction above is kept as written): the prediction was
wrong. Leaky PASS 3 of 3: the scan read the staircase as a *plateau* (slope 79.6-80.3 kB a
request, bound ±1 kB, but its last stretch 35 kB: the doubling steps come further apart), rise
26.5-27.1 MB over the window. Is pass wrong? Not for this service: the arena follows the
largest input it accepts (``MAX_ROWS``), and a plain loop up to 8,192 rows held +104 MB of
RssAnon, then the same after 20 more runs at 8,192 and a sweep of smaller inputs back down
(100-104 MB: never given back, but bounded, far inside the 1 GiB pod). It fails where the
largest input's arena exceeds the headroom (microsoft/onnxruntime#11627: 5.6 GB for one run).
Fixed PASS 3 of 3 (plateau, 0.28-0.91 kB a request on anonymous memory, rise 0.3 MB).
Figures and commands: docs/zoo.md.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
from typing import Annotated, Any

from _zoo import Entry, Expect, Variant

DIM = 64
HIDDEN = 1024
M_MMAP_THRESHOLD = -3  # <malloc.h>
MMAP_THRESHOLD = 128 * 1024  # glibc's default, pinned
MAX_ROWS = 8192


def rows_of(i: int) -> int:
    """Request i's sequence length: each request longer than every one before."""
    return 16 + 8 * i


ENTRY = Entry(
    name="onnxruntime_arena",
    title="ONNX Runtime's CPU arena grows with each new largest input",
    reports=(
        "microsoft/onnxruntime#11627",
        "triton-inference-server/onnxruntime_backend#102",
        "microsoft/onnxruntime#25800",
    ),
    symptom="Memory of an ONNX Runtime session on the CPU climbs with each input larger than "
    "any before and never comes back; enable_cpu_mem_arena=False or fixed-size inputs make "
    "it stable.",
    instruments=("scan",),
    below_python=True,
    must_pass=True,  # bounded by the largest input: a naive slope calls its staircase a leak
    # Predicted "fail"; measured pass 3 of 3 (a plateau), right under this budget: the arena is
    # bounded by the largest input accepted (MAX_ROWS: +104 MB), see MEASURED.
    leaky=Expect(verdict="pass", axis="per-new-input", owner="native"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "1GiB", "--rate", "1", "--fail-if-oom-within", "1d"),
    predicted_in="e595376",
    predicted_after_measuring=True,
    inputs="shapes",
    requests=400,
    warmup=50,
    body=lambda i: {"rows": rows_of(i), "seed": i},
    preload=("numpy", "onnx", "onnxruntime"),  # no torch: the service never imports it
)


def build_model() -> bytes:
    """The MLP as an ONNX model, its batch and sequence axes dynamic."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(
        (rng.standard_normal((DIM, HIDDEN)) / 8).astype(np.float32), "w1"
    )
    w2 = numpy_helper.from_array(
        (rng.standard_normal((HIDDEN, DIM)) / 32).astype(np.float32), "w2"
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
            helper.make_node("ReduceMean", ["y"], ["m"], axes=[1], keepdims=0),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", DIM])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", DIM])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime reads for opset 17
    return bytes(model.SerializeToString())


def make_app(variant: Variant) -> Any:
    import ctypes

    import numpy as np
    import onnxruntime as ort
    from fastapi import Body, FastAPI, HTTPException

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    if variant == "leaky":
        # LEAK(onnxruntime_arena): the default, the CPU arena on: each new largest input extends
        # it (doubling), and it keeps every region for the session's life.
        options.enable_cpu_mem_arena = True
    else:
        # FIX(onnxruntime_arena): no arena: each run's buffers are malloc'd and freed; glibc's
        # mmap threshold pinned so that large buffers are unmapped when freed, not kept.
        options.enable_cpu_mem_arena = False
        if ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
            raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed")
    session = ort.InferenceSession(
        build_model(), options, providers=["CPUExecutionProvider"]
    )
    app = FastAPI(title=f"onnxruntime_arena ({variant})")

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        rows = body.get("rows") if isinstance(body, dict) else None
        seed = body.get("seed", 0) if isinstance(body, dict) else None
        if (
            not isinstance(rows, int)
            or isinstance(rows, bool)
            or not 1 <= rows <= MAX_ROWS
        ):
            raise HTTPException(
                status_code=422,
                detail=f'the body must be {{"rows": <1..{MAX_ROWS}>, "seed": <an integer>}}',
            )
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise HTTPException(status_code=422, detail='"seed" must be an integer')
        x = np.random.default_rng(seed).standard_normal(
            (1, rows, DIM), dtype=np.float32
        )
        (pooled,) = session.run(["m"], {"x": x})
        return {"rows": rows, "norm": float(np.linalg.norm(pooled))}

    return app
