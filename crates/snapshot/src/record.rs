//! A one-pass reader for the dicts that make most of a snapshot: segments, blocks and trace
//! events. Each is a dict of numbers and strings whose lists hold frames (memo references, or
//! frame dicts written out) or blocks. Read opcode by opcode through the general machine, a
//! block or event costs a few hundred nanoseconds of stack traffic and bookkeeping; read here,
//! its fields are set as they come, frames go straight into a buffer and blocks into their
//! segment's.
//!
//! It starts at `EMPTY_DICT` when a memo store (optional) and a `MARK` follow, as every writer
//! of protocol 1 or later writes a dict of more than one key, and goes down at most [`DEPTH`]
//! levels (a segment, its blocks, a block, its frames, a frame). At the first opcode it does
//! not expect (a list of other things, a reference to something still being read, a cut file),
//! it undoes what it stored in the memo and the general machine reads the dict again from its
//! start. Everything else it did (interning strings, frames and stacks) the general machine
//! would do alike. So it changes how fast a pickle is read, never what it reads as
//! ([`crate::ReadOptions::plain`] reads without it, and the tests compare the two); a dict it
//! gives up on costs its bytes twice, once per level at most.

use crate::build::{Builder, Fields, Item, Owned, Result, NKEYS};
use crate::model::BlockRun;
use crate::pickle::{
    long_at, Build, Kind, Reader, Value, PAYLOAD, TAG, T_DICT_ID, T_EMPTY, T_LIST_ID, T_OPAQUE,
    T_OPEN, T_SCALAR, T_STR,
};

/// A memo entry for a container this reader has opened and not finished: a reference to it
/// means the dict is not one to read in one pass.
const OPENED: u32 = T_OPEN | PAYLOAD;

/// How deep it reads: a segment, its list of blocks, a block, its list of frames, a frame.
const DEPTH: usize = 5;

/// One dict or list being read, its buffers kept for the next one at this depth.
#[derive(Default)]
struct Level {
    fields: Option<Box<Fields>>,
    /// A list's frames.
    frames: Vec<u32>,
}

/// What the one-pass reader holds, kept between dicts (in the [`Builder`]) so that its buffers
/// are reused.
#[derive(Default)]
pub(crate) struct Fast {
    levels: Vec<Level>,
    /// The memo's length when the dict began: new keys from there on (what every writer
    /// stores) are undone by cutting the memo back.
    memo_len: usize,
    /// Other memo entries it changed, with what they held, to undo when it gives up.
    undo: Vec<(u32, u32)>,
}

/// Why the one-pass reading stopped short: the general machine reads the dict instead.
struct GiveUp;

type Step<T> = std::result::Result<T, GiveUp>;

/// The next opcode at `*pos`, past any FRAME markers (protocol 4 frames end between any two
/// opcodes); `None` at the end of the data.
#[inline(always)]
fn next_op(data: &[u8], pos: &mut usize) -> Option<u8> {
    let op = *data.get(*pos)?;
    *pos += 1;
    if op != 0x95 {
        return Some(op);
    }
    after_frame(data, pos)
}

/// [`next_op`] after a FRAME marker (one per 64 kB): past its length, the next opcode.
#[cold]
fn after_frame(data: &[u8], pos: &mut usize) -> Option<u8> {
    *pos += 8;
    next_op(data, pos)
}

