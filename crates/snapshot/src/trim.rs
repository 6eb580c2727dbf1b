//! `leaklab snapshot trim`: a snapshot of gigabytes made small enough for a person to open in
//! PyTorch's memory_viz (which fails on pickles over about 1 GB). The small pickle keeps every
//! segment, the blocks of the top N holders (and every block pending free, which the viewer's
//! replay of the trace needs), each run of other blocks merged into one block of the same
//! state (allocated ones under one stack, "holders outside the top N", so that the totals stay
//! right), and the trace events from a point on.
//!
//! It is written in the opcodes that both Python's unpickler and the viewer's own
//! (`MemoryViz.js`, protocols 2 to 4, a subset of the opcodes) read: protocol 4 without frames,
//! strings, frames and stacks written once and then fetched from the memo, lists appended a
//! thousand at a time. It goes to a temporary file beside the output, renamed over it when
//! complete: a bad input or a failed write leaves nothing behind.

use crate::explain::{explain, Holder, View};
use crate::model::{Action, Block, BlockState, Since, Snapshot, StackId, TraceEntry};
use crate::{Error, ReadOptions, Result};
use leaklab_report::human_bytes;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What to keep.
#[derive(Debug, Clone, Copy)]
pub struct TrimOptions {
    /// The trace from this point on (per device, as `explain --since` reads it); none without.
    pub since: Option<Since>,
    /// The holders whose blocks are kept, largest first.
    pub top: usize,
    /// How holders are grouped.
    pub view: View,
}

/// What a trim wrote.
#[derive(Debug, Clone, Serialize)]
pub struct Trimmed {
    pub input: PathBuf,
    pub output: PathBuf,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub segments: usize,
    /// Blocks in the input, and written: kept whole, and merged runs of the others.
    pub blocks: usize,
    pub blocks_kept: usize,
    pub blocks_merged: usize,
    /// Live bytes of the kept holders, and of the others (merged).
    pub kept_bytes: u64,
    pub other_bytes: u64,
    /// The holders kept, largest first.
    pub holders: Vec<Holder>,
    /// Per device: the trace's events, and the window kept (from which event, how many).
    pub trace_events: Vec<usize>,
    pub window_from: Vec<usize>,
    pub window_events: Vec<usize>,
}

/// The stack that the merged blocks of other holders are written under.
const OTHERS_FILE: &str = "<leaklab trim>";

/// Writes a trimmed copy of the snapshot at `input` to `output`.
pub fn trim(input: &Path, output: &Path, options: &TrimOptions) -> Result<Trimmed> {
    let snapshot = crate::load_with(
        input,
        &ReadOptions {
            window: options.since,
            ..ReadOptions::default()
        },
    )?;
    let holders: Vec<Holder> = explain(&snapshot, options.view, None)
        .holders
        .into_iter()
        .take(options.top)
        .collect();
    let kept = kept_stacks(&snapshot, options.view, &holders);
    let io = |error| Error::Write {
        path: output.display().to_string(),
        error,
    };
    let dir = output
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut builder = tempfile::Builder::new();
    builder.prefix(".leaklab-").suffix(".tmp");
    // The modes a plain write gets (0666 less the umask), not a temporary file's owner-only
    // 0600: the small file is for sharing.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let temp = builder.tempfile_in(dir).map_err(io)?;
    let mut w = Pickler::new(std::io::BufWriter::with_capacity(1 << 20, temp.as_file()));
    let mut trimmed = Trimmed {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
        input_bytes: std::fs::metadata(input).map(|m| m.len()).unwrap_or(0),
        output_bytes: 0,
        segments: snapshot.segments.len(),
        blocks: snapshot.segments.iter().map(|s| s.block_count()).sum(),
        blocks_kept: 0,
        blocks_merged: 0,
        kept_bytes: 0,
        other_bytes: 0,
        holders,
        trace_events: snapshot.traces.iter().map(|t| t.len()).collect(),
        window_from: Vec::new(),
        window_events: Vec::new(),
    };
    write_snapshot(&mut w, &snapshot, &kept, options, &mut trimmed).map_err(io)?;
    w.out.flush().map_err(io)?;
    drop(w);
    temp.as_file().sync_all().map_err(io)?;
    trimmed.output_bytes = temp.as_file().metadata().map_err(io)?.len();
    temp.persist(output).map_err(|e| io(e.error))?;
    Ok(trimmed)
}

