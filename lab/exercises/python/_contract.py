"""What exercises 5 and 6 promise, kept out of the files the learner edits.

The models (their weights seeded), how a request's body becomes a tensor, the bodies the scan
sends and the inputs the check verifies the answers on, and the true answer for a body (the
model run on the body's own input, on this thread, under ``inference_mode``). The learner's
service imports the models and decoders from here; ``_check.py`` computes the true answers
from here, so a change to the learner's file cannot change what "right" means.
"""

from __future__ import annotations

import random
from typing import Any, TypeGuard

# Exercise 5: images of many sizes. Every side from 16 to 71 (3,136 sizes), in a fixed
# shuffled order, so that request i below 3,136 has a size no earlier request had.
SIDE_MIN, SIDES = 16, 56
_ORDER = random.Random(27971).sample(range(SIDES * SIDES), SIDES * SIDES)
# Four 3x3 convolutions without padding ("valid"): each trims one pixel from every border.
LAYERS = 4
TRIM = 2 * LAYERS

# Exercise 6: a batch of 8 rows of 64 features.
ROWS, FEATURES, HIDDEN, OUTPUTS = 8, 64, 512, 16


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def shape_body(i: int) -> dict[str, Any]:
    """Request i's body for exercise 5: an image size no earlier request had (i < 3,136)."""
    k = _ORDER[i % len(_ORDER)]
    return {"h": SIDE_MIN + k // SIDES, "w": SIDE_MIN + k % SIDES, "seed": i}


def shapes_net() -> Any:
    """Exercise 5's net: four valid 3x3 convolutions, seeded, in eval mode, one thread.

    Output pixel (r, c) of an H x W image depends on input rows r..r+8 and columns c..c+8 only,
    so the output for an image is the top-left (H-8) x (W-8) corner of the output for the same
    image with anything appended below and to the right of it."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3),
        nn.ReLU(),
        nn.Conv2d(64, 32, 3),
    )
    return net.eval()


def image(body: Any) -> Any:
    """The request's 1x3xHxW image, its pixels drawn from the body's seed (bodies stay small);
    TypeError or ValueError, said plainly, for a body that does not name a size."""
    import torch

    if not isinstance(body, dict):
        raise TypeError(
            'the body must be a JSON object such as {"h": 32, "w": 48, "seed": 0}'
        )
    h, w, seed = body.get("h"), body.get("w"), body.get("seed", 0)
    if not (_is_int(h) and _is_int(w) and _is_int(seed)):
        raise TypeError(f"h, w and seed must be integers, got {h!r}, {w!r}, {seed!r}")
    if not (TRIM + 1 <= h <= 512 and TRIM + 1 <= w <= 512):
        raise ValueError(
            f"image size {h}x{w} is out of range: give {TRIM + 1} <= h, w <= 512"
        )
    return torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(seed))


def features(y: Any) -> list[float]:
    """Exercise 5's answer: the net's output map averaged over its pixels, one figure per
    channel (32)."""
    return [float(v) for v in y.mean(dim=(2, 3))[0]]


def mlp() -> Any:
    """Exercise 6's model: an MLP whose weights require grad, as a loaded module's do."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUTPUTS),
    ).eval()


def batch_body(i: int) -> dict[str, Any]:
    """Request i's body for exercise 6: 8 rows of 64 features, different for every i."""
    rng = random.Random(i)
    return {
        "inputs": [
            [rng.uniform(-1.0, 1.0) for _ in range(FEATURES)] for _ in range(ROWS)
        ]
    }


def body(exercise: int, i: int) -> dict[str, Any]:
    """Request i's body for an exercise (5 or 6)."""
    if exercise == 5:
        return shape_body(i)
    if exercise == 6:
        return batch_body(i)
    raise ValueError(f"no Python exercise {exercise}: 5 or 6")


def truth(exercise: int, b: dict[str, Any], model: Any) -> list[float]:
    """The right answer to body b: the model on the body's own input, nothing cached."""
    import torch

    with torch.inference_mode():
        if exercise == 5:
            return features(model(image(b)))
        y = model(torch.tensor(b["inputs"]))
        return [float(v) for v in y.flatten()]
