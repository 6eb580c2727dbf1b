"""The servers people run, from PyPI, each serving the same small model with leaklab's agent, for
the scan's tests of a growth in a worker process (docs/servers.md holds the recipes).

    python servers.py FRAMEWORK --variant leaky|fixed

FRAMEWORK is one of:
- ``litserve``: LitServe with two inference workers (``workers_per_device=2``), which LitServe
  starts as processes of their own that serve no HTTP; each serves the agent itself
  (``leaklab.serve_agent()`` in ``setup``), and the API server mounts the middleware.
- ``gunicorn``: gunicorn with two ``uvicorn_worker.UvicornWorker`` workers (``-w 2``), the
  middleware in each.
- ``uvicorn``: ``uvicorn --workers 2``, the middleware in each.
- ``bentoml``: BentoML with two workers (``@bentoml.service(workers=2)``, bento_service.py), the
  middleware in each (``add_asgi_middleware``).
- ``transformers``: one uvicorn process generating with a GPT-2 built from a config (no weights
  downloaded), its key/value caches kept per prompt as a prefix cache does: ``leaky`` keeps
  every prompt's ``DynamicCache`` in a dict, ``fixed`` only the last 16 (an LRU).

Every process shares ``LEAKLAB_WORKERS_DIR``. The model is a ``Linear(512, 256)`` on the
request's ``inputs``; the ``leaky`` variant keeps every output (8 KiB for a batch of 8) in a list,
the ``fixed`` one only the last. Prints ``FRAMEWORK VARIANT listening on http://127.0.0.1:PORT``
before the server binds the port.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

import litserve as ls
import torch
from fastapi import FastAPI, Request
from leaklab import serve_agent
from leaklab.asgi import LeaklabDebug

# Read at import: LitServe's workers and uvicorn's import this module afresh (spawned processes).
VARIANT = os.environ.get("SERVERS_VARIANT", "leaky")
torch.set_num_threads(1)


def run_model(model: torch.nn.Module, inputs: Any, kept: list[torch.Tensor]) -> dict[str, float]:
    with torch.inference_mode():
        out = model(torch.tensor(inputs, dtype=torch.float32))
    if VARIANT == "leaky":
        kept.append(out)  # LEAK(refs): every output kept, in the worker that ran it
    else:
        kept[:] = [out]  # FIX(refs): only the last output kept
    return {"mean": float(out.mean())}


# --- gunicorn and uvicorn: the app each worker builds (``servers:create_app()``) --------------


def create_app() -> LeaklabDebug:
    model = torch.nn.Linear(512, 256)
    outputs: list[torch.Tensor] = []
    globals()["OUTPUTS"] = outputs  # the holder, a module global as services keep histories
    api = FastAPI()

    @api.post("/predict")
    async def predict(request: Request) -> dict[str, float]:
        return run_model(model, (await request.json())["inputs"], outputs)

    return LeaklabDebug(api, workers_period=0.1)


# --- transformers: generation with caches kept per prompt ------------------------------------

PROMPT = 16  # tokens a prompt, made from the request's first row of numbers
CACHE_SLOTS = 16


def create_generation_app() -> LeaklabDebug:
    from collections import OrderedDict

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config).eval()
    cache: OrderedDict[tuple[int, ...], Any] = OrderedDict()
    globals()["CACHE"] = cache  # the holder: a prefix cache, a module global
    api = FastAPI()

    @api.post("/predict")
    async def predict(request: Request) -> dict[str, Any]:
        row = (await request.json())["inputs"][0][:PROMPT]
        prompt = tuple(int(abs(x) * 997) % config.vocab_size for x in row)
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=4,
                do_sample=False,
                pad_token_id=0,
                return_dict_in_generate=True,
            )
        cache[prompt] = out.past_key_values  # LEAK(cache): every prompt's caches kept
        if VARIANT == "fixed":
            while len(cache) > CACHE_SLOTS:
                cache.popitem(last=False)  # FIX(cache): the oldest prompt's caches dropped
        return {"tokens": out.sequences[0, len(prompt) :].tolist()}

    return LeaklabDebug(api)


# --- LitServe: the model in inference workers that serve no HTTP --------------------------------


class Model(ls.LitAPI):  # type: ignore[misc]
    def setup(self, device: str) -> None:
        self.model = torch.nn.Linear(512, 256)
        self.outputs: list[torch.Tensor] = []
        serve_agent(workers_period=0.1)  # this worker's own agent, registered in the folder

    def decode_request(self, request):  # type: ignore[no-untyped-def]  # unannotated: LitServe then hands it the JSON body
        return request["inputs"]

    def predict(self, inputs: Any) -> dict[str, float]:
        return run_model(self.model, inputs, self.outputs)

    def encode_response(self, output: dict[str, float]) -> dict[str, float]:
        return output


def litserve(port: int) -> None:
    server = ls.LitServer(
        Model(),
        accelerator="cpu",
        workers_per_device=2,
        middlewares=[(LeaklabDebug, {"workers_period": 0.1})],
    )
    server.run(host="127.0.0.1", port=port, generate_client_file=False, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["litserve", "gunicorn", "uvicorn", "bentoml", "transformers"])
    parser.add_argument("--variant", choices=["leaky", "fixed"], required=True)
    args = parser.parse_args()
    if "LEAKLAB_WORKERS_DIR" not in os.environ:
        sys.exit("servers.py: set LEAKLAB_WORKERS_DIR, the folder the server's processes share")
    with socket.socket() as s:  # a free port, handed to the server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"{args.framework} {args.variant} listening on http://127.0.0.1:{port}", flush=True)
    global VARIANT
    VARIANT = os.environ["SERVERS_VARIANT"] = args.variant  # here, and in processes started afresh
    here = str(Path(__file__).resolve().parent)
    bind = f"127.0.0.1:{port}"
    if args.framework == "litserve":
        litserve(port)
    elif args.framework == "transformers":
        import uvicorn

        uvicorn.run(create_generation_app(), host="127.0.0.1", port=port, log_level="warning")
    elif args.framework == "gunicorn":
        worker = "uvicorn_worker.UvicornWorker"
        argv = ["-m", "gunicorn", "-w", "2", "-k", worker, "-b", bind, "--chdir", here, "servers:create_app()"]
        os.execv(sys.executable, [sys.executable, *argv])
    elif args.framework == "bentoml":
        os.environ["BENTOML_DO_NOT_TRACK"] = "true"  # no usage report sent home
        argv = ["-m", "bentoml", "serve", "bento_service:Model", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--working-dir", here]
        os.execv(sys.executable, [sys.executable, *argv])
    else:
        argv = ["-m", "uvicorn", "--workers", "2", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--app-dir", here, "--log-level", "warning", "--factory", "servers:create_app"]
        os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main()
