//! Who holds the memory: live blocks grouped by the stack that allocated them, largest first,
//! named by the first frame in the user's own code; what was allocated after a point and never
//! freed; and the allocator's side, reserved but unallocated bytes per segment.

use crate::model::{Action, BlockState, Frame, Snapshot, Stack};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// Frames that are PyTorch's, the Python runtime's or the C++ plumbing's, not the user's:
/// skipped when naming the line that holds memory (the same spirit as `_memory_viz`'s filter).
pub fn is_internal(frame: &Frame) -> bool {
    // Rust and C++ native stacks (leaklab's own snapshots, `stacks="all"`) add crates from the
    // cargo registry, the standard library's sources, glibc's, and objects without line tables.
    const FILES: [&str; 21] = [
        "/torch/", "site-packages/", "dist-packages/", "<frozen ", "/lib/python3", "/usr/lib/", "core/boxing", "/Register", "/Redispatch",
        "pythonrun.c", "ceval.c", "Objects/", "Modules/", "/aten/", "/c10/", "/rustc/", "/.cargo/registry/", "/.cargo/git/", "/rustlib/",
        "nptl/", "sysdeps/",
    ];
    const NAMES: [&str; 8] = ["unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start", "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_"];
    let file = &*frame.filename;
    // Profile-converted snapshots name C functions and modules without a file.
    let unplaced = file == "none" && (frame.name.starts_with("<built-in") || frame.name.starts_with("nn.Module:") || frame.name.starts_with("aten::"));
    // A native frame without line tables is placed in its object file (an executable or a
    // shared library, never a source file): library code the user did not write.
    const SOURCES: [&str; 9] = [".rs", ".py", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu"];
    let object = frame.line == 0 && file.starts_with('/') && !SOURCES.iter().any(|ext| file.ends_with(ext));
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
    /// The frames that identify a stack in this view: the user's frames, or all of them when
    /// the stack has no user frame at all (so it is not lumped with every other such stack).
    pub fn frames(&self, stack: &Stack) -> Vec<Frame> {
        if self.all_frames {
            return stack.to_vec();
        }
        let user: Vec<Frame> = stack.iter().filter(|f| !is_internal(f)).cloned().collect();
        if user.is_empty() {
            stack.to_vec()
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

/// Groups `(stack, bytes)` pairs by their frames in `view`, largest first.
pub fn group<'a>(items: impl IntoIterator<Item = (&'a Stack, u64)>, view: View) -> Vec<Holder> {
    let mut by_stack: HashMap<*const [Frame], (Vec<Frame>, u64, u64)> = HashMap::new();
    for (stack, bytes) in items {
        let entry = by_stack.entry(std::rc::Rc::as_ptr(stack)).or_insert_with(|| (view.frames(stack), 0, 0));
        entry.1 += bytes;
        entry.2 += 1;
    }
    // Interned stacks that differ only in filtered-out frames fold together here.
    let mut merged: HashMap<Vec<Frame>, (u64, u64)> = HashMap::new();
    for (_, (frames, bytes, blocks)) in by_stack {
        let e = merged.entry(frames).or_default();
        e.0 += bytes;
        e.1 += blocks;
    }
    let mut holders: Vec<Holder> = merged
        .into_iter()
        .map(|(frames, (bytes, blocks))| Holder {
            site: frames.first().map_or("<no stack recorded>".into(), site),
            bytes,
            blocks,
            stack: frames.iter().skip(1).map(site).collect(),
        })
        .collect();
    holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    holders
}

/// A point in the trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Since {
    /// An event's index in the device's trace.
    Event(usize),
    /// Seconds after the trace's first event.
    Seconds(f64),
}

impl std::str::FromStr for Since {
    type Err = String;
    fn from_str(s: &str) -> Result<Since, String> {
        if let Some(t) = s.strip_suffix('s') {
            return t.parse().map(Since::Seconds).map_err(|_| format!("`{s}`: a time is seconds after the first event, e.g. 12.5s"));
        }
        s.parse().map(Since::Event).map_err(|_| format!("`{s}`: give an event index (e.g. 1200) or seconds after the first event (e.g. 12.5s)"))
    }
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
    let mut live = Vec::new();
    let mut fragmented = Vec::new();
    for seg in &snapshot.segments {
        reserved += seg.total_size;
        let mut seg_alloc = 0;
        let mut largest_free = 0;
        for b in &seg.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    allocated += b.size;
                    seg_alloc += b.size;
                    live.push((&b.stack, b.size));
                }
                BlockState::ActivePendingFree => {
                    pending += b.size;
                    seg_alloc += b.size;
                }
                BlockState::Inactive => largest_free = largest_free.max(b.size),
            }
        }
        let unallocated = seg.total_size.saturating_sub(seg_alloc);
        if unallocated > 0 {
            fragmented.push(SegmentUse { address: seg.address, segment_type: seg.segment_type.to_string(), reserved: seg.total_size, allocated: seg_alloc, unallocated, largest_free_block: largest_free });
        }
    }
    fragmented.sort_by(|a, b| b.unallocated.cmp(&a.unallocated).then(a.address.cmp(&b.address)));
    fragmented.truncate(10);
    let trace: &[crate::model::TraceEntry] = snapshot.traces.iter().max_by_key(|t| t.len()).map_or(&[], Vec::as_slice);
    let since = since.map(|point| {
        let from = match point {
            Since::Event(i) => i.min(trace.len()),
            Since::Seconds(s) => {
                let t0 = trace.iter().find_map(|e| e.time_us).unwrap_or(0);
                let cut = t0 + (s * 1e6) as i64;
                trace.iter().position(|e| e.time_us.is_some_and(|t| t >= cut)).unwrap_or(trace.len())
            }
        };
        let kept = allocated_and_kept(&trace[from..]);
        SinceReport { from_event: from, events: trace.len() - from, bytes: kept.iter().map(|(_, b)| b).sum(), holders: group(kept, view) }
    });
    Explanation {
        segments: snapshot.segments.len(),
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        pending_free_bytes: pending,
        unallocated_bytes: reserved.saturating_sub(allocated + pending),
        holders: group(live, view),
        fragmented_segments: fragmented,
        since,
        trace_events: trace.len(),
    }
}

