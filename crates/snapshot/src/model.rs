//! The snapshot as typed data: segments with their blocks, and each device's trace, from the
//! dict that `torch.cuda.memory._snapshot()` returns (and `_dump_snapshot` pickles). Unknown
//! keys from newer PyTorch versions are ignored; a missing key that the analysis needs is an
//! error that names where it was missing.
//!
//! Stacks are interned: a snapshot repeats the same few hundred stacks over millions of
//! blocks and events, so each distinct stack is kept once and blocks refer to it.

use crate::pickle::Value;
use serde::Serialize;
use rustc_hash::FxHashMap as HashMap;
use std::rc::Rc;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: Rc<str>,
    pub line: i64,
    pub name: Rc<str>,
}

/// An interned stack: innermost frame first, as PyTorch records them.
pub type Stack = Rc<[Frame]>;

/// A block's state in its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Held by a live tensor.
    ActiveAllocated,
    /// Freed by its tensor, waiting for a stream event before it can be reused (the docstring
    /// calls it `active_awaiting_free`; the code and the viewer use `active_pending_free`).
    ActivePendingFree,
    /// Free memory inside a reserved segment.
    Inactive,
}

#[derive(Debug, Clone)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    pub stack: Stack,
}

#[derive(Debug, Clone)]
pub struct Segment {
    pub address: u64,
    pub total_size: u64,
    pub stream: i64,
    pub segment_type: Rc<str>,
    pub blocks: Vec<Block>,
}

/// What one trace entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    /// An action this reader does not know (a newer PyTorch): kept, not interpreted.
    Other,
}

impl Action {
    fn parse(s: &str) -> Action {
        match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            _ => Action::Other,
        }
    }
}

#[derive(Debug, Clone)]
pub struct TraceEntry {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub time_us: Option<i64>,
    pub stack: Stack,
}

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    /// One trace per device, oldest event first.
    pub traces: Vec<Vec<TraceEntry>>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FormatError {
    #[error("not a memory snapshot: the pickle holds {0}, not the dict with `segments` that torch.cuda.memory._snapshot() returns")]
    NotASnapshot(String),
    #[error("not a memory snapshot: {0}")]
    Missing(String),
}

struct Interner {
    stacks: HashMap<Vec<Frame>, Stack>,
    /// Stacks the pickle reader already shares, by the list's address: a stack seen a million
    /// times is converted once.
    seen: HashMap<usize, Stack>,
    texts: HashMap<String, Rc<str>>,
    empty: Stack,
}

impl Interner {
    /// Snapshots converted from a profile (`_profile_to_snapshot`) carry Python frames as
    /// `{"filename": "none", "name": "path/file.py(35): handle"}`: split them into file, line
    /// and function like every other frame.
    fn normalize(&mut self, frame: Frame) -> Frame {
        if &*frame.filename != "none" {
            return frame;
        }
        let parsed = frame.name.split_once("): ").and_then(|(place, func)| {
            let (file, line) = place.rsplit_once('(')?;
            Some((file.to_string(), line.parse::<i64>().ok()?, func.to_string()))
        });
        match parsed {
            Some((file, line, func)) => Frame { filename: self.text(&file), line, name: self.text(&func) },
            None => frame,
        }
    }

    fn text(&mut self, s: &str) -> Rc<str> {
        if let Some(t) = self.texts.get(s) {
            return t.clone();
        }
        let t: Rc<str> = Rc::from(s);
        self.texts.insert(t.to_string(), t.clone());
        t
    }

    fn stack(&mut self, frames: Option<Value>) -> Stack {
        let address = match &frames {
            Some(Value::List(l)) => Some(Rc::as_ptr(l) as *const u8 as usize),
            _ => None,
        };
        if let Some(s) = address.and_then(|a| self.seen.get(&a)) {
            return s.clone();
        }
        let stack = self.convert(frames);
        if let Some(a) = address {
            self.seen.insert(a, stack.clone());
        }
        stack
    }

