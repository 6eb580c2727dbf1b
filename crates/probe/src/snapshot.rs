//! CPU memory history in the format of `torch.cuda.memory._snapshot()`, so a CPU run opens in
//! pytorch.org/memory_viz exactly like a CUDA one.
//!
//! The viewer reads a pickled dict with `segments` (what is alive now, as blocks inside
//! segments) and `device_traces` (one list of alloc/free events per device). The CPU allocator
//! has no segments of its own, so each live block is presented as a segment holding that one
//! block. Each block's and event's frames are its native call stack, innermost first and
//! resolved to function, file and line ([`crate::symbols`]) when stacks were recorded,
//! followed by one last frame that names the memory context (request stage) in which the block
//! was born. Everything is put under device 0.

use crate::context::MemoryContext;
use crate::cpu::{self, EventKind, StackId};
use crate::symbols;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    pub device_traces: Vec<Vec<TraceEntry>>,
    pub allocator_settings: AllocatorSettings,
}

#[derive(Debug, Serialize)]
pub struct AllocatorSettings {
    pub allocator: &'static str,
}

#[derive(Debug, Serialize)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: i64,
    pub segment_type: &'static str,
    pub segment_pool_id: (i64, i64),
    pub is_expandable: bool,
    pub frames: Vec<Frame>,
    pub blocks: Vec<Block>,
}

#[derive(Debug, Serialize)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: &'static str,
    /// Shared by every block and event of one stack (the pickle writes it once).
    pub frames: Arc<Vec<Frame>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    pub name: String,
    pub filename: String,
    pub line: i64,
}

#[derive(Debug, Serialize)]
pub struct TraceEntry {
    pub action: &'static str,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub time_us: i64,
    pub frames: Arc<Vec<Frame>>,
}

/// The frames of each distinct (stack, context) pair, resolved once per snapshot.
#[derive(Default)]
struct Frames {
    resolved: HashMap<(Option<StackId>, MemoryContext), Arc<Vec<Frame>>>,
}

impl Frames {
    fn of(&mut self, stack: Option<StackId>, context: MemoryContext) -> Arc<Vec<Frame>> {
        self.resolved
            .entry((stack, context))
            .or_insert_with(|| {
                let native = stack
                    .map(|id| symbols::resolve(&cpu::stack_addresses(id)))
                    .unwrap_or_default();
                let mut frames: Vec<Frame> = native
                    .into_iter()
                    .map(|f| Frame {
                        name: f.name,
                        filename: f.filename,
                        line: f.line,
                    })
                    .collect();
                frames.push(Frame {
                    name: context.name().to_string(),
                    filename: "leaklab (memory context)".into(),
                    line: 0,
                });
                Arc::new(frames)
            })
            .clone()
    }
}

/// The current CPU state: every live block, plus the recorded history (see
/// [`cpu::record_history`]; empty when it was never turned on).
pub fn cpu_snapshot() -> Snapshot {
    let mut frames = Frames::default();
    let segments = cpu::live_blocks()
        .into_iter()
        .map(|b| Segment {
            device: 0,
            address: b.addr,
            total_size: b.size,
            allocated_size: b.size,
            active_size: b.size,
            requested_size: b.size,
            stream: 0,
            segment_type: "large",
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: Vec::new(),
            blocks: vec![Block {
                address: b.addr,
                size: b.size,
                requested_size: b.size,
                state: "active_allocated",
                frames: frames.of(b.stack, b.context),
            }],
        })
        .collect();
    let mut trace = Vec::new();
    for e in cpu::history() {
        let actions: &[&'static str] = match e.kind {
            EventKind::Alloc => &["alloc"],
            // PyTorch records a free as requested, then completed once the stream is done.
            EventKind::Free => &["free_requested", "free_completed"],
        };
        for action in actions {
            trace.push(TraceEntry {
                action,
                addr: e.addr,
                size: e.size,
                stream: 0,
                time_us: e.time_us,
                frames: frames.of(e.stack, e.context),
            });
        }
    }
    Snapshot {
        segments,
        device_traces: vec![trace],
        allocator_settings: AllocatorSettings {
            allocator: "leaklab counting CPU allocator",
        },
    }
}

impl Snapshot {
    /// The pickle PyTorch's viewer and `pickle.load` read, each string, frame and stack
    /// written once ([`crate::pickle`]).
    pub fn to_pickle(&self) -> Vec<u8> {
        crate::pickle::encode(self)
    }
}

/// The pickle of the current CPU state and history.
pub fn cpu_snapshot_pickle() -> Vec<u8> {
    cpu_snapshot().to_pickle()
}