/// The stacks whose frames, in `view`, are one of `holders`'.
fn kept_stacks(snapshot: &Snapshot, view: View, holders: &[Holder]) -> FxHashSet<StackId> {
    let sites: FxHashSet<(String, Vec<String>)> = holders
        .iter()
        .map(|h| (h.site.clone(), h.stack.clone()))
        .collect();
    let mut kept = FxHashSet::default();
    let mut seen = FxHashSet::default();
    for seg in &snapshot.segments {
        for b in snapshot.blocks(seg) {
            if b.state != BlockState::ActiveAllocated || !seen.insert(b.stack) {
                continue;
            }
            let frames: Vec<String> = view
                .frames(snapshot, b.stack)
                .iter()
                .map(|&f| crate::explain::site(snapshot.frame(f)))
                .collect();
            let key = match frames.split_first() {
                Some((first, rest)) => (first.clone(), rest.to_vec()),
                None => ("<no stack recorded>".to_string(), Vec::new()),
            };
            if sites.contains(&key) {
                kept.insert(b.stack);
            }
        }
    }
    kept
}

fn write_snapshot<W: Write>(
    w: &mut Pickler<W>,
    s: &Snapshot,
    kept: &FxHashSet<StackId>,
    options: &TrimOptions,
    t: &mut Trimmed,
) -> std::io::Result<()> {
    let others = format!("holders outside the top {}", options.top);
    w.proto()?;
    w.dict_open()?;
    w.str("segments")?;
    w.list_open()?;
    let mut batch = 0;
    for seg in &s.segments {
        // The blocks to write: kept ones as they are, each run of others merged into one.
        let mut blocks: Vec<(Block, bool)> = Vec::new();
        for b in s.blocks(seg) {
            let keep = b.state == BlockState::ActivePendingFree
                || b.state == BlockState::ActiveAllocated && kept.contains(&b.stack);
            match b.state {
                BlockState::ActiveAllocated if keep => t.kept_bytes += b.size,
                BlockState::ActiveAllocated => t.other_bytes += b.size,
                _ => {}
            }
            match blocks.last_mut() {
                Some((last, false)) if !keep && last.state == b.state => {
                    last.size += b.size;
                    last.requested_size += b.requested_size;
                }
                _ => blocks.push((b, keep)),
            }
        }
        t.blocks_kept += blocks.iter().filter(|(_, keep)| *keep).count();
        t.blocks_merged += blocks.iter().filter(|(_, keep)| !keep).count();
        let active = |state: BlockState| blocks.iter().filter(move |(b, _)| b.state == state);
        let allocated: u64 = active(BlockState::ActiveAllocated)
            .map(|(b, _)| b.size)
            .sum();
        let pending: u64 = active(BlockState::ActivePendingFree)
            .map(|(b, _)| b.size)
            .sum();
        let requested: u64 = active(BlockState::ActiveAllocated)
            .map(|(b, _)| b.requested_size)
            .sum();
        w.batch(&mut batch)?;
        w.dict_open()?;
        w.key_int("device", seg.device as i128)?;
        w.key_int("address", seg.address as i128)?;
        w.key_int("total_size", seg.total_size as i128)?;
        w.key_int("stream", seg.stream as i128)?;
        w.str("segment_type")?;
        w.str(s.segment_type(seg))?;
        w.key_int("allocated_size", allocated as i128)?;
        w.key_int("active_size", (allocated + pending) as i128)?;
        w.key_int("requested_size", requested as i128)?;
        w.str("blocks")?;
        w.list_open()?;
        let mut inner = 0;
        for (b, keep) in &blocks {
            w.batch(&mut inner)?;
            w.dict_open()?;
            w.key_int("address", b.address as i128)?;
            w.key_int("size", b.size as i128)?;
            w.key_int("requested_size", b.requested_size as i128)?;
            w.str("state")?;
            w.str(b.state.as_str())?;
            w.str("frames")?;
            match (keep, b.state) {
                (true, _) => w.stack(s, b.stack)?,
                (false, BlockState::ActiveAllocated) => w.synthetic_stack(&others)?,
                (false, _) => w.list_open().and_then(|()| w.list_close())?,
            }
            w.dict_close()?;
        }
        w.list_close()?;
        w.dict_close()?;
    }
    w.list_close()?;
    w.str("device_traces")?;
    w.list_open()?;
    let mut devices = 0;
    for trace in &s.traces {
        t.window_from.push(trace.window_from);
        t.window_events.push(trace.window.len());
        let window = &trace.window[..];
        w.batch(&mut devices)?;
        w.list_open()?;
        let mut events = 0;
        for e in window {
            w.batch(&mut events)?;
            event(w, s, e)?;
        }
        w.list_close()?;
    }
    w.list_close()?;
    w.dict_close()?;
    w.stop()
}