#[inline(always)]
fn u32_at(data: &[u8], p: usize) -> Option<u32> {
    data.get(p..p + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Past a number, None or a bool (what a tuple of a snapshot holds) whose opcode is `op`.
fn skip_number(data: &[u8], op: u8, pos: &mut usize) -> Option<()> {
    *pos += match op {
        b'K' => 1,
        b'M' => 2,
        b'J' => 4,
        b'G' => 8,
        0x8a => 1 + *data.get(*pos)? as usize,
        b'N' | 0x88 | 0x89 => 0,
        _ => return None,
    };
    (*pos <= data.len()).then_some(())
}

impl<'a> Reader<'a, Builder<'a>> {
    /// Stores a memo entry, logging what the key held.
    #[inline]
    fn memo_set(&mut self, key: u32, entry: u32) {
        if !self.b.memo.appends(key, self.b.fast.memo_len) {
            self.b.fast.undo.push((key, self.b.memo.get(key)));
        }
        self.b.memo.set(key, entry);
    }

    /// A memo store at `*pos`, if one is there (MEMOIZE's key is the memo's count): stores
    /// `entry` at its key and returns the key.
    #[inline(always)]
    fn put(&mut self, pos: &mut usize, entry: u32) -> Step<Option<u32>> {
        let data = self.data;
        let mut p = *pos;
        let key = match next_op(data, &mut p) {
            Some(0x94) => self.b.memo.count,
            Some(b'q') => {
                p += 1;
                *data.get(p - 1).ok_or(GiveUp)? as u32
            }
            Some(b'r') => {
                p += 4;
                u32_at(data, p - 4).ok_or(GiveUp)?
            }
            _ => return Ok(None),
        };
        self.memo_set(key, entry);
        *pos = p;
        Ok(Some(key))
    }

    /// A string at `*pos` (its opcode read) and its memo store: its id.
    #[inline(always)]
    fn string(&mut self, op: u8, pos: &mut usize) -> Step<u32> {
        let data = self.data;
        let p = *pos;
        let (len, head) = match op {
            0x8c => (*data.get(p).ok_or(GiveUp)? as usize, 1),
            _ => (u32_at(data, p).ok_or(GiveUp)? as usize, 4),
        };
        let text = data.get(p + head..p + head + len).ok_or(GiveUp)?;
        // Not UTF-8: the general machine says so.
        let id = self.b.intern(text, p).map_err(|_| GiveUp)?;
        *pos = p + head + len;
        self.put(pos, T_STR | id)?;
        Ok(id)
    }

    /// The memo entry at a GET's key (its opcode read).
    #[inline(always)]
    fn got(&self, op: u8, pos: &mut usize) -> Step<u32> {
        let data = self.data;
        let key = match op {
            b'h' => {
                *pos += 1;
                *data.get(*pos - 1).ok_or(GiveUp)? as u32
            }
            _ => {
                *pos += 4;
                u32_at(data, *pos - 4).ok_or(GiveUp)?
            }
        };
        Ok(self.b.memo.get(key))
    }

    /// A value into `out`: a number, a string, a memo reference to a finished string, frame,
    /// stack or number, or an empty tuple. Written in place, not returned: a sixteen-byte value
    /// moved out through a `Result` is stored in parts and loaded whole, and the load waits for
    /// the stores (a tenth of the reading of a file of small dicts).
    #[inline(always)]
    fn value(&mut self, op: u8, pos: &mut usize, out: &mut Value) -> Step<()> {
        let data = self.data;
        let p = *pos;
        *out = match op {
            b'h' | b'j' => {
                let e = self.got(op, pos)?;
                match e & TAG {
                    T_STR => Value::Str(e & PAYLOAD),
                    T_DICT_ID => Value::DictId(e & PAYLOAD),
                    T_LIST_ID => Value::ListId(e & PAYLOAD),
                    T_EMPTY => Value::EmptyList,
                    T_SCALAR => self.b.memo.scalars[(e & PAYLOAD) as usize],
                    T_OPAQUE => Value::Opaque(Kind::from_u32(e & PAYLOAD)),
                    // Unset, or a container still open: the general machine's.
                    _ => return Err(GiveUp),
                }
            }
            0x8c | b'X' => Value::Str(self.string(op, pos)?),
            b')' => self.tuple_end(pos)?,
            b'K' => {
                *pos += 1;
                Value::Int(*data.get(p).ok_or(GiveUp)? as i64)
            }
            b'M' => {
                *pos += 2;
                let b = data.get(p..p + 2).ok_or(GiveUp)?;
                Value::Int(u16::from_le_bytes([b[0], b[1]]) as i64)
            }
            b'J' => {
                *pos += 4;
                Value::Int(u32_at(data, p).ok_or(GiveUp)? as i32 as i64)
            }
            0x8a => {
                let n = *data.get(p).ok_or(GiveUp)? as usize;
                *pos += 1 + n;
                long_at(data, p + 1, n).ok_or(GiveUp)?
            }
            b'N' => Value::None,
            0x88 => Value::Bool(true),
            0x89 => Value::Bool(false),
            b'G' => {
                *pos += 8;
                Value::Float(f64::from_be_bytes(
                    data.get(p..p + 8)
                        .ok_or(GiveUp)?
                        .try_into()
                        .map_err(|_| GiveUp)?,
                ))
            }
            _ => return Err(GiveUp),
        };
        Ok(())
    }

    /// Past the value of a key no snapshot field has: it may also be a tuple of up to three
    /// numbers (`segment_pool_id`). Known fields never hold one; if one did, the tuple's
    /// numbers would be read as keys, and the dict would give up there.
    #[inline(always)]
    fn other_value(&mut self, op: u8, pos: &mut usize) -> Step<()> {
        let mut v = Value::None;
        self.value(op, pos, &mut v)?;
        if !matches!(
            v,
            Value::Int(_)
                | Value::UInt(_)
                | Value::Huge
                | Value::Float(_)
                | Value::None
                | Value::Bool(_)
        ) {
            return Ok(());
        }
        // Up to two more numbers, then TUPLE1, 2 or 3 for as many.
        let data = self.data;
        let mut q = *pos;
        for n in 1..=3u8 {
            match next_op(data, &mut q) {
                Some(t @ 0x85..=0x87) if t - 0x84 == n => {
                    *pos = q;
                    return self.tuple_end(pos).map(drop);
                }
                Some(next) if n < 3 && skip_number(data, next, &mut q).is_some() => {}
                _ => break,
            }
        }
        Ok(())
    }

    /// After a tuple's last opcode: its memo store, if any.
    fn tuple_end(&mut self, pos: &mut usize) -> Step<Value> {
        self.put(pos, T_OPAQUE | Kind::Tuple as u32)?;
        Ok(Value::Opaque(Kind::Tuple))
    }

    /// At `EMPTY_DICT` (already read): reads the dict in one pass if it can. `Ok(false)`: it
    /// did not, and nothing it did remains; the general machine reads the dict.
    // `inline`: the machine's generic loop is instantiated in another codegen unit, where this
    // is not inlined without the hint (a 256 MB many-segments file: 7.12 G instructions
    // without it, 6.94 G with it, under cachegrind).
    #[inline]
    pub(crate) fn record(&mut self, at: usize) -> Result<bool> {
        let mut pos = self.pos;
        let count = self.b.memo.count;
        let block_bytes = self.b.block_bytes.len();
        self.b.fast.memo_len = self.b.memo.len();
        self.b.fast.undo.clear();
        let owned = match self.dict(0, &mut pos, at) {
            Ok(owned) => owned?,
            Err(GiveUp) => {
                for &(key, old) in self.b.fast.undo.iter().rev() {
                    self.b.memo.restore(key, old);
                }
                self.b.memo.truncate(self.b.fast.memo_len);
                self.b.memo.count = count;
                self.b.block_bytes.truncate(block_bytes);
                return Ok(false);
            }
        };
        self.pos = pos;
        // Where the general machine would have put the dict; a block or event that is the
        // first of its list's batch goes straight into the list, as `place` does.
        let here = self.stack.len();
        match owned {
            Owned::Item(item) if item.is_record() => match self.list_below(here) {
                Some(slot) => self.b.append_owned(slot, Owned::Item(item)),
                None => {
                    let v = Value::Item(self.b.store(item));
                    Ok(self.push(v, at)?)
                }
            },
            Owned::Item(item) => {
                let v = Value::Item(self.b.store(item));
                Ok(self.push(v, at)?)
            }
            Owned::V(v) => Ok(self.push(v, at)?),
        }?;
        Ok(true)
    }

    /// A dict at depth `d`, its `EMPTY_DICT` read. The outer `Result` is the reading's; an
    /// error inside (a block with an unknown state, say) is the snapshot's.
    fn dict(&mut self, d: usize, pos: &mut usize, at: usize) -> Step<Result<Owned>> {
        let memo = self.put(pos, OPENED)?;
        if next_op(self.data, pos) != Some(b'(') {
            return Err(GiveUp);
        }
        if self.b.fast.levels.len() <= d {
            self.b.fast.levels.resize_with(d + 1, Level::default);
        }
        let mut f = self.b.fast.levels[d].fields.take().unwrap_or_default();
        f.clear();
        let read = self.dict_fields(d, pos, &mut f, at);
        let out = match read {
            Ok(Ok(())) => match self.b.classify(&mut f, at) {
                Ok(owned) => {
                    if let Some(k) = memo {
                        let entry = self.b.entry_of(&owned);
                        self.memo_set(k, entry);
                    }
                    Ok(Ok(owned))
                }
                Err(e) => Ok(Err(e)),
            },
            Ok(Err(e)) => Ok(Err(e)),
            // What its fields hold (a list of blocks) is the general machine's to read again.
            Err(GiveUp) => match self.b.discard_fields(&mut f, at) {
                Ok(()) => Err(GiveUp),
                Err(e) => Ok(Err(e)),
            },
        };
        self.b.fast.levels[d].fields = Some(f);
        out
    }

    /// The key-value pairs of the dict at depth `d`, up to its `SETITEMS`, into `f`.
    #[inline(always)]
    fn dict_fields(
        &mut self,
        d: usize,
        pos: &mut usize,
        f: &mut Fields,
        at: usize,
    ) -> Step<Result<()>> {
        let data = self.data;
        let mut pairs = 0;
        loop {
            let key = match next_op(data, pos) {
                // An empty batch leaves the dict open in the general machine (protocol 0's way).
                Some(b'u') if pairs == 0 => return Err(GiveUp),
                Some(b'u') => return Ok(Ok(())),
                Some(op @ (b'h' | b'j')) => {
                    let e = self.got(op, pos)?;
                    if e & TAG != T_STR {
                        return Err(GiveUp);
                    }
                    e & PAYLOAD
                }
                Some(op @ (0x8c | b'X')) => self.string(op, pos)?,
                _ => return Err(GiveUp),
            };
            pairs += 1;
            let op = next_op(data, pos).ok_or(GiveUp)?;
            if op == b']' && d + 1 < DEPTH {
                let v = match self.list(d + 1, pos, at)? {
                    Ok(v) => v,
                    Err(e) => return Ok(Err(e)),
                };
                if (key as usize) < NKEYS && !f.owns(key) {
                    f.set(key, v);
                } else if f.owns(key) || matches!(v, Value::Item(_)) {
                    // A list of blocks under a key no snapshot has, or a key repeated after
                    // one: the general machine frees what is dropped.
                    if let Value::Item(_) = v {
                        self.b.discard(v, at).map_err(|_| GiveUp)?;
                    }
                    return Err(GiveUp);
                }
            } else if (key as usize) < NKEYS {
                // A key repeated after a list of blocks: the general machine frees the list.
                if f.owns(key) {
                    return Err(GiveUp);
                }
                self.value(op, pos, f.slot(key))?;
            } else {
                self.other_value(op, pos)?;
            }
        }
    }

    /// A list at depth `d` (a value), its `EMPTY_LIST` read: of frames (memo references or
    /// frame dicts) or blocks, in batches or as a single appended item.
    fn list(&mut self, d: usize, pos: &mut usize, at: usize) -> Step<Result<Value>> {
        let memo = self.put(pos, OPENED)?;
        if self.b.fast.levels.len() <= d {
            self.b.fast.levels.resize_with(d + 1, Level::default);
        }
        let mut frames = std::mem::take(&mut self.b.fast.levels[d].frames);
        frames.clear();
        let mut blocks = BlockRun::default();
        let read = self.list_items(d, pos, &mut frames, &mut blocks, at);
        let v = match read {
            Ok(Ok(())) if blocks.count > 0 => {
                Ok(Ok(Value::Item(self.b.store(Item::Blocks(blocks, None)))))
            }
            Ok(Ok(())) if frames.is_empty() => Ok(Ok(Value::EmptyList)),
            Ok(Ok(())) => Ok(self.b.stack(&frames, at).map(Value::ListId)),
            Ok(Err(e)) => Ok(Err(e)),
            Err(GiveUp) => Err(GiveUp),
        };
        self.b.fast.levels[d].frames = frames;
        if let (Some(k), Ok(Ok(v))) = (memo, &v) {
            let entry = self.b.memo.entry(*v).unwrap_or(0);
            self.memo_set(k, entry);
        }
        v
    }

    /// The items of the list at depth `d`, into `frames` or `blocks`.
    #[inline(always)]
    fn list_items(
        &mut self,
        d: usize,
        pos: &mut usize,
        frames: &mut Vec<u32>,
        blocks: &mut BlockRun,
        at: usize,
    ) -> Step<Result<()>> {
        let data = self.data;
        loop {
            let mut p = *pos;
            match next_op(data, &mut p) {
                Some(b'(') => {
                    *pos = p;
                    loop {
                        if blocks.count == 0 {
                            self.frame_refs(frames, pos);
                        }
                        match next_op(data, pos).ok_or(GiveUp)? {
                            b'e' => break,
                            b'}' if d + 1 < DEPTH => match self.dict(d + 1, pos, at)? {
                                Ok(owned) => self.list_item(frames, blocks, owned)?,
                                Err(e) => return Ok(Err(e)),
                            },
                            _ => return Err(GiveUp),
                        }
                    }
                }
                // One item, appended without a mark (a list of one, or a batch of one): a
                // frame, a frame or block dict, or else the dict's next key or its end.
                Some(op @ (b'h' | b'j')) => {
                    let e = self.got(op, &mut p)?;
                    if e & TAG != T_DICT_ID {
                        break;
                    }
                    if next_op(data, &mut p) != Some(b'a') {
                        return Err(GiveUp);
                    }
                    *pos = p;
                    self.list_item(frames, blocks, Owned::V(Value::DictId(e & PAYLOAD)))?;
                }
                Some(b'}') if d + 1 < DEPTH => {
                    match self.dict(d + 1, &mut p, at)? {
                        Ok(owned) => self.list_item(frames, blocks, owned)?,
                        Err(e) => return Ok(Err(e)),
                    }
                    if next_op(data, &mut p) != Some(b'a') {
                        return Err(GiveUp);
                    }
                    *pos = p;
                }
                _ => break,
            }
        }
        // What follows is the dict's next key or its end, which the dict reads: a single item
        // of another kind (a string, say) is followed by `APPEND`, not by a value, and the dict
        // gives up there.
        Ok(Ok(()))
    }

    /// A dict read as an item of a list: a frame or a block (one kind per list).
    #[inline]
    fn list_item(
        &mut self,
        frames: &mut Vec<u32>,
        blocks: &mut BlockRun,
        owned: Owned,
    ) -> Step<()> {
        match owned {
            Owned::V(Value::DictId(id)) if blocks.count == 0 => frames.push(id),
            Owned::Item(Item::Block(b)) if frames.is_empty() => {
                blocks.push(&mut self.b.block_bytes, &b)
            }
            _ => return Err(GiveUp),
        }
        Ok(())
    }

    /// Memo references to frames at `*pos`, into `frames`, up to the first opcode that is not
    /// one: the most common opcodes of a recent PyTorch snapshot, in a tight loop.
    #[inline]
    fn frame_refs(&self, frames: &mut Vec<u32>, pos: &mut usize) {
        let data = self.data;
        let dense = &self.b.memo.dense[..];
        let mut p = *pos;
        // Five bytes ahead are there for either form, so one check covers the reference.
        while let Some(b) = data.get(p..p + 5) {
            let (key, n) = match b[0] {
                b'j' => (u32::from_le_bytes([b[1], b[2], b[3], b[4]]), 5),
                b'h' => (b[1] as u32, 2),
                0x95 => {
                    p += 9;
                    continue;
                }
                _ => break,
            };
            match dense.get(key as usize) {
                Some(&e) if e & TAG == T_DICT_ID => frames.push(e & PAYLOAD),
                _ => break,
            }
            p += n;
        }
        *pos = p;
    }
}
