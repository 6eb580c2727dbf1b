"""Exercise 2's bug in PyTorch: output tensors kept in a metrics history.

    history.append(y)               # keeps every output's storage alive

Fix: `history.append(y.detach().cpu().abs().max().item())` in a `deque(maxlen=1024)`.
"""
import collections

import torch


def handle(model, x, history):
    with torch.inference_mode():
        y = model(x)
    history.append(y)  # LEAK(refs): the tensor, not a number
    return y.tolist()


def handle_fixed(model, x, history: collections.deque):
    with torch.inference_mode():
        y = model(x)
    history.append(y.detach().cpu().abs().max().item())  # FIX(refs): a number, bounded by the deque
    return y.tolist()
