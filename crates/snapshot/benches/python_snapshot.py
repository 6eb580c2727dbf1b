"""Writes a snapshot-shaped pickle of about SIZE_MB with CPython's own pickle, for measuring
`leaklab snapshot explain` on bytes this project's writers did not produce (docs/benchmarks.md).

- shared: recent PyTorch's shape. Frame dicts, keys, states and actions are shared objects,
  which pickle writes once and then references through the memo; a third of the file is
  segments, the rest one device's trace.
- fresh: older writers' shape. Every block and event gets new frame dicts with new strings.
- segments: many segments of two to four blocks each, shared frames, a short trace.

Building the dict takes about five times the pickle's size in memory; run one at a time.

Usage: python python_snapshot.py OUT.pickle SIZE_MB shared|fresh|segments [PROTOCOL]
"""

import pickle
import sys

out, size_mb, shape = sys.argv[1], int(sys.argv[2]), sys.argv[3]
protocol = int(sys.argv[4]) if len(sys.argv) > 4 else pickle.DEFAULT_PROTOCOL
target = size_mb << 20

FILES = [f"/srv/app/.venv/lib/python3.11/site-packages/torch/nn/modules/{m}.py" for m in ("module", "linear", "conv", "activation")]
FILES += [f"/srv/app/service/handlers_{i}.py" for i in range(12)] + ["/usr/lib/python3.11/asyncio/events.py"]
FRAMES = [{"filename": FILES[i % len(FILES)], "line": 10 + (i * 37) % 1500, "name": f"function_{i % 97}"} for i in range(3000)]
STACKS = [[(s * 31 + j * 7) % 3000 for j in range(8 + s % 17)] for s in range(600)]


def stack(s):
    if shape == "fresh":
        return [{k.encode().decode(): (v.encode().decode() if isinstance(v, str) else v) for k, v in FRAMES[i].items()} for i in STACKS[s]]
    return [FRAMES[i] for i in STACKS[s]]


# Bytes per block and per event as pickled, measured on a sample, to size the lists.
def sample_bytes(items):
    return len(pickle.dumps(items, protocol=protocol)) / len(items)


segments, address = [], 0x7F0000000000
blocks_per_segment = (2, 4) if shape == "segments" else (8, 64)


def segment(n):
    global address
    count = blocks_per_segment[0] + n % (blocks_per_segment[1] - blocks_per_segment[0] + 1)
    blocks, offset = [], 0
    for b in range(count):
        size = 512 * (1 + (n * 64 + b) * 2654435761 % 4096)
        state = ("active_allocated", "active_allocated", "active_allocated", "inactive", "active_pending_free")[(n + b) % 5]
        blocks.append({"address": address + offset, "size": size, "requested_size": size - (n + b) % 512, "state": state,
                       "frames": stack((n * 131 + b) % 600) if state != "inactive" else []})
        offset += size
    seg = {"device": 0, "address": address, "total_size": offset, "allocated_size": offset // 2, "active_size": offset // 2,
           "requested_size": offset // 2, "stream": 0, "segment_type": "large" if offset > 1 << 20 else "small",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
    address += offset
    return seg


def event(i, action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1_700_000_000_000_000 + 3 * i,
            "frames": stack((i * 7) % 600), "compile_context": "N/A", "user_metadata": ""}


share = 0.995 if shape == "segments" else 0.33
per_segment = sample_bytes([segment(n) for n in range(200)])
segments = [segment(n) for n in range(int(target * share / per_segment))]
trace = []
events = [event(i, a, 0x7E0000000000 + (i % 4096) * 4096, 512 * (1 + i % 2048)) for i, a in enumerate(("alloc", "free_requested", "free_completed") * 100)]
per_event = sample_bytes(events)
for i in range(int(target * (1 - share) / per_event)):
    r, k = divmod(i, 3)
    kept = r % 33 == 0
    action = ("alloc", "free_requested", "free_completed")[k] if not kept else "alloc"
    trace.append(event(i, action, 0x7E0000000000 + (r % 4096) * 4096 + (r if kept else 0) * (1 << 24), 512 * (1 + r % 2048)))
with open(out, "wb") as f:
    pickle.dump({"segments": segments, "device_traces": [trace], "allocator_settings": {"expandable_segments": False}}, f, protocol=protocol)
