"""Exercise 1's bug in PyTorch: the forward pass records a graph, and a tensor statistic keeps it.

    total = total + y.mean()        # every request's graph hangs off `total`

Fix: `with torch.inference_mode():` around the forward, `total += y.mean().item()`.
"""
import torch


def handle(model, x, state):
    y = model(x)  # LEAK(graph): autograd records the graph (weights require grad)
    state["total"] = state.get("total", 0) + y.mean()  # LEAK(graph): a tensor statistic chains every graph
    return y.detach().tolist()


def handle_fixed(model, x, state):
    with torch.inference_mode():  # FIX(graph): nothing recorded
        y = model(x)
    state["total"] = state.get("total", 0.0) + y.mean().item()  # FIX(graph): a float
    return y.tolist()
