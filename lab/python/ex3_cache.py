"""Exercise 3's bug in PyTorch: a result cache that never evicts.

    cache[key] = y                  # one entry per distinct input, forever

Fix: an OrderedDict bounded by bytes (move_to_end on a hit, popitem(last=False) past the bound),
or functools.lru_cache(maxsize=...) around a function of hashable inputs.
"""
import collections

import torch


def handle(model, x, cache):
    key = hash(x.numpy().tobytes())
    if key not in cache:
        with torch.inference_mode():
            cache[key] = model(x)  # LEAK(cache): never evicted
    return cache[key].tolist()


def handle_fixed(model, x, cache: collections.OrderedDict, capacity_bytes=512 * 1024):
    key = hash(x.numpy().tobytes())
    if key in cache:
        cache.move_to_end(key)
        return cache[key].tolist()
    with torch.inference_mode():
        y = model(x)
    cache[key] = y
    while sum(t.numel() * t.element_size() for t in cache.values()) > capacity_bytes:
        cache.popitem(last=False)  # FIX(cache): evict the least recently used
    return y.tolist()
