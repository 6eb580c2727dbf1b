"""Exercise 4's bug in PyTorch: the seed container, all three leaks in one handler.

This is the shape of the FastAPI service in the reference scenario (12 GB at start, +50 MB a
request on the GPU, OOM after 12 hours). Apply the three fixes of exercises 1 to 3.
"""


def handle(model, x, state):
    key = hash(x.numpy().tobytes())
    if key not in state["cache"]:
        state["cache"][key] = model(x)  # LEAK(cache) and LEAK(graph): unbounded, and with a graph
    y = state["cache"][key]
    state["total"] = state.get("total", 0) + y.mean()  # LEAK(graph): a tensor statistic
    state["history"].append(y)  # LEAK(refs): the tensor itself
    return y.detach().tolist()
# FIX(graph), FIX(refs), FIX(cache): see ex1_graph.py, ex2_refs.py and ex3_cache.py.