/// The allocations in `events` with no free after them: memory that crossed the point.
fn allocated_and_kept(events: &[crate::model::TraceEntry]) -> Vec<(&Stack, u64)> {
    let mut live: HashMap<u64, (&Stack, u64)> = HashMap::new();
    for e in events {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, (&e.stack, e.size));
            }
            // The tensor let go of it: it no longer holds memory, whatever the stream does.
            Action::FreeRequested | Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    live.into_values().collect()
}

/// Blocks live in `after` and not in `before`: the memory that accumulated between the two.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Difference {
    pub bytes: u64,
    pub blocks: u64,
    /// `bytes / (after_requests - before_requests)`, when the request counts are known.
    pub bytes_per_request: Option<f64>,
    pub holders: Vec<Holder>,
    /// Live bytes in each snapshot.
    pub before_bytes: u64,
    pub after_bytes: u64,
}

pub fn diff(before: &Snapshot, after: &Snapshot, view: View, requests: Option<(u64, u64)>) -> Difference {
    let live = |s: &Snapshot| s.segments.iter().flat_map(|seg| seg.blocks.iter()).filter(|b| b.state == BlockState::ActiveAllocated).cloned().collect::<Vec<_>>();
    let (old, new) = (live(before), live(after));
    let seen: HashSet<(u64, u64, &[Frame])> = old.iter().map(|b| (b.address, b.size, &*b.stack)).collect();
    let added: Vec<_> = new.iter().filter(|b| !seen.contains(&(b.address, b.size, &*b.stack))).collect();
    let bytes: u64 = added.iter().map(|b| b.size).sum();
    Difference {
        bytes,
        blocks: added.len() as u64,
        bytes_per_request: requests.filter(|(a, b)| b > a).map(|(a, b)| bytes as f64 / (b - a) as f64),
        holders: group(added.iter().map(|b| (&b.stack, b.size)), view),
        before_bytes: old.iter().map(|b| b.size).sum(),
        after_bytes: new.iter().map(|b| b.size).sum(),
    }
}
