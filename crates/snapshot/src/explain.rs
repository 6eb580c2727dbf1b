//! Who holds the memory: live blocks grouped by the stack that allocated them, largest first,
//! named by the first frame in the user's own code; what was allocated after a point and never
//! freed; and the allocator's side, reserved but unallocated bytes per segment.

use crate::model::{cut, BlockState, Frame, Since, Snapshot, StackId, Survivor, Trace};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::HashMap;

/// Frames that are PyTorch's, the Python runtime's or the C++ plumbing's, not the user's:
/// skipped when naming the line that holds memory (the same spirit as `_memory_viz`'s filter).
pub fn is_internal(frame: &Frame) -> bool {
    // Rust and C++ native stacks (leaklab's own snapshots, `stacks="all"`) add crates from the
    // cargo registry, the standard library's sources, glibc's, and objects without line tables.
    const FILES: [&str; 21] = [
        "/torch/",
        "site-packages/",
        "dist-packages/",
        "<frozen ",
        "/lib/python3",
        "/usr/lib/",
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "ceval.c",
        "Objects/",
        "Modules/",
        "/aten/",
        "/c10/",
        "/rustc/",
        "/.cargo/registry/",
        "/.cargo/git/",
        "/rustlib/",
        "nptl/",
        "sysdeps/",
    ];
    const NAMES: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    let file = &*frame.filename;
    // Profile-converted snapshots name C functions and modules without a file.
    let unplaced = file == "none"
        && (frame.name.starts_with("<built-in")
            || frame.name.starts_with("nn.Module:")
            || frame.name.starts_with("aten::"));
    // A native frame without line tables is placed in its object file (an executable or a
    // shared library, never a source file): library code the user did not write.
    const SOURCES: [&str; 9] = [
        ".rs", ".py", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu",
    ];
    let object =
        frame.line == 0 && file.starts_with('/') && !SOURCES.iter().any(|ext| file.ends_with(ext));
    file.is_empty()
        || file == "??"
        || object
        || unplaced
        || file.starts_with("torch/")
        || FILES.iter().any(|f| file.contains(f))
        || NAMES.iter().any(|n| frame.name.contains(n))
}

/// How holders are grouped and named.
#[derive(Debug, Clone, Copy, Default)]
pub struct View {
    /// Keep every frame (torch internals, the standard library) in the grouping and the stack.
    pub all_frames: bool,
}

impl View {
    /// The frames that identify a stack in this view, as indexes into the snapshot's frame
    /// table: the user's frames, or all of them when the stack has no user frame at all (so it
    /// is not lumped with every other such stack).
    pub fn frames(&self, snapshot: &Snapshot, stack: StackId) -> Vec<u32> {
        let all = snapshot.stack_frames(stack);
        if self.all_frames {
            return all.to_vec();
        }
        let user: Vec<u32> = all
            .iter()
            .copied()
            .filter(|&f| !is_internal(snapshot.frame(f)))
            .collect();
        if user.is_empty() {
            all.to_vec()
        } else {
            user
        }
    }
}

/// Memory held by one stack.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Holder {
    /// `file:line in function` of the first frame in the user's code (or the innermost frame).
    pub site: String,
    pub bytes: u64,
    pub blocks: u64,
    /// The rest of the stack, innermost first, in the view's frames.
    pub stack: Vec<String>,
}

pub fn site(frame: &Frame) -> String {
    format!("{}:{} in {}", frame.filename, frame.line, frame.name)
}

/// Groups `(stack, bytes)` pairs of `snapshot` by their frames in `view`, largest first.
pub fn group(
    snapshot: &Snapshot,
    items: impl IntoIterator<Item = (StackId, u64)>,
    view: View,
) -> Vec<Holder> {
    let mut by_stack: FxHashMap<StackId, (u64, u64)> = FxHashMap::default();
    for (stack, bytes) in items {
        let e = by_stack.entry(stack).or_default();
        e.0 += bytes;
        e.1 += 1;
    }
    holders(snapshot, by_stack, view)
}

/// Holders from bytes and blocks per stack.
fn holders(
    snapshot: &Snapshot,
    by_stack: FxHashMap<StackId, (u64, u64)>,
    view: View,
) -> Vec<Holder> {
    // Interned stacks that differ only in filtered-out frames fold together here.
    let mut merged: HashMap<Vec<u32>, (u64, u64)> = HashMap::new();
    for (stack, (bytes, blocks)) in by_stack {
        let e = merged.entry(view.frames(snapshot, stack)).or_default();
        e.0 += bytes;
        e.1 += blocks;
    }
    let mut holders: Vec<Holder> = merged
        .into_iter()
        .map(|(frames, (bytes, blocks))| Holder {
            site: frames
                .first()
                .map_or("<no stack recorded>".into(), |&f| site(snapshot.frame(f))),
            bytes,
            blocks,
            stack: frames
                .iter()
                .skip(1)
                .map(|&f| site(snapshot.frame(f)))
                .collect(),
        })
        .collect();
    holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    holders
}

