//! The snapshot as typed data: segments with their blocks, each device's trace folded into
//! what the answers need, and one table of the distinct frames and stacks that every block and
//! event refers to, from the dict that `torch.cuda.memory._snapshot()` returns (and
//! `_dump_snapshot` pickles).
//!
//! A trace is not kept event by event: what `explain --since` asks of it is which allocations
//! were never freed and when each event happened, so [`Trace`] holds the allocations that
//! survive to the end (the last event at their address is the allocation) and a compact index
//! of the times; the events themselves are kept only in a window asked for in advance, for
//! `snapshot trim`. Stacks are interned: a snapshot repeats the same few hundred stacks over
//! millions of blocks and events, so a block holds a [`StackId`], four bytes.

use serde::Serialize;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: Arc<str>,
    pub line: i64,
    pub name: Arc<str>,
}

/// A stack in the snapshot's table (innermost frame first, as PyTorch records them); 0 is the
/// empty stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

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

impl BlockState {
    /// The name PyTorch writes.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub stack: StackId,
    pub state: BlockState,
}

/// A block's address when its dict has none (`_profile_to_snapshot` writes none): the end of
/// the block before it, or its segment's address for the first.
pub(crate) const NO_ADDRESS: u64 = u64::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub stream: i64,
    /// Its type (`large`, `small`: a handful in a snapshot), by index: read it with
    /// [`Snapshot::segment_type`]. A snapshot may have millions of segments.
    pub(crate) segment_type: u32,
    /// Where its blocks start in the snapshot's block bytes, and how many: read them with
    /// [`Snapshot::blocks`].
    pub(crate) blocks_at: usize,
    pub(crate) block_count: u32,
}

impl Segment {
    pub fn block_count(&self) -> usize {
        self.block_count as usize
    }
}

/// A list's blocks, encoded as they arrive in a few bytes each: a flags byte (state, whether
/// the address is written, whether the size is in 512-byte units), the size, the requested
/// size's difference from it, the address (only when it is not where the previous block ends)
/// and the stack id, all varints. A block costs six or seven bytes rather than thirty-two.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BlockRun {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) count: u32,
    /// Where the last block ends, when the encoder knows (not after a first block without an
    /// address): the base of the next written address.
    prev_end: Option<u64>,
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

impl BlockRun {
    /// Appends `b` to this run in `bytes`. A run whose bytes are not at the end any more
    /// (another list's came after: no writer does that) is moved there first.
    pub(crate) fn push(&mut self, bytes: &mut Vec<u8>, b: &Block) {
        if self.end != bytes.len() || self.count == 0 {
            let old = self.start..self.end;
            self.start = bytes.len();
            bytes.extend_from_within(old);
            self.end = bytes.len();
        }
        let state = match b.state {
            BlockState::ActiveAllocated => 0,
            BlockState::ActivePendingFree => 1,
            BlockState::Inactive => 2,
        };
        let written = b.address != NO_ADDRESS && Some(b.address) != self.prev_end;
        let units = b.size.is_multiple_of(512);
        // At most a flags byte and four varints of ten bytes: room made once.
        bytes.reserve(41);
        bytes.push(state | (written as u8) << 2 | (units as u8) << 3);
        put_varint(bytes, if units { b.size / 512 } else { b.size });
        put_varint(bytes, zigzag(b.size.wrapping_sub(b.requested_size) as i64));
        if written {
            put_varint(
                bytes,
                zigzag(b.address.wrapping_sub(self.prev_end.unwrap_or(0)) as i64),
            );
        }
        put_varint(bytes, b.stack.0 as u64);
        self.prev_end = match (written, self.prev_end) {
            (true, _) => Some(b.address.wrapping_add(b.size)),
            (false, Some(p)) if b.address == NO_ADDRESS || b.address == p => {
                Some(p.wrapping_add(b.size))
            }
            _ => None,
        };
        self.end = bytes.len();
        self.count += 1;
    }
}

/// The blocks of a segment, decoded.
#[derive(Clone)]
pub struct Blocks<'s> {
    bytes: &'s [u8],
    at: usize,
    left: u32,
    /// Where the previous block ends; and the encoder's view of it.
    next: u64,
    known: Option<u64>,
}