fn event<W: Write>(w: &mut Pickler<W>, s: &Snapshot, e: &TraceEntry) -> std::io::Result<()> {
    w.dict_open()?;
    w.str("action")?;
    match (&e.other_action, e.action) {
        (Some(text), _) => w.str(text)?,
        (None, action) => w.str(action_name(action))?,
    }
    w.key_int("addr", e.addr as i128)?;
    w.key_int("size", e.size as i128)?;
    w.key_int("stream", e.stream as i128)?;
    if let Some(t) = e.time_us {
        w.key_int("time_us", t as i128)?;
    }
    // Python's `_memory_viz.trace` reads `device_free` of every out-of-memory event.
    if e.device_free.is_some() || e.action == Action::Oom {
        w.key_int("device_free", e.device_free.unwrap_or(0) as i128)?;
    }
    w.str("frames")?;
    w.stack(s, e.stack)?;
    w.dict_close()
}

fn action_name(action: Action) -> &'static str {
    Action::KNOWN
        .iter()
        .find(|(_, a)| *a == action)
        .map_or("unknown", |(name, _)| name)
}

/// Writes protocol 4 pickles in the opcodes MemoryViz.js reads, memoizing what repeats.
struct Pickler<W: Write> {
    out: W,
    next_memo: u32,
    strings: FxHashMap<String, u32>,
    frames: FxHashMap<u32, u32>,
    stacks: FxHashMap<StackId, u32>,
    synthetic: Option<u32>,
}

impl<W: Write> Pickler<W> {
    fn new(out: W) -> Pickler<W> {
        Pickler {
            out,
            next_memo: 0,
            strings: FxHashMap::default(),
            frames: FxHashMap::default(),
            stacks: FxHashMap::default(),
            synthetic: None,
        }
    }

    fn proto(&mut self) -> std::io::Result<()> {
        self.out.write_all(&[0x80, 4])
    }

    fn stop(&mut self) -> std::io::Result<()> {
        self.out.write_all(b".")
    }

    fn memoize(&mut self) -> std::io::Result<u32> {
        self.out.write_all(&[0x94])?;
        self.next_memo += 1;
        Ok(self.next_memo - 1)
    }

    fn get(&mut self, key: u32) -> std::io::Result<()> {
        match u8::try_from(key) {
            Ok(k) => self.out.write_all(&[b'h', k]),
            Err(_) => {
                self.out.write_all(b"j")?;
                self.out.write_all(&key.to_le_bytes())
            }
        }
    }

    fn str(&mut self, s: &str) -> std::io::Result<()> {
        if let Some(&key) = self.strings.get(s) {
            return self.get(key);
        }
        match u8::try_from(s.len()) {
            Ok(n) => self.out.write_all(&[0x8c, n])?,
            Err(_) => {
                self.out.write_all(b"X")?;
                self.out.write_all(&(s.len() as u32).to_le_bytes())?;
            }
        }
        self.out.write_all(s.as_bytes())?;
        let key = self.memoize()?;
        self.strings.insert(s.to_string(), key);
        Ok(())
    }

    /// An integer in the fewest bytes, as CPython writes it.
    fn int(&mut self, v: i128) -> std::io::Result<()> {
        match v {
            0..=0xff => self.out.write_all(&[b'K', v as u8]),
            0x100..=0xffff => {
                self.out.write_all(b"M")?;
                self.out.write_all(&(v as u16).to_le_bytes())
            }
            _ if i32::try_from(v).is_ok() => {
                self.out.write_all(b"J")?;
                self.out.write_all(&(v as i32).to_le_bytes())
            }
            _ => {
                // Two's complement, little-endian, with a sign byte only when needed.
                let bytes = v.to_le_bytes();
                let mut n = 16;
                while n > 1
                    && ((bytes[n - 1] == 0 && bytes[n - 2] & 0x80 == 0)
                        || (bytes[n - 1] == 0xff && bytes[n - 2] & 0x80 != 0))
                {
                    n -= 1;
                }
                self.out.write_all(&[0x8a, n as u8])?;
                self.out.write_all(&bytes[..n])
            }
        }
    }

    fn key_int(&mut self, key: &str, v: i128) -> std::io::Result<()> {
        self.str(key)?;
        self.int(v)
    }

    fn dict_open(&mut self) -> std::io::Result<()> {
        self.out.write_all(b"}(")
    }