/// The allocator's view of one segment: what it reserved and how much of it is in use.
#[derive(Debug, Clone, Serialize)]
pub struct SegmentUse {
    pub address: u64,
    pub segment_type: String,
    pub reserved: u64,
    pub allocated: u64,
    /// Reserved but not allocated: what `empty_cache` could return if the segment were empty,
    /// and fragmentation when it is not.
    pub unallocated: u64,
    pub largest_free_block: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub segments: usize,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub pending_free_bytes: u64,
    /// Reserved minus allocated minus pending.
    pub unallocated_bytes: u64,
    /// Live memory by allocating stack, largest first.
    pub holders: Vec<Holder>,
    /// Segments with the most reserved-but-unallocated bytes, largest first.
    pub fragmented_segments: Vec<SegmentUse>,
    /// With a trace and a point: what was allocated after the point and never freed.
    pub since: Option<SinceReport>,
    pub trace_events: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SinceReport {
    pub from_event: usize,
    pub events: usize,
    pub bytes: u64,
    pub holders: Vec<Holder>,
}

pub fn explain(snapshot: &Snapshot, view: View, since: Option<Since>) -> Explanation {
    let mut reserved = 0;
    let mut allocated = 0;
    let mut pending = 0;
    // Bytes and blocks per stack; stack ids are dense, so a vector rather than a map.
    let mut live: Vec<(u64, u64)> = vec![(0, 0); snapshot.stack_count()];
    // The ten segments with the most reserved-but-unallocated bytes, kept as they come: a
    // snapshot may have millions of segments.
    let mut fragmented: Vec<SegmentUse> = Vec::with_capacity(11);
    for seg in &snapshot.segments {
        reserved += seg.total_size;
        let mut seg_alloc = 0;
        let mut largest_free = 0;
        for b in snapshot.blocks(seg) {
            match b.state {
                BlockState::ActiveAllocated => {
                    allocated += b.size;
                    seg_alloc += b.size;
                    if let Some(e) = live.get_mut(b.stack.0 as usize) {
                        e.0 += b.size;
                        e.1 += 1;
                    }
                }
                BlockState::ActivePendingFree => {
                    pending += b.size;
                    seg_alloc += b.size;
                }
                BlockState::Inactive => largest_free = largest_free.max(b.size),
            }
        }
        let unallocated = seg.total_size.saturating_sub(seg_alloc);
        let order = |u: &SegmentUse| (std::cmp::Reverse(u.unallocated), u.address);
        if unallocated > 0
            && (fragmented.len() < 10
                || (std::cmp::Reverse(unallocated), seg.address) < order(&fragmented[9]))
        {
            let at = fragmented
                .partition_point(|u| order(u) <= (std::cmp::Reverse(unallocated), seg.address));
            fragmented.insert(
                at,
                SegmentUse {
                    address: seg.address,
                    segment_type: snapshot.segment_type(seg).to_string(),
                    reserved: seg.total_size,
                    allocated: seg_alloc,
                    unallocated,
                    largest_free_block: largest_free,
                },
            );
            fragmented.truncate(10);
        }
    }
    let trace = longest_trace(snapshot);
    let since = since.map(|point| {
        let from = trace.map_or(0, |t| position(t, point));
        let kept = trace.map_or(&[][..], |t| survivors_from(t, from));
        SinceReport {
            from_event: from,
            events: trace.map_or(0, |t| t.len() - from),
            bytes: kept.iter().map(|s| s.size).sum(),
            holders: group(snapshot, kept.iter().map(|s| (s.stack, s.size)), view),
        }
    });
    Explanation {
        segments: snapshot.segments.len(),
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        pending_free_bytes: pending,
        unallocated_bytes: reserved.saturating_sub(allocated + pending),
        holders: holders(
            snapshot,
            live.into_iter()
                .enumerate()
                .filter(|(_, (_, n))| *n > 0)
                .map(|(id, e)| (StackId(id as u32), e))
                .collect(),
            view,
        ),
        fragmented_segments: fragmented,
        since,
        trace_events: trace.map_or(0, Trace::len),
    }
}

/// The trace `explain` reads: the longest (the last of equals), as devices other than the one
/// in use record little.
pub fn longest_trace(snapshot: &Snapshot) -> Option<&Trace> {
    snapshot.traces.iter().max_by_key(|t| t.len())
}

/// The index of the first event at or after `point` in `trace` (its length if none is).
pub fn position(trace: &Trace, point: Since) -> usize {
    match point {
        Since::Event(i) => i.min(trace.len()),
        Since::Seconds(s) => {
            let cut = cut(trace.times.first_time().unwrap_or(0), s);
            trace
                .times
                .first_at_or_after(cut)
                .map_or(trace.len(), |i| i as usize)
        }
    }
}

/// The allocations from event `from` on that nothing freed: memory that crossed the point.
fn survivors_from(trace: &Trace, from: usize) -> &[Survivor] {
    let start = trace.survivors.partition_point(|s| s.index < from as u64);
    &trace.survivors[start..]
}