impl Iterator for Blocks<'_> {
    type Item = Block;

    fn next(&mut self) -> Option<Block> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let flags = *self.bytes.get(self.at)?;
        self.at += 1;
        let code = get_varint(self.bytes, &mut self.at);
        let size = if flags & 8 != 0 {
            code.wrapping_mul(512)
        } else {
            code
        };
        let requested_size =
            size.wrapping_sub(unzigzag(get_varint(self.bytes, &mut self.at)) as u64);
        let written = flags & 4 != 0;
        let address = if written {
            self.known
                .unwrap_or(0)
                .wrapping_add(unzigzag(get_varint(self.bytes, &mut self.at)) as u64)
        } else {
            self.next
        };
        let stack = StackId(get_varint(self.bytes, &mut self.at) as u32);
        let state = [
            BlockState::ActiveAllocated,
            BlockState::ActivePendingFree,
            BlockState::Inactive,
        ][(flags & 3).min(2) as usize];
        self.next = address.wrapping_add(size);
        self.known = match (written, self.known) {
            (true, _) | (false, Some(_)) => Some(self.next),
            (false, None) => None,
        };
        Some(Block {
            address,
            size,
            requested_size,
            stack,
            state,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Blocks<'_> {}

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
    pub const KNOWN: [(&'static str, Action); 9] = [
        ("alloc", Action::Alloc),
        ("free_requested", Action::FreeRequested),
        ("free_completed", Action::FreeCompleted),
        ("segment_alloc", Action::SegmentAlloc),
        ("segment_free", Action::SegmentFree),
        ("segment_map", Action::SegmentMap),
        ("segment_unmap", Action::SegmentUnmap),
        ("oom", Action::Oom),
        ("snapshot", Action::Snapshot),
    ];
}

/// One event of a trace window, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: Action,
    /// The text of an action this reader does not know, so that `trim` writes it back as is.
    pub other_action: Option<Arc<str>>,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub time_us: Option<i64>,
    /// Free device memory at an out-of-memory event.
    pub device_free: Option<u64>,
    pub stack: StackId,
}

/// An allocation of the trace that nothing freed: the last event at its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Survivor {
    /// Its event's index in the trace.
    pub index: u64,
    pub size: u64,
    pub stack: StackId,
}

/// The times of a trace, enough to find the first event at or after any time: the events that
/// raise the running maximum of `time_us`, delta-encoded as varints (two or three bytes an
/// event rather than sixteen).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeIndex {
    first: Option<(u64, i64)>,
    last: (u64, i64),
    deltas: Vec<u8>,
}

#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
fn get_varint(bytes: &[u8], at: &mut usize) -> u64 {
    // Most are one or two bytes: those without a loop.
    match bytes.get(*at..*at + 2) {
        Some(&[b, _]) if b < 0x80 => {
            *at += 1;
            return b as u64;
        }
        Some(&[b, c]) if c < 0x80 => {
            *at += 2;
            return (b & 0x7f) as u64 | (c as u64) << 7;
        }
        _ => {}
    }
    let (mut v, mut shift) = (0u64, 0);
    while let Some(&b) = bytes.get(*at) {
        *at += 1;
        v |= ((b & 0x7f) as u64) << shift.min(63);
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    v
}

impl TimeIndex {
    /// Records that event `index` happened at `time_us` (indexes increasing).
    pub fn push(&mut self, index: u64, time_us: i64) {
        match self.first {
            None => {
                self.first = Some((index, time_us));
                self.last = (index, time_us);
            }
            Some(_) if time_us > self.last.1 => {
                put_varint(&mut self.deltas, index - self.last.0);
                put_varint(&mut self.deltas, time_us.wrapping_sub(self.last.1) as u64);
                self.last = (index, time_us);
            }
            Some(_) => {}
        }
    }

    /// The time of the first event that has one.
    pub fn first_time(&self) -> Option<i64> {
        self.first.map(|(_, t)| t)
    }

    /// The index of the first event at or after `cut`, if any.
    pub fn first_at_or_after(&self, cut: i64) -> Option<u64> {
        let (mut index, mut time) = self.first?;
        let mut at = 0;
        loop {
            if time >= cut {
                return Some(index);
            }
            if at >= self.deltas.len() {
                return None;
            }
            index += get_varint(&self.deltas, &mut at);
            time = time.wrapping_add(get_varint(&self.deltas, &mut at) as i64);
        }
    }
}

/// One device's trace, folded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    pub(crate) len: usize,
    /// The allocations nothing freed, by event index.
    pub survivors: Vec<Survivor>,
    pub times: TimeIndex,
    /// The events from `window_from` on, when the snapshot was read with a window
    /// ([`crate::ReadOptions::window`]); empty otherwise.
    pub window: Vec<TraceEntry>,
    pub window_from: usize,
}

impl Trace {
    /// The number of events.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
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
            return t.parse().map(Since::Seconds).map_err(|_| {
                format!("`{s}`: a time is seconds after the first event, e.g. 12.5s")
            });
        }
        s.parse().map(Since::Event).map_err(|_| format!("`{s}`: give an event index (e.g. 1200) or seconds after the first event (e.g. 12.5s)"))
    }
}

/// Where a `--since` point falls: `t0` plus the seconds, saturating.
pub(crate) fn cut(t0: i64, seconds: f64) -> i64 {
    t0.saturating_add((seconds * 1e6) as i64)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    /// One trace per device, in device order.
    pub traces: Vec<Trace>,
    /// Every segment's blocks, encoded ([`BlockRun`]).
    pub(crate) block_bytes: Vec<u8>,
    /// The segment types, each once.
    pub(crate) segment_types: Vec<Arc<str>>,
    pub(crate) frames: Vec<Frame>,
    /// Each stack's frames, as indexes into `frames`.
    pub(crate) stacks: Vec<Box<[u32]>>,
}

