"""Writes the snapshot pickles that crates/snapshot/tests/pytorch_format.rs reads.

- profiled.pickle: a real snapshot that PyTorch itself builds (torch.cuda._memory_viz.
  _profile_to_snapshot, the CPU-capable path to the same format) of a service loop that keeps
  every output in a history list, plus profiled.oracle.json with what PyTorch's data says.
- handmade_p{0,2,4,5}.pickle: the dict of torch.cuda.memory._snapshot()'s docstring, with every
  block state and trace action, unknown keys and an unknown action from a "newer PyTorch",
  pickled at four protocols; before.pickle/after.pickle: the same service 100 and 600 requests in.
- shaped_{shared,fresh}_p{0..5}.pickle: a snapshot-shaped dict pickled by Python's own pickle at
  every protocol, its frame dicts either shared objects (which pickle memoizes: recent PyTorch's
  shape) or new objects with new strings for every block and event (older writers'); three
  devices, one with an empty trace; addresses and sizes wider than 8 bytes; plus
  shaped.oracle.json, what the dict holds, computed here, and checked against PyTorch's own
  _memory_viz.segsum and trace (which raise on a malformed snapshot).
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
# --- Python's pickle of snapshot-shaped dicts, shared and fresh frames, every protocol --------
from torch.cuda._memory_viz import segsum, trace as viz_trace

FILES = [f"/srv/app/handlers_{i}.py" for i in range(6)] + [TORCH, "/usr/lib/python3.11/asyncio/events.py"]
FRAMES = [(FILES[i % len(FILES)], 10 + 7 * i, f"step_{i % 9}") for i in range(30)]
STACKS = [[(k * 7 + j) % 30 for j in range(1 + k % 6)] for k in range(12)]


def shaped(shared):
    shared_frames = [frame(*f) for f in FRAMES]
    shared_stacks = [[shared_frames[i] for i in s] for s in STACKS]

    def fresh(text):
        return text.encode().decode()  # a new str object: pickle writes it again

    def stack(k):
        if shared:
            return shared_stacks[k]
        return [{fresh(key): (fresh(v) if isinstance(v, str) else v) for key, v in frame(*FRAMES[i]).items()} for i in STACKS[k]]

    segments, traces = [], [[], [], []]
    address = 0x7F0000000000
    for n in range(40):
        if n == 39:
            address = (1 << 63) + 0x1000  # an address that needs nine bytes
        sizes = [512 * (1 + (n * 5 + b * 3) % 97) for b in range(1 + n % 5)]
        states = ["active_allocated", "active_allocated", "inactive", "active_pending_free"]
        blocks, offset = [], 0
        for b, size in enumerate(sizes):
            state = states[(n + b) % 4]
            blocks.append({"address": address + offset, "size": size, "requested_size": size - (n % 7) * 8 if state != "inactive" else 0,
                           "state": state, "frames": stack((n + b) % 12) if state != "inactive" else []})
            offset += size
        segments.append({"device": n % 3, "address": address, "total_size": offset, "allocated_size": 0, "active_size": 0, "requested_size": 0,
                         "stream": 0 if n % 2 else 94523674563456, "segment_type": "large" if offset > 1 << 20 else "small",
                         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
        address += offset
    t = 1_700_000_000_000_000
    for d in (0, 2):  # device 1 records nothing
        for r in range(1500):
            addr = 0x7E0000000000 + (r % 64) * 4096 if r % 50 else (1 << 64) - 4096 * (r + 1)
            t += 3
            traces[d].append({"action": "alloc", "addr": addr, "size": 512 * (1 + r % 13), "stream": 0, "time_us": t, "frames": stack(r % 12),
                              "compile_context": "N/A", "user_metadata": ""})
            if r % 17:  # every seventeenth allocation is kept
                for action in ("free_requested", "free_completed"):
                    t += 1
                    traces[d].append({"action": action, "addr": addr, "size": 512 * (1 + r % 13), "stream": 0, "time_us": t, "frames": stack(r % 12),
                                      "compile_context": "N/A", "user_metadata": ""})
        traces[d].append({"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0, "time_us": t + 5, "device_free": (1 << 64) - 1, "frames": stack(0)})
    return {"segments": segments, "device_traces": traces, "allocator_settings": {"max_split_size": -1, "roundup_power2_divisions": {"1": 1}},
            "external_annotations": [{"device": 0, "stage": "START", "name": "forward", "time_us": t}]}


def survivors(events, since):
    """The allocations from event `since` on that nothing freed: each address's last alloc or free."""
    live = {}
    for e in events[since:]:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] in ("free_requested", "free_completed"):
            live.pop(e["addr"], None)
    return sum(live.values())


def site(f):
    return f"{f['filename']}:{f['line']} in {f['name']}"


reference = shaped(True)
segsum(reference)  # PyTorch's own reader raises if the segments do not add up
viz_trace(reference)
active = [b for s in reference["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
holders = {}
for b in active:
    key = (site(b["frames"][0]), tuple(site(f) for f in b["frames"][1:]))
    bytes_, blocks = holders.get(key, (0, 0))
    holders[key] = (bytes_ + b["size"], blocks + 1)
since = len(reference["device_traces"][2]) // 2
json.dump({"reserved": sum(s["total_size"] for s in reference["segments"]),
           "allocated": sum(b["size"] for b in active),
           "pending": sum(b["size"] for s in reference["segments"] for b in s["blocks"] if b["state"] == "active_pending_free"),
           "blocks": sum(len(s["blocks"]) for s in reference["segments"]),
           "trace_lengths": [len(t) for t in reference["device_traces"]],
           "since": since, "since_bytes": survivors(reference["device_traces"][2], since),
           "holders": sorted([[b, n, s, list(rest)] for (s, rest), (b, n) in holders.items()], key=lambda h: (-h[0], h[2]))},
          open(os.path.join(out, "shaped.oracle.json"), "w"))
for sharing in ("shared", "fresh"):
    for proto in range(6):
        with open(os.path.join(out, f"shaped_{sharing}_p{proto}.pickle"), "wb") as f:
            pickle.dump(shaped(sharing == "shared"), f, protocol=proto)

data = pickle.dumps(snapshot(100))
open(os.path.join(out, "truncated.pickle"), "wb").write(data[: len(data) // 2])
open(os.path.join(out, "not_a_pickle.pickle"), "wb").write(b"this is a text file, not a pickle\n")
open(os.path.join(out, "a_list.pickle"), "wb").write(pickle.dumps([1, 2, 3]))
open(os.path.join(out, "a_tensor.pickle"), "wb").write(pickle.dumps(torch.ones(3)))
