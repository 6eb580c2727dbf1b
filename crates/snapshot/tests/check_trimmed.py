"""Reads a trimmed snapshot the way PyTorch's tools do, and prints what they found as JSON, for
crates/snapshot/tests/pytorch_format.rs: Python's pickle, torch.cuda._memory_viz's segsum and
trace (which raise on a snapshot whose accounting is off), its flamegraph text, and the HTML
of trace_plot and segment_plot (which embed the pickle for the browser viewer). It also lists
the file's opcodes against those that MemoryViz.js's own unpickler knows (its `unpickle`
function, torch/utils/viz/MemoryViz.js), and its protocol against the 2 to 4 it accepts.

Usage: python check_trimmed.py FILE
"""

import json
import pickle
import pickletools
import sys

from torch.cuda import _memory_viz as viz

VIEWER_OPCODES = {
    "PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET", "BININT", "BININT1", "BININT2",
    "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "BINPUT", "SHORT_BINUNICODE", "STOP",
    "TUPLE2", "BINUNICODE", "EMPTY_TUPLE", "LONG_BINPUT", "DICT", "SETITEM", "SETITEMS", "BINFLOAT", "TUPLE1", "TUPLE3",
}

data = open(sys.argv[1], "rb").read()
ops = list(pickletools.genops(data))
snap = pickle.loads(data)
summary = viz.segsum(snap)
trace_text = viz.trace(snap)
flame = viz.memory(snap, format_flamegraph=lambda lines: lines) + viz.segments(snap, format_flamegraph=lambda lines: lines)
pages = [viz.trace_plot(snap), viz.segment_plot(snap)]
blocks = [b for s in snap["segments"] for b in s["blocks"]]
print(json.dumps({
    "protocol": ops[0][1] if ops[0][0].name == "PROTO" else None,
    "unknown_to_viewer": sorted({op.name for op, _, _ in ops} - VIEWER_OPCODES),
    "segments": len(snap["segments"]),
    "blocks": len(blocks),
    "reserved": sum(s["total_size"] for s in snap["segments"]),
    "allocated": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
    "trace_lengths": [len(t) for t in snap["device_traces"]],
    "segsum_lines": summary.count("\n"),
    "trace_lines": trace_text.count("\n"),
    "flamegraph_lines": flame.count("\n"),
    "pages": [len(p) for p in pages],
}))