impl Default for Snapshot {
    fn default() -> Snapshot {
        Snapshot {
            segments: Vec::new(),
            traces: Vec::new(),
            block_bytes: Vec::new(),
            segment_types: Vec::new(),
            frames: Vec::new(),
            stacks: vec![Box::from([])],
        }
    }
}

impl Snapshot {
    /// The blocks of `segment` (one of this snapshot's), in address order.
    pub fn blocks(&self, segment: &Segment) -> Blocks<'_> {
        let bytes = self.block_bytes.get(segment.blocks_at..).unwrap_or(&[]);
        Blocks {
            bytes,
            at: 0,
            left: segment.block_count,
            next: segment.address,
            known: None,
        }
    }

    /// The type of `segment` (one of this snapshot's): `large`, `small`, or `?` if it had none.
    pub fn segment_type(&self, segment: &Segment) -> &str {
        self.segment_types
            .get(segment.segment_type as usize)
            .map_or("?", |t| t)
    }

    /// The frames of `stack`, innermost first.
    pub fn stack(&self, stack: StackId) -> impl ExactSizeIterator<Item = &Frame> + Clone + '_ {
        self.stack_frames(stack)
            .iter()
            .map(|&f| &self.frames[f as usize])
    }

    /// The frames of `stack` as indexes into the frame table: equal frames have equal indexes.
    pub fn stack_frames(&self, stack: StackId) -> &[u32] {
        self.stacks.get(stack.0 as usize).map_or(&[], |s| s)
    }

    pub fn frame(&self, index: u32) -> &Frame {
        &self.frames[index as usize]
    }

    /// The number of distinct stacks (the empty one included).
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FormatError {
    #[error("not a memory snapshot: the pickle holds {0}, not the dict with `segments` that torch.cuda.memory._snapshot() returns")]
    NotASnapshot(String),
    #[error("not a memory snapshot: {0}")]
    Missing(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_decode_as_encoded_whatever_their_addresses() {
        let b = |address, size, requested_size, state| Block {
            address,
            size,
            requested_size,
            stack: StackId(7),
            state,
        };
        let cases = [
            // Contiguous from the segment's address, as PyTorch writes them.
            vec![
                b(4096, 1 << 20, (1 << 20) - 3, BlockState::ActiveAllocated),
                b(4096 + (1 << 20), 512, 0, BlockState::Inactive),
            ],
            // No addresses (a profile's): the segment's, then each previous end.
            vec![
                b(NO_ADDRESS, 100, 100, BlockState::ActiveAllocated),
                b(NO_ADDRESS, 3, 3, BlockState::ActivePendingFree),
            ],
            // Gaps, addresses going down, extreme sizes, a requested size above the size.
            vec![
                b(NO_ADDRESS, 10, 12, BlockState::Inactive),
                b(1 << 40, u64::MAX, 0, BlockState::ActiveAllocated),
                b(5, 1, u64::MAX, BlockState::Inactive),
            ],
        ];
        for blocks in cases {
            let mut bytes = vec![1, 2, 3];
            let mut run = BlockRun::default();
            for x in &blocks {
                run.push(&mut bytes, x);
            }
            let segment = Segment {
                device: 0,
                address: 4096,
                total_size: 0,
                stream: 0,
                segment_type: 0,
                blocks_at: run.start,
                block_count: run.count,
            };
            let snapshot = Snapshot {
                block_bytes: bytes,
                ..Snapshot::default()
            };
            let mut expected = blocks.clone();
            let mut next = segment.address;
            for x in &mut expected {
                if x.address == NO_ADDRESS {
                    x.address = next;
                }
                next = x.address.wrapping_add(x.size);
            }
            assert_eq!(snapshot.blocks(&segment).collect::<Vec<_>>(), expected);
        }
    }

    #[test]
    fn the_time_index_finds_the_first_event_at_or_after_a_time() {
        let mut t = TimeIndex::default();
        assert_eq!(t.first_at_or_after(0), None);
        // Times out of order: event 3 (time 5) comes before the running maximum passes 5 again.
        for (i, time) in [(1, 10), (2, 10), (3, 5), (4, 300), (5, 200), (6, 1 << 40)] {
            t.push(i, time);
        }
        assert_eq!(t.first_time(), Some(10));
        assert_eq!(t.first_at_or_after(i64::MIN), Some(1));
        assert_eq!(t.first_at_or_after(10), Some(1));
        assert_eq!(t.first_at_or_after(11), Some(4));
        assert_eq!(t.first_at_or_after(250), Some(4));
        assert_eq!(t.first_at_or_after(301), Some(6));
        assert_eq!(t.first_at_or_after((1 << 40) + 1), None);
        // Extreme times do not overflow the deltas.
        let mut t = TimeIndex::default();
        t.push(0, i64::MIN);
        t.push(1, i64::MAX);
        assert_eq!(t.first_at_or_after(0), Some(1));
    }
}