    fn dict_close(&mut self) -> std::io::Result<()> {
        self.out.write_all(b"u")
    }

    fn list_open(&mut self) -> std::io::Result<()> {
        self.out.write_all(b"](")
    }

    fn list_close(&mut self) -> std::io::Result<()> {
        self.out.write_all(b"e")
    }

    /// Before an item of a list whose batch holds `count` items: the batch closes at a
    /// thousand (the viewer appends a batch with one call, whose arguments are bounded).
    fn batch(&mut self, count: &mut u32) -> std::io::Result<()> {
        if *count == 1000 {
            self.out.write_all(b"e(")?;
            *count = 0;
        }
        *count += 1;
        Ok(())
    }

    fn stack(&mut self, s: &Snapshot, stack: StackId) -> std::io::Result<()> {
        if let Some(&key) = self.stacks.get(&stack) {
            return self.get(key);
        }
        self.out.write_all(b"]")?;
        let key = self.memoize()?;
        self.out.write_all(b"(")?;
        let mut count = 0;
        for &f in s.stack_frames(stack) {
            self.batch(&mut count)?;
            match self.frames.get(&f) {
                Some(&k) => self.get(k)?,
                None => {
                    let frame = s.frame(f);
                    self.out.write_all(b"}")?;
                    let k = self.memoize()?;
                    self.out.write_all(b"(")?;
                    self.str("filename")?;
                    self.str(&frame.filename)?;
                    self.key_int("line", frame.line as i128)?;
                    self.str("name")?;
                    self.str(&frame.name)?;
                    self.out.write_all(b"u")?;
                    self.frames.insert(f, k);
                }
            }
        }
        self.out.write_all(b"e")?;
        self.stacks.insert(stack, key);
        Ok(())
    }

    /// The one-frame stack of the merged blocks of other holders.
    fn synthetic_stack(&mut self, name: &str) -> std::io::Result<()> {
        if let Some(key) = self.synthetic {
            return self.get(key);
        }
        self.out.write_all(b"]")?;
        let key = self.memoize()?;
        self.out.write_all(b"(}(")?;
        self.str("filename")?;
        self.str(OTHERS_FILE)?;
        self.key_int("line", 0)?;
        self.str("name")?;
        self.str(name)?;
        self.out.write_all(b"ue")?;
        self.synthetic = Some(key);
        Ok(())
    }
}

impl leaklab_report::Report for Trimmed {
    fn outcome(&self) -> leaklab_report::Outcome {
        leaklab_report::Outcome::Pass
    }

    fn text(&self) -> String {
        let mut out = format!(
            "Wrote {} ({}, from {}): {} segments, {} blocks of the top {} holders ({} live) and {} merged runs of the others ({} live)",
            self.output.display(),
            human_bytes(self.output_bytes as f64),
            human_bytes(self.input_bytes as f64),
            self.segments,
            self.blocks_kept,
            self.holders.len(),
            human_bytes(self.kept_bytes as f64),
            self.blocks_merged,
            human_bytes(self.other_bytes as f64)
        );
        let events: usize = self.window_events.iter().sum();
        if self
            .window_from
            .iter()
            .zip(&self.trace_events)
            .any(|(from, len)| from < len)
        {
            let windows: Vec<String> = self
                .window_from
                .iter()
                .zip(&self.trace_events)
                .map(|(from, len)| format!("{from} of {len}"))
                .collect();
            out += &format!(
                ", and {events} trace events (from event {} per device).\n",
                windows.join(", ")
            );
        } else {
            out += ", no trace events (give --since to keep the trace from a point on).\n";
        }
        out += "Open it in https://pytorch.org/memory_viz.\n";
        out
    }

    fn markdown(&self) -> String {
        format!("#### Trimmed snapshot\n\n{}", self.text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_written_as_cpython_writes_them() {
        let cases: [(i128, &[u8]); 7] = [
            (7, b"K\x07"),
            (300, b"M\x2c\x01"),
            (-1, b"J\xff\xff\xff\xff"),
            (1 << 40, b"\x8a\x06\x00\x00\x00\x00\x00\x01"),
            (
                u64::MAX as i128,
                b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00",
            ),
            (-(1i128 << 40), b"\x8a\x06\x00\x00\x00\x00\x00\xff"),
            (1 << 31, b"\x8a\x05\x00\x00\x00\x80\x00"),
        ];
        for (v, bytes) in cases {
            let mut p = Pickler::new(Vec::new());
            p.int(v).unwrap();
            assert_eq!(p.out, bytes, "{v}");
        }
    }
}
