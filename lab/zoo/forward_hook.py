"""A forward hook registered per request, its handle dropped: the module keeps every hook.

The cause, for a learner: ``module.register_forward_hook(fn)`` stores ``fn`` in the module's
``_forward_hooks`` dict and returns a handle; only ``handle.remove()`` takes it out. A service
that registers a hook *per request* (to perturb, inspect or record an activation for that one
request) and lets the handle go keeps every hook it ever registered, and with each hook its
closure: here a per-request perturbation tensor. The model keeps working (the stale hooks are
disabled by a flag), so nothing looks wrong but memory, and each request runs every old hook.

Reports reproduced (read through the public tracker):
- fffasttime/MRFI PR #5, "Fix hook memory leak in MRFI by tracking and exposing
  RemovableHandle references": ``__add_hooks`` registered forward pre-hooks and forward hooks
  but "the returned RemovableHandle objects were discarded", so "every MRFI instantiation
  accumulated closures ... that were never freed, even after the MRFI object itself was
  deleted. Over a long campaign this causes progressive GPU/CPU memory exhaustion." The fix
  keeps the handles and adds ``remove_hooks()`` / ``close()``.
- meta-pytorch/opacus#176, "torch.no_grad() creates memory leak because of forward hook":
  opacus's forward hooks kept saving activations under ``torch.no_grad()`` while the model was
  in training mode ("Setting model.eval() will fix the issue"): a hook the model keeps,
  holding tensors.

Mechanism through the real library path: ``torch.nn.Module.register_forward_hook`` on the
model's hidden layer, called each request; the hook's closure keeps an 8 x 512 float32 noise
tensor (16,384 bytes) made for that request.

PREDICTION, written before measuring (budget: --capacity 8GiB --rate 5
--fail-if-oom-within 2d, i.e. 864,000 requests must fit in 8 GiB: about 9.9 kB a request):
- instruments: the scan (RSS and anonymous memory of the process) sees a straight per-request
  slope of about 16.4 kB of tensor storage plus the hook, closure and handle objects (expected
  20-70 kB from outside, as refs-leaky's small kept tensors read 4x their bytes); the agent's
  census names the holder as the hook's closure cell (``... hook -> cell 'noise'``).
- leaky: fail, axis per-request, owner python.
- fixed (the handle kept and ``remove()``d in ``finally``): pass, axis none, owner none.

MEASURED afterwards (the scan, 400 judged requests after 50, the budget above; six runs
with --agent and two without, 2026-12-05): leaky FAIL 8/8, anonymous memory 17.3 to 27.5 kB a
request (17.3 to 17.8 in seven runs; the low end of the 20-70 kB predicted), the census naming
``perturbation_hook.<locals>.hook -> cell 'noise'`` at +16.38 kB a request in five runs of six
(in one it found the hooks by another path and, the name changed, over-counted; since the
diff matches holders by the object they are, six runs of six read 16.38 kB: docs/zoo.md);
fixed PASS 8/8, 0.06 to 0.09 kB a request, no holder grew.
The pytest plugin's leak_check fails it too (+16,384 B of tensors a call;
lab/zoo/test_zoo_plugin.py).
"""

# No `from __future__ import annotations`: FastAPI must see the request model class itself.
from typing import Any

from _zoo import Entry, Expect, Variant, batch_body

ROWS, FEATURES, HIDDEN, OUTPUTS = 8, 64, 512, 16


ENTRY = Entry(
    name="forward_hook",
    title="A forward hook registered per request, its handle dropped",
    reports=("fffasttime/MRFI#5", "meta-pytorch/opacus#176"),
    symptom=(
        "Each fault-injection run registered hooks and discarded their RemovableHandles: the "
        "closures accumulated, progressive CPU/GPU memory exhaustion over a campaign."
    ),
    # "plugin" added after measuring: leak_check fails the leaky variant too.
    instruments=("scan", "agent", "plugin"),
    below_python=False,
    must_pass=False,
    leaky=Expect(verdict="fail", axis="per-request", owner="python"),
    fixed=Expect(verdict="pass", axis="none", owner="none"),
    budget=("--capacity", "8GiB", "--rate", "5", "--fail-if-oom-within", "2d"),
    predicted_in="1195aaa",
    predicted_after_measuring=True,
    inputs="same",
    # Judged requests halved from 400 for CI's CPU (2026-12-06). Ten runs each on a loaded
    # machine (load 10-16), through the zoo's driver: at 200, every verdict, axis and owner as
    # predicted; the leak 17.3-33.8 kB a request (8 GiB gone in 28 h or less at 5 a second,
    # the budget 2 d), the fix 0.05-0.34 kB (axis none); at 400, 17.7-33.6 and 0.07-0.38 kB.
    requests=200,
    warmup=50,
    body=lambda i: batch_body(ROWS, FEATURES, 17),
)


def make_app(variant: Variant) -> Any:
    import torch
    from fastapi import FastAPI
    from pydantic import BaseModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUTPUTS),
    ).eval()
    hidden = model[2]

    class Batch(BaseModel):
        inputs: list[list[float]]

    def perturbation_hook(noise: torch.Tensor, active: list[bool]) -> Any:
        """Adds this request's noise to the layer's output while ``active[0]`` is set."""

        def hook(
            module: torch.nn.Module, args: Any, output: torch.Tensor
        ) -> torch.Tensor | None:
            return output + noise if active[0] else None

        return hook

    app = FastAPI()

    @app.post("/predict")
    async def predict(batch: Batch) -> dict[str, Any]:
        x = torch.tensor(batch.inputs)
        noise = 0.01 * torch.randn(x.shape[0], HIDDEN)
        active = [True]
        hook = perturbation_hook(noise, active)
        with torch.inference_mode():
            if variant == "leaky":
                # LEAK(forward_hook): the handle is dropped; hidden._forward_hooks keeps the hook
                # and its closure (the noise tensor) for the life of the model.
                hidden.register_forward_hook(hook)
                noisy = model(x)
                active[0] = False  # the stale hook goes quiet, but stays registered
                y = model(x)
            else:
                # FIX(forward_hook): keep the handle and remove the hook when the request is done.
                handle = hidden.register_forward_hook(hook)
                try:
                    noisy = model(x)
                finally:
                    handle.remove()
                y = model(x)
        return {"outputs": y.tolist(), "sensitivity": (noisy - y).norm().item()}

    return app
