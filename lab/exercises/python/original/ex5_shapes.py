"""Exercise 5: a conv service fed images of many sizes (oneDNN's per-shape primitive cache).

The service answers each image with the net's output averaged over its pixels, one figure per
channel. On CPU, PyTorch runs the convolutions through oneDNN, which compiles a kernel for
every new input shape and keeps it in a cache (1,024 entries); no Python object holds that
memory, so a tensor census and ``tracemalloc`` see nothing: only the process grows.

Fix it so that memory stops growing with new sizes and every answer stays the same.
``cargo xtask lab check 5`` checks both. The zoo's entries ``onednn_cache`` and
``shape_cache_capped`` (lab/zoo/, docs/zoo.md) tell the cause.
"""

# No `from __future__ import annotations`: FastAPI reads the handler's annotations.
from typing import Annotated, Any

from _contract import features, image, shapes_net


def make_app() -> Any:
    import torch
    from fastapi import Body, FastAPI, HTTPException

    net = shapes_net()
    app = FastAPI(title="exercise 5: images of many sizes")

    @app.post("/predict")
    async def predict(body: Annotated[Any, Body()]) -> dict[str, Any]:
        try:
            x = image(body)
        except (TypeError, ValueError) as e:
            raise HTTPException(status_code=422, detail=str(e)) from e
        with torch.inference_mode():
            # LEAK(shape_cache): every (H, W) not seen before makes oneDNN compile and cache
            # new conv kernels, about 300 kB a size, until 1,024 entries.
            y = net(x)
        return {"features": features(y)}

    return app
