"""Writes the snapshot pickles that crates/snapshot/tests/pytorch_format.rs reads.

- profiled.pickle: a real snapshot that PyTorch itself builds (torch.cuda._memory_viz.
  _profile_to_snapshot, the CPU-capable path to the same format) of a service loop that keeps
  every output in a history list, plus profiled.oracle.json with what PyTorch's data says.
- handmade_p{0,2,4,5}.pickle: the dict of torch.cuda.memory._snapshot()'s docstring, with every
  block state and trace action, unknown keys and an unknown action from a "newer PyTorch",
  pickled at four protocols; before.pickle/after.pickle: the same service 100 and 600 requests in.
- Bad files: truncated, not a pickle, a pickle of a list, a pickled tensor.

Usage: python make_snapshots.py OUT_DIR
"""

import json
import os
import pickle
import sys

import torch
from torch.cuda._memory_viz import _profile_to_snapshot

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


# --- a real profile of a leaky loop -------------------------------------------------------
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
history = []


def keep_history(y):
    history.append(y)  # the leak: every output kept


def handle(x):
    with torch.inference_mode():
        y = model(x)
    keep_history(y)
    return y.sum().item()


with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
    for i in range(20):
        handle(torch.randn(16, 64))
snap = _profile_to_snapshot(prof)
with open(os.path.join(out, "profiled.pickle"), "wb") as f:
    pickle.dump(snap, f)
live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
by_frame = {}
for b in live:
    key = b["frames"][0]["name"] if b["frames"] else "<none>"
    by_frame[key] = by_frame.get(key, 0) + b["size"]
json.dump({"live_bytes": sum(b["size"] for b in live), "live_blocks": len(live), "kept_output_bytes": 20 * 16 * 64 * 4,
           "by_first_frame": by_frame}, open(os.path.join(out, "profiled.oracle.json"), "w"))


# --- the docstring's format, by hand ------------------------------------------------------
def frame(filename, line, name, **extra):
    return {"filename": filename, "line": line, "name": name, **extra}


TORCH = "/usr/lib/python3/site-packages/torch/nn/modules/linear.py"
SERVICE = "/srv/app/service.py"
HANDLER = [frame(TORCH, 125, "forward"), frame(SERVICE, 41, "predict"), frame(SERVICE, 88, "handle")]
METRICS = [frame(SERVICE, 57, "record_metrics", fx_node_op="call_function"), frame(SERVICE, 90, "handle")]
CACHE = [frame(TORCH, 200, "_conv_forward"), frame(SERVICE, 30, "features")]


def snapshot(requests):
    segments, trace, t = [], [], 1_700_000_000_000_000
    address = 0x7F0000000000
    # The cache filled to 8 entries early and stopped; the metrics history keeps 32 kB per request.
    kept = [(CACHE, 2 << 20) for _ in range(8)] + [(METRICS, 32768) for _ in range(requests)]
    for i in range(0, len(kept), 64):
        chunk = kept[i:i + 64]
        used = sum(size for _, size in chunk)
        total = max(20 << 20, used + (1 << 20))
        offsets = [sum(size for _, size in chunk[:j]) for j in range(len(chunk))]
        blocks = [{"address": address + offsets[j], "size": size, "requested_size": size - 16, "state": "active_allocated", "frames": frames}
                  for j, (frames, size) in enumerate(chunk)]
        blocks.append({"address": address + used, "size": 512 << 10, "requested_size": 0, "state": "active_pending_free", "frames": HANDLER})
        blocks.append({"address": address + used + (512 << 10), "size": total - used - (512 << 10), "requested_size": 0, "state": "inactive", "frames": []})
        segments.append({"device": 0, "address": address, "total_size": total, "stream": 0, "segment_type": "large",
                         "allocated_size": used, "active_size": used + (512 << 10), "segment_pool_id": (0, 0), "is_expandable": False,
                         "frames": [], "blocks": blocks})
        for b in blocks[:-2]:
            t += 50
            trace.append({"action": "alloc", "addr": b["address"], "size": b["size"], "stream": 0, "time_us": t, "frames": b["frames"],
                          "compile_context": "N/A", "user_metadata": ""})
        address += total
    # Transient activations: allocated and freed within each request.
    for r in range(requests):
        t += 100
        trace.append({"action": "alloc", "addr": 0x7E0000000000, "size": 1 << 20, "stream": 0, "time_us": t, "frames": HANDLER})
        trace.append({"action": "free_requested", "addr": 0x7E0000000000, "size": 1 << 20, "stream": 0, "time_us": t + 10, "frames": HANDLER})
        trace.append({"action": "free_completed", "addr": 0x7E0000000000, "size": 1 << 20, "stream": 0, "time_us": t + 20, "frames": HANDLER})
    trace.append({"action": "segment_alloc", "addr": address, "size": 2 << 20, "stream": 0, "time_us": t + 30, "frames": HANDLER})
    trace.append({"action": "segment_free", "addr": address, "size": 2 << 20, "stream": 0, "time_us": t + 40, "frames": HANDLER})
    trace.append({"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "time_us": t + 50, "device_free": 1 << 20, "frames": HANDLER})
    trace.append({"action": "future_action_from_a_newer_pytorch", "addr": 0, "size": 0, "stream": 0, "time_us": t + 60, "frames": []})
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {"expandable_segments": False}, "external_annotations": []}


for proto in (0, 2, 4, 5):
    with open(os.path.join(out, f"handmade_p{proto}.pickle"), "wb") as f:
        pickle.dump(snapshot(100), f, protocol=proto)
for name, requests in (("before", 100), ("after", 600)):
    with open(os.path.join(out, f"{name}.pickle"), "wb") as f:
        pickle.dump(snapshot(requests), f)
data = pickle.dumps(snapshot(100))
open(os.path.join(out, "truncated.pickle"), "wb").write(data[: len(data) // 2])
open(os.path.join(out, "not_a_pickle.pickle"), "wb").write(b"this is a text file, not a pickle\n")
open(os.path.join(out, "a_list.pickle"), "wb").write(pickle.dumps([1, 2, 3]))
open(os.path.join(out, "a_tensor.pickle"), "wb").write(pickle.dumps(torch.ones(3)))