    fn convert(&mut self, frames: Option<Value>) -> Stack {
        let Some(items) = frames.and_then(|f| f.items()) else { return self.empty.clone() };
        let frames: Vec<Frame> = items
            .iter()
            .filter_map(|f| {
                let frame = Frame {
                    filename: match f.get("filename")? {
                        Value::Str(s) => s,
                        _ => return None,
                    },
                    line: f.get("line").and_then(|l| l.as_i64()).unwrap_or(0),
                    name: match f.get("name") {
                        Some(Value::Str(s)) => s,
                        _ => Rc::from("?"),
                    },
                };
                Some(self.normalize(frame))
            })
            .collect();
        if frames.is_empty() {
            return self.empty.clone();
        }
        if let Some(s) = self.stacks.get(&frames) {
            return s.clone();
        }
        let stack: Stack = Rc::from(frames.clone());
        self.stacks.insert(frames, stack.clone());
        stack
    }
}

fn uint(v: &Value, key: &str, what: &str) -> Result<u64, FormatError> {
    v.get(key).and_then(|x| x.as_i64()).map(|x| x.max(0) as u64).ok_or_else(|| FormatError::Missing(format!("{what} has no number `{key}`")))
}

impl Snapshot {
    /// Reads the typed snapshot out of a decoded pickle.
    pub fn from_value(root: &Value) -> Result<Snapshot, FormatError> {
        let Value::Dict(_) = root else { return Err(FormatError::NotASnapshot(root.kind().into())) };
        let segments = root.get("segments").and_then(|s| s.items()).ok_or_else(|| FormatError::NotASnapshot("a dict without a `segments` list".into()))?;
        let mut interner = Interner { stacks: HashMap::default(), seen: HashMap::default(), texts: HashMap::default(), empty: Rc::from(Vec::new()) };
        let mut out = Snapshot::default();
        for (i, seg) in segments.iter().enumerate() {
            let what = format!("segment {i}");
            let blocks = seg.get("blocks").and_then(|b| b.items()).ok_or_else(|| FormatError::Missing(format!("{what} has no `blocks` list")))?;
            let mut parsed = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let what = format!("block {j} of segment {i}");
                let state = match b.get("state").as_ref().and_then(Value::as_str) {
                    Some("active_allocated") => BlockState::ActiveAllocated,
                    Some("active_pending_free") | Some("active_awaiting_free") => BlockState::ActivePendingFree,
                    Some("inactive") => BlockState::Inactive,
                    Some(other) => return Err(FormatError::Missing(format!("{what} has an unknown state `{other}`"))),
                    None => return Err(FormatError::Missing(format!("{what} has no `state`"))),
                };
                let size = uint(b, "size", &what)?;
                parsed.push(Block {
                    address: uint(b, "address", &what).unwrap_or(0),
                    size,
                    requested_size: b.get("requested_size").and_then(|x| x.as_i64()).map_or(size, |x| x.max(0) as u64),
                    state,
                    stack: interner.stack(b.get("frames")),
                });
            }
            out.segments.push(Segment {
                address: uint(seg, "address", &what)?,
                total_size: uint(seg, "total_size", &what)?,
                stream: seg.get("stream").and_then(|s| s.as_i64()).unwrap_or(0),
                segment_type: seg.get("segment_type").and_then(|s| s.as_str().map(Rc::from)).unwrap_or_else(|| Rc::from("?")),
                blocks: parsed,
            });
        }
        for (d, device) in root.get("device_traces").and_then(|t| t.items()).unwrap_or_default().iter().enumerate() {
            let entries = device.items().ok_or_else(|| FormatError::Missing(format!("device_traces[{d}] is not a list")))?;
            let mut trace = Vec::with_capacity(entries.len());
            for (k, e) in entries.iter().enumerate() {
                let what = format!("trace entry {k} of device {d}");
                let action = e.get("action").as_ref().and_then(Value::as_str).map(Action::parse).ok_or_else(|| FormatError::Missing(format!("{what} has no `action`")))?;
                trace.push(TraceEntry {
                    action,
                    addr: e.get("addr").and_then(|x| x.as_i64()).unwrap_or(0) as u64,
                    size: e.get("size").and_then(|x| x.as_i64()).unwrap_or(0).max(0) as u64,
                    stream: e.get("stream").and_then(|x| x.as_i64()).unwrap_or(0),
                    time_us: e.get("time_us").and_then(|x| x.as_i64()),
                    stack: interner.stack(e.get("frames")),
                });
            }
            out.traces.push(trace);
        }
        Ok(out)
    }
}
