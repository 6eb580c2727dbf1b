//! The typed snapshot built on the pickle machine: what the pickle's dicts and lists become as
//! they finish ([`Builder`], the machine's [`Build`]), and [`read`], which runs a whole pickle
//! through the machine into a [`Snapshot`].
//!
//! A frame dict becomes a [`Value::DictId`] (its id in the frame table) and a list of frames a
//! [`Value::ListId`] (its id in the stack table); blocks, segments, trace events and their lists
//! are [`Item`]s, held by slot until the container that takes them is filled.
//!
//! A dict is recognised by its keys when it is filled (its first `SETITEMS`, as every protocol
//! 1+ writer fills a dict of up to a thousand keys) or when it is used (protocol 0 fills item by
//! item): `filename` makes a frame, interned by its file, line and function; `state` a block;
//! `action` a trace event; `blocks` a segment; `segments` the snapshot itself. Only the keys a
//! snapshot has are kept while a dict is open, so a dict of a million other keys costs nothing.
//! A list is typed by its first item: frames (interned as a stack when the list is used),
//! blocks (encoded in a few bytes each when it is used), segments, trace events (folded as
//! they arrive: the allocations still live at the end, an index of the times, and the events
//! of a window when one was asked for) or traces. An item of the wrong kind is remembered with
//! its position, so that a list used as `blocks` or `segments` says which entry was not one.

use crate::model::{
    cut, Action, Block, BlockRun, BlockState, FormatError, Frame, Segment, Since, Snapshot,
    StackId, Survivor, TimeIndex, Trace, TraceEntry, NO_ADDRESS,
};
use crate::pickle::{self, Build, Kind, Memo, PickleError, Reader, Value};
use crate::record::Fast;
use rustc_hash::FxHashMap;
use std::borrow::Cow;
use std::sync::Arc;

/// How to read a snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Keep every trace's events from this point on ([`Trace::window`]), for `trim`.
    /// Without it, traces are folded and no event is kept.
    pub window: Option<Since>,
    /// Read every opcode through the general pickle machine, without the one-pass reader of
    /// blocks and events: slower, the same snapshot; tests check the one
    /// against the other.
    pub plain: bool,
}

/// What reading can fail on: the bytes (not a pickle, or a broken one) or the data (a pickle,
/// but not a snapshot).
#[derive(Debug, PartialEq)]
pub(crate) enum ReadError {
    Pickle(PickleError),
    Format(FormatError),
}

impl From<PickleError> for ReadError {
    fn from(e: PickleError) -> ReadError {
        ReadError::Pickle(e)
    }
}

impl From<FormatError> for ReadError {
    fn from(e: FormatError) -> ReadError {
        ReadError::Format(e)
    }
}

pub(crate) type Result<T> = std::result::Result<T, ReadError>;

fn malformed(at: usize, what: impl Into<String>) -> ReadError {
    pickle::malformed(at, what).into()
}

/// Reads a snapshot from a whole pickle.
pub(crate) fn read(data: &[u8], options: &ReadOptions) -> Result<Snapshot> {
    pickle::run(data, Builder::new(options), options.plain)
}

/// The keys a snapshot's dicts have, interned first so that a key's id is its index here.
const KEYS: [&str; 19] = [
    "filename",
    "line",
    "name",
    "address",
    "size",
    "requested_size",
    "state",
    "frames",
    "total_size",
    "stream",
    "segment_type",
    "blocks",
    "device",
    "action",
    "addr",
    "time_us",
    "device_free",
    "segments",
    "device_traces",
];
const K_FILENAME: u32 = 0;
const K_LINE: u32 = 1;
const K_NAME: u32 = 2;
const K_ADDRESS: u32 = 3;
const K_SIZE: u32 = 4;
const K_REQUESTED: u32 = 5;
const K_STATE: u32 = 6;
const K_FRAMES: u32 = 7;
const K_TOTAL: u32 = 8;
const K_STREAM: u32 = 9;
const K_TYPE: u32 = 10;
const K_BLOCKS: u32 = 11;
const K_DEVICE: u32 = 12;
const K_ACTION: u32 = 13;
const K_ADDR: u32 = 14;
const K_TIME: u32 = 15;
const K_DEVICE_FREE: u32 = 16;
const K_SEGMENTS: u32 = 17;
const K_TRACES: u32 = 18;
pub(crate) const NKEYS: usize = KEYS.len();

/// The block states, interned after the keys; then `?`, then the actions.
const STATES: [(&str, BlockState); 4] = [
    ("active_allocated", BlockState::ActiveAllocated),
    ("active_pending_free", BlockState::ActivePendingFree),
    ("active_awaiting_free", BlockState::ActivePendingFree),
    ("inactive", BlockState::Inactive),
];
const FIRST_STATE: u32 = NKEYS as u32;
const UNKNOWN: u32 = FIRST_STATE + STATES.len() as u32;
const FIRST_ACTION: u32 = UNKNOWN + 1;

/// The most dicts and lists open at once: a writer opens one per level of nesting (Python's
/// pickler stops at its recursion limit, about a thousand) plus the lists of a batch.
const MAX_OPEN: usize = 1 << 18;

/// The largest id a memo entry can hold.
const MAX_ID: usize = (1 << 29) - 1;
const NO_KEY: u32 = u32::MAX;

/// The keys of a snapshot dict that were set, with their values.
pub(crate) struct Fields {
    present: u32,
    /// The fields whose values are containers or items, which must be freed if not taken.
    owning: u32,
    vals: [Value; NKEYS],
}

impl Default for Fields {
    fn default() -> Fields {
        Fields {
            present: 0,
            owning: 0,
            vals: [Value::None; NKEYS],
        }
    }
}

impl Fields {
    pub(crate) fn clear(&mut self) {
        self.present = 0;
        self.owning = 0;
    }

    fn has(&self, k: u32) -> bool {
        self.present & (1 << k) != 0
    }

    /// Whether field `k` holds a container or item (`k` may be any key id).
    pub(crate) fn owns(&self, k: u32) -> bool {
        k < 32 && self.owning & (1 << k) != 0
    }

    fn get(&self, k: u32) -> Option<Value> {
        self.has(k).then(|| self.vals[k as usize])
    }

    /// Removes a field, so that what it holds is the taker's.
    fn take(&mut self, k: u32) -> Option<Value> {
        let v = self.get(k);
        self.present &= !(1 << k);
        self.owning &= !(1 << k);
        v
    }

    /// Sets a field; returns the value it replaces.
    #[inline]
    pub(crate) fn set(&mut self, k: u32, v: Value) -> Option<Value> {
        let old = self.take(k);
        self.present |= 1 << k;
        if matches!(v, Value::Dict(_) | Value::List(_) | Value::Item(_)) {
            self.owning |= 1 << k;
        }
        self.vals[k as usize] = v;
        old
    }

    /// Field `k`'s slot, marked present, for a value that holds nothing (a number, string,
    /// frame or stack) to be written over one that held nothing either.
    #[inline(always)]
    pub(crate) fn slot(&mut self, k: u32) -> &mut Value {
        self.present |= 1 << k;
        &mut self.vals[k as usize]
    }
}

/// A list entry that was not of the list's kind: where, and what it was.
#[derive(Debug, Clone)]
pub(crate) struct Odd {
    index: usize,
    found: String,
}

/// A trace event as read, before it is folded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    action: Action,
    /// The action's text id, written back for actions this reader does not know.
    text: u32,
    addr: u64,
    size: u64,
    stream: i64,
    /// `NONE_I64` when absent.
    time_us: i64,
    /// `NONE_U64` when absent.
    device_free: u64,
    stack: u32,
}

const NONE_I64: i64 = i64::MIN;
const NONE_U64: u64 = u64::MAX;

impl Event {
    fn time_us(&self) -> Option<i64> {
        (self.time_us != NONE_I64).then_some(self.time_us)
    }
}

/// A finished dict or list that some container will take.
pub(crate) enum Item {
    Block(Block),
    Segment(Segment),
    Event(Event),
    Root(Vec<Segment>, Vec<Trace>),
    Blocks(BlockRun, Option<Box<Odd>>),
    Segments(Vec<Segment>, Option<Box<Odd>>),
    Trace(Box<Trace>, Option<Box<Odd>>),
    Traces(Vec<Trace>, Option<Box<Odd>>),
    /// A list of nothing this reader knows.
    Odd(Box<Odd>),
}

impl Item {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Item::Block(_) | Item::Segment(_) | Item::Event(_) | Item::Root(..) => Kind::Dict,
            _ => Kind::List,
        }
    }

    /// A block, segment or trace event: what lists hold millions of.
    pub(crate) fn is_record(&self) -> bool {
        matches!(self, Item::Block(_) | Item::Segment(_) | Item::Event(_))
    }

    fn describe(&self) -> String {
        match self {
            Item::Block(_) => "a block".into(),
            Item::Segment(_) => "a segment".into(),
            Item::Event(_) => "a trace entry".into(),
            Item::Root(..) => "a snapshot".into(),
            Item::Blocks(..) => "a list of blocks".into(),
            Item::Segments(..) => "a list of segments".into(),
            Item::Trace(..) => "a list of trace entries".into(),
            Item::Traces(..) => "a list of traces".into(),
            // Not what the odd entry was: lists nested a million deep would spell it a million
            // times.
            Item::Odd(_) => "a list of something else".into(),
        }
    }
}

/// A value taken off the stack for good.
pub(crate) enum Owned {
    V(Value),
    Item(Item),
}

enum ListKind {
    Empty,
    /// The ids are in the slot's `frames`, a buffer kept between uses.
    Frames,
    /// Encoded when the list is finished, so that lists filled at the same time do not mix.
    Blocks(Vec<Block>),
    Segments(Vec<Segment>),
    Events(Box<Fold>),
    Traces(Vec<Trace>),
}

impl ListKind {
    /// The key whose absence makes a dict not this list's kind.
    fn expects(&self) -> Option<&'static str> {
        match self {
            ListKind::Blocks(_) => Some("state"),
            ListKind::Segments(_) => Some("blocks"),
            ListKind::Events(_) => Some("action"),
            _ => None,
        }
    }
}

/// A dict or list being filled.
struct Slot {
    is_dict: bool,
    /// The memo keys that hold it, to be pointed at what it becomes.
    memo: u32,
    more_memo: Vec<u32>,
    /// A dict's fields: `None` only while they are being filled.
    fields: Option<Box<Fields>>,
    /// The dict was set item by item or in several batches: it is finished when used.
    touched: bool,
    /// Where it is on the machine's stack (it is there once, until it is taken).
    pub(crate) at: usize,
    list: ListKind,
    count: usize,
    odd: Option<Box<Odd>>,
    frames: Vec<u32>,
}

/// One trace, folded as its events arrive.
pub(crate) struct Fold {
    len: u64,
    /// Allocations not freed so far, by address: (event index, size, stack).
    live: FxHashMap<u64, (u64, u64, u32)>,
    times: TimeIndex,
    window: Option<Since>,
    from: Option<u64>,
    kept: Vec<Event>,
}

impl Fold {
    #[inline]
    fn push(&mut self, e: Event) {
        let index = self.len;
        self.len += 1;
        match e.action {
            Action::Alloc => {
                self.live.insert(e.addr, (index, e.size, e.stack));
            }
            // The tensor let go of it: it no longer holds memory, whatever the stream does.
            Action::FreeRequested | Action::FreeCompleted => {
                self.live.remove(&e.addr);
            }
            _ => {}
        }
        if let Some(t) = e.time_us() {
            self.times.push(index, t);
        }
        if self.from.is_none() {
            let starts = match self.window {
                None => false,
                Some(Since::Event(i)) => index >= i as u64,
                Some(Since::Seconds(s)) => {
                    matches!((self.times.first_time(), e.time_us()), (Some(t0), Some(t)) if t >= cut(t0, s))
                }
            };
            if starts {
                self.from = Some(index);
            }
        }
        if self.from.is_some() {
            self.kept.push(e);
        }
    }
}

pub(crate) struct Builder<'a> {
    pub(crate) memo: Memo,
    /// What the one-pass reader of blocks and events keeps between dicts.
    pub(crate) fast: Fast,
    texts: Vec<Cow<'a, str>>,
    text_ids: FxHashMap<Cow<'a, [u8]>, u32>,
    arcs: FxHashMap<u32, Arc<str>>,
    /// The segment types seen (text id, index).
    segment_types: Vec<(u32, u32)>,
    /// Frames as written (file, line, function) and as kept (profile frames split), by id.
    frame_ids: FxHashMap<(u32, i64, u32), u32>,
    normal_ids: FxHashMap<(u32, i64, u32), u32>,
    frames: Vec<(u32, i64, u32)>,
    stack_ids: FxHashMap<Box<[u32]>, u32>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    items: Vec<Option<Item>>,
    free_items: Vec<u32>,
    window: Option<Since>,
    /// Every list's blocks, encoded as they arrive ([`BlockRun`]).
    pub(crate) block_bytes: Vec<u8>,
}

fn as_u64(v: Value) -> Option<u64> {
    match v {
        Value::Int(i) => Some(i.max(0) as u64),
        Value::UInt(u) => Some(u),
        Value::Bool(b) => Some(b as u64),
        Value::Float(f) if f.fract() == 0.0 => Some(f.max(0.0) as u64),
        _ => None,
    }
}

fn as_i64(v: Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(i),
        Value::UInt(u) => Some(i64::try_from(u).unwrap_or(i64::MAX)),
        Value::Bool(b) => Some(b as i64),
        Value::Float(f) if f.fract() == 0.0 => Some(f as i64),
        _ => None,
    }
}

fn missing(what: String) -> FormatError {
    FormatError::Missing(what)
}

impl<'a> Builder<'a> {
    pub(crate) fn new(options: &ReadOptions) -> Builder<'a> {
        let mut b = Builder {
            memo: Memo::default(),
            fast: Fast::default(),
            texts: Vec::new(),
            text_ids: FxHashMap::default(),
            arcs: FxHashMap::default(),
            segment_types: Vec::new(),
            frame_ids: FxHashMap::default(),
            normal_ids: FxHashMap::default(),
            frames: Vec::new(),
            stack_ids: FxHashMap::default(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            items: Vec::new(),
            free_items: Vec::new(),
            window: options.window,
            block_bytes: Vec::new(),
        };
        let known = KEYS
            .iter()
            .copied()
            .chain(STATES.iter().map(|s| s.0))
            .chain(["?"])
            .chain(Action::KNOWN.iter().map(|a| a.0));
        for (i, text) in known.enumerate() {
            b.text_ids.insert(Cow::Borrowed(text.as_bytes()), i as u32);
            b.texts.push(Cow::Borrowed(text));
        }
        b.stack_ids.insert(Box::from([]), 0);
        b
    }

    fn add_text(&mut self, key: Cow<'a, [u8]>, text: Cow<'a, str>, at: usize) -> Result<u32> {
        let id = self.texts.len();
        if id > MAX_ID {
            return Err(malformed(
                at,
                "more than 500 million distinct strings: not a snapshot",
            ));
        }
        self.text_ids.insert(key, id as u32);
        self.texts.push(text);
        Ok(id as u32)
    }

    fn arc(&mut self, id: u32) -> Arc<str> {
        let texts = &self.texts;
        self.arcs
            .entry(id)
            .or_insert_with(|| Arc::from(&*texts[id as usize]))
            .clone()
    }

    fn frame(&mut self, filename: u32, line: i64, name: u32, at: usize) -> Result<u32> {
        if let Some(&id) = self.frame_ids.get(&(filename, line, name)) {
            return Ok(id);
        }
        let normal = self.normalize(filename, line, name, at)?;
        let next = self.frames.len() as u32;
        let id = *self.normal_ids.entry(normal).or_insert(next);
        if id == next {
            if self.frames.len() > MAX_ID {
                return Err(malformed(
                    at,
                    "more than 500 million distinct frames: not a snapshot",
                ));
            }
            self.frames.push(normal);
        }
        self.frame_ids.insert((filename, line, name), id);
        Ok(id)
    }

    /// Snapshots converted from a profile (`_profile_to_snapshot`) carry Python frames as
    /// `{"filename": "none", "name": "path/file.py(35): handle"}`: split them into file, line
    /// and function like every other frame.
    fn normalize(
        &mut self,
        filename: u32,
        line: i64,
        name: u32,
        at: usize,
    ) -> Result<(u32, i64, u32)> {
        if &*self.texts[filename as usize] != "none" {
            return Ok((filename, line, name));
        }
        let text = self.texts[name as usize].to_string();
        let parsed = text.split_once("): ").and_then(|(place, func)| {
            let (file, line) = place.rsplit_once('(')?;
            Some((
                file.to_string(),
                line.parse::<i64>().ok()?,
                func.to_string(),
            ))
        });
        match parsed {
            Some((file, line, func)) => Ok((
                self.intern_owned(file.into_bytes(), at)?,
                line,
                self.intern_owned(func.into_bytes(), at)?,
            )),
            None => Ok((filename, line, name)),
        }
    }

    pub(crate) fn stack(&mut self, frames: &[u32], at: usize) -> Result<u32> {
        if let Some(&id) = self.stack_ids.get(frames) {
            return Ok(id);
        }
        let id = self.stack_ids.len();
        if id > MAX_ID {
            return Err(malformed(
                at,
                "more than 500 million distinct stacks: not a snapshot",
            ));
        }
        self.stack_ids.insert(Box::from(frames), id as u32);
        Ok(id as u32)
    }

    pub(crate) fn store(&mut self, item: Item) -> u32 {
        match self.free_items.pop() {
            Some(i) => {
                self.items[i as usize] = Some(item);
                i
            }
            None => {
                self.items.push(Some(item));
                self.items.len() as u32 - 1
            }
        }
    }

    fn take_item(&mut self, i: u32) -> Item {
        self.free_items.push(i);
        self.items[i as usize]
            .take()
            .expect("an item is taken once")
    }

    /// The memo keys of a finished container now hold what it became; the slot is free.
    #[inline]
    /// The memo entry for what a container became.
    pub(crate) fn entry_of(&mut self, became: &Owned) -> u32 {
        match became {
            Owned::V(v) => self.memo.entry(*v).unwrap_or(0),
            Owned::Item(item) => self.memo.entry(Value::Opaque(item.kind())).unwrap_or(0),
        }
    }

    fn release(&mut self, slot: u32, became: &Owned) {
        let entry = self.entry_of(became);
        let s = &mut self.slots[slot as usize];
        if s.memo != NO_KEY {
            self.memo.finished(s.memo, slot, entry);
            for &k in &s.more_memo {
                self.memo.finished(k, slot, entry);
            }
        }
        s.memo = NO_KEY;
        s.more_memo.clear();
        s.touched = false;
        s.list = ListKind::Empty;
        s.count = 0;
        s.odd = None;
        s.frames.clear();
        self.free_slots.push(slot);
    }

    /// Takes a value off the stack for good, finishing it if it is a container being filled.
    pub(crate) fn take(&mut self, v: Value, at: usize) -> Result<Owned> {
        let owned = match v {
            Value::Dict(slot) => {
                let mut f = self.slots[slot as usize]
                    .fields
                    .take()
                    .expect("a dict slot has fields");
                let owned = self.classify(&mut f, at)?;
                self.slots[slot as usize].fields = Some(f);
                self.release(slot, &owned);
                owned
            }
            Value::List(slot) => {
                let s = &mut self.slots[slot as usize];
                let odd = s.odd.take();
                let owned = match std::mem::replace(&mut s.list, ListKind::Empty) {
                    ListKind::Empty if s.count == 0 => Owned::V(Value::EmptyList),
                    ListKind::Empty => Owned::Item(Item::Odd(odd.unwrap_or_else(|| {
                        Box::new(Odd {
                            index: 0,
                            found: "something else".into(),
                        })
                    }))),
                    ListKind::Frames => {
                        let frames = std::mem::take(&mut self.slots[slot as usize].frames);
                        let id = self.stack(&frames, at);
                        self.slots[slot as usize].frames = frames;
                        Owned::V(Value::ListId(id?))
                    }
                    ListKind::Blocks(v) => {
                        let mut run = BlockRun::default();
                        for b in &v {
                            run.push(&mut self.block_bytes, b);
                        }
                        Owned::Item(Item::Blocks(run, odd))
                    }
                    ListKind::Segments(v) => Owned::Item(Item::Segments(v, odd)),
                    ListKind::Events(fold) => {
                        Owned::Item(Item::Trace(Box::new(self.trace(*fold)), odd))
                    }
                    ListKind::Traces(v) => Owned::Item(Item::Traces(v, odd)),
                };
                self.release(slot, &owned);
                owned
            }
            Value::Item(i) => Owned::Item(self.take_item(i)),
            v => Owned::V(v),
        };
        Ok(owned)
    }

    /// A value finished in place: a container being filled becomes what it is, an item goes
    /// to the item slots.
    #[inline]
    fn finish(&mut self, v: Value, at: usize) -> Result<Value> {
        match v {
            Value::Dict(_) | Value::List(_) => self.finish_container(v, at),
            v => Ok(v),
        }
    }

    fn finish_container(&mut self, v: Value, at: usize) -> Result<Value> {
        match self.take(v, at)? {
            Owned::V(v) => Ok(v),
            Owned::Item(item) => Ok(Value::Item(self.store(item))),
        }
    }

    /// Puts a batch of key-value pairs into `f`: the keys a snapshot has are kept (finished),
    /// the rest dropped.
    #[inline]
    fn fill(&mut self, f: &mut Fields, items: &[Value], at: usize) -> Result<()> {
        if !items.len().is_multiple_of(2) {
            return Err(malformed(at, "an odd number of dict items"));
        }
        for pair in items.chunks_exact(2) {
            self.set_field(f, pair[0], pair[1], at)?;
        }
        Ok(())
    }

    #[inline]
    fn set_field(&mut self, f: &mut Fields, k: Value, v: Value, at: usize) -> Result<()> {
        match k {
            Value::Str(id) if (id as usize) < NKEYS => {
                let v = self.finish(v, at)?;
                if let Some(old) = f.set(id, v) {
                    self.discard(old, at)?;
                }
            }
            k => {
                self.discard(k, at)?;
                self.discard(v, at)?;
            }
        }
        Ok(())
    }

    /// Adds a finished value to the list being filled in `slot`.
    pub(crate) fn append_owned(&mut self, slot: u32, owned: Owned) -> Result<()> {
        let window = self.window;
        let s = &mut self.slots[slot as usize];
        let index = s.count;
        s.count += 1;
        let odd = match (&mut s.list, owned) {
            (ListKind::Empty | ListKind::Frames, Owned::V(Value::DictId(f))) => {
                s.list = ListKind::Frames;
                s.frames.push(f);
                None
            }
            (ListKind::Empty, Owned::V(Value::EmptyList)) => {
                s.list = ListKind::Traces(vec![Trace::default()]);
                None
            }
            (ListKind::Traces(v), Owned::V(Value::EmptyList)) => {
                v.push(Trace::default());
                None
            }
            (ListKind::Empty, Owned::Item(Item::Block(b))) => {
                s.list = ListKind::Blocks(vec![b]);
                None
            }
            (ListKind::Blocks(v), Owned::Item(Item::Block(b))) => {
                v.push(b);
                None
            }
            (ListKind::Empty, Owned::Item(Item::Segment(x))) => {
                s.list = ListKind::Segments(vec![x]);
                None
            }
            (ListKind::Segments(v), Owned::Item(Item::Segment(x))) => {
                v.push(x);
                None
            }
            (ListKind::Empty, Owned::Item(Item::Event(e))) => {
                let mut fold = Box::new(Fold {
                    len: 0,
                    live: FxHashMap::default(),
                    times: TimeIndex::default(),
                    window,
                    from: None,
                    kept: Vec::new(),
                });
                fold.push(e);
                s.list = ListKind::Events(fold);
                None
            }
            (ListKind::Events(fold), Owned::Item(Item::Event(e))) => {
                fold.push(e);
                None
            }
            (ListKind::Empty, Owned::Item(Item::Trace(t, odd))) => {
                s.list = ListKind::Traces(vec![*t]);
                odd.map(|o| format!("a list whose entry {} is {}", o.index, o.found))
            }
            (ListKind::Traces(v), Owned::Item(Item::Trace(t, odd))) => {
                v.push(*t);
                odd.map(|o| format!("a list whose entry {} is {}", o.index, o.found))
            }
            // Frames that are not frame dicts are skipped, as the viewer does.
            (ListKind::Frames, _) => None,
            (kind, Owned::V(Value::Opaque(Kind::Dict))) => Some(
                kind.expects()
                    .map_or("a dict".to_string(), |k| format!("a dict without `{k}`")),
            ),
            (_, Owned::V(v)) => Some(v.kind().to_string()),
            (_, Owned::Item(item)) => Some(item.describe()),
        };
        if let (Some(found), None) = (odd, &s.odd) {
            s.odd = Some(Box::new(Odd { index, found }));
        }
        Ok(())
    }

    fn trace(&mut self, fold: Fold) -> Trace {
        let mut survivors: Vec<Survivor> = fold
            .live
            .into_iter()
            .map(|(_, (index, size, stack))| Survivor {
                index,
                size,
                stack: StackId(stack),
            })
            .collect();
        survivors.sort_unstable_by_key(|s| s.index);
        let window = fold
            .kept
            .into_iter()
            .map(|e| TraceEntry {
                action: e.action,
                other_action: (e.action == Action::Other).then(|| self.arc(e.text)),
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                time_us: e.time_us(),
                device_free: (e.device_free != NONE_U64).then_some(e.device_free),
                stack: StackId(e.stack),
            })
            .collect();
        Trace {
            len: fold.len as usize,
            survivors,
            times: fold.times,
            window,
            window_from: fold.from.unwrap_or(fold.len) as usize,
        }
    }

    /// Frees what the fields of an abandoned dict hold.
    pub(crate) fn discard_fields(&mut self, f: &mut Fields, at: usize) -> Result<()> {
        let mut rest = f.present & f.owning;
        f.clear();
        while rest != 0 {
            let k = rest.trailing_zeros();
            rest &= !(1 << k);
            self.discard(f.vals[k as usize], at)?;
        }
        Ok(())
    }

    /// What a dict is, from its keys; whatever it does not use is dropped.
    pub(crate) fn classify(&mut self, f: &mut Fields, at: usize) -> Result<Owned> {
        let owned = if f.has(K_SEGMENTS) {
            self.root(f, at)?
        } else if f.has(K_BLOCKS) {
            self.segment(f, at)?
        } else if f.has(K_ACTION) {
            self.event(f, at)?
        } else if f.has(K_STATE) {
            self.block(f, at)?
        } else {
            match (f.get(K_FILENAME), f.get(K_NAME)) {
                (Some(Value::Str(file)), name) => {
                    let name = match name {
                        Some(Value::Str(n)) => n,
                        _ => UNKNOWN,
                    };
                    let line = f.get(K_LINE).and_then(as_i64).unwrap_or(0);
                    Owned::V(Value::DictId(self.frame(file, line, name, at)?))
                }
                _ => Owned::V(Value::Opaque(Kind::Dict)),
            }
        };
        let mut rest = f.present & f.owning;
        f.clear();
        while rest != 0 {
            let k = rest.trailing_zeros();
            rest &= !(1 << k);
            self.discard(f.vals[k as usize], at)?;
        }
        Ok(owned)
    }

    fn stack_of(f: &Fields) -> u32 {
        match f.get(K_FRAMES) {
            Some(Value::ListId(id)) => id,
            _ => 0,
        }
    }

    fn block(&mut self, f: &mut Fields, at: usize) -> Result<Owned> {
        let state = match f.get(K_STATE) {
            Some(Value::Str(id)) => match id
                .checked_sub(FIRST_STATE)
                .and_then(|i| STATES.get(i as usize))
            {
                Some(&(_, state)) => state,
                None => {
                    return Err(missing(format!(
                        "a block at byte {at} has an unknown state `{}`",
                        self.texts[id as usize]
                    ))
                    .into())
                }
            },
            other => {
                return Err(missing(format!(
                    "a block at byte {at} has a `state` that is {}, not a str",
                    other.map_or("missing", |v| v.kind())
                ))
                .into())
            }
        };
        let size = f
            .get(K_SIZE)
            .and_then(as_u64)
            .ok_or_else(|| missing(format!("a block at byte {at} has no number `size`")))?;
        Ok(Owned::Item(Item::Block(Block {
            address: f.get(K_ADDRESS).and_then(as_u64).unwrap_or(NO_ADDRESS),
            size,
            requested_size: f.get(K_REQUESTED).and_then(as_u64).unwrap_or(size),
            stack: StackId(Self::stack_of(f)),
            state,
        })))
    }

    fn event(&mut self, f: &mut Fields, at: usize) -> Result<Owned> {
        let (action, text) = match f.get(K_ACTION) {
            Some(Value::Str(id)) => {
                let known = id
                    .checked_sub(FIRST_ACTION)
                    .and_then(|i| Action::KNOWN.get(i as usize));
                (known.map_or(Action::Other, |a| a.1), id)
            }
            other => {
                return Err(missing(format!(
                    "a trace entry at byte {at} has an `action` that is {}, not a str",
                    other.map_or("missing", |v| v.kind())
                ))
                .into())
            }
        };
        let addr = match f.get(K_ADDR) {
            Some(Value::Int(i)) => i as u64,
            Some(v) => as_u64(v).unwrap_or(0),
            None => 0,
        };
        Ok(Owned::Item(Item::Event(Event {
            action,
            text,
            addr,
            size: f.get(K_SIZE).and_then(as_u64).unwrap_or(0),
            stream: f.get(K_STREAM).and_then(as_i64).unwrap_or(0),
            time_us: f.get(K_TIME).and_then(as_i64).unwrap_or(NONE_I64),
            device_free: f.get(K_DEVICE_FREE).and_then(as_u64).unwrap_or(NONE_U64),
            stack: Self::stack_of(f),
        })))
    }

    fn segment(&mut self, f: &mut Fields, at: usize) -> Result<Owned> {
        let blocks = match f.take(K_BLOCKS) {
            Some(Value::EmptyList) => BlockRun::default(),
            Some(Value::Item(i)) => match self.take_item(i) {
                Item::Blocks(run, None) => run,
                Item::Blocks(_, Some(odd)) | Item::Odd(odd) => {
                    return Err(missing(format!("the `blocks` of the segment at byte {at}: entry {} is {}, not a block dict with `state`", odd.index, odd.found)).into())
                }
                other => return Err(missing(format!("the `blocks` of the segment at byte {at} is {}, not a list of blocks", other.describe())).into()),
            },
            other => return Err(missing(format!("the segment at byte {at} has `blocks` that is {}, not a list", other.map_or("missing", |v| v.kind()))).into()),
        };
        let number = |k: u32, name: &str| {
            f.get(k)
                .and_then(as_u64)
                .ok_or_else(|| missing(format!("the segment at byte {at} has no number `{name}`")))
        };
        let (address, total_size) = (
            number(K_ADDRESS, "address")?,
            number(K_TOTAL, "total_size")?,
        );
        let text = match f.get(K_TYPE) {
            Some(Value::Str(id)) => id,
            _ => UNKNOWN,
        };
        // A handful of types over millions of segments: a short search.
        let segment_type = match self.segment_types.iter().find(|(t, _)| *t == text) {
            Some(&(_, index)) => index,
            None => {
                let index = self.segment_types.len() as u32;
                self.segment_types.push((text, index));
                index
            }
        };
        Ok(Owned::Item(Item::Segment(Segment {
            device: f.get(K_DEVICE).and_then(as_i64).unwrap_or(0),
            address,
            total_size,
            stream: f.get(K_STREAM).and_then(as_i64).unwrap_or(0),
            segment_type,
            blocks_at: blocks.start,
            block_count: blocks.count,
        })))
    }

    fn root(&mut self, f: &mut Fields, at: usize) -> Result<Owned> {
        let segments = match f.take(K_SEGMENTS) {
            Some(Value::EmptyList) => Vec::new(),
            Some(Value::Item(i)) => match self.take_item(i) {
                Item::Segments(v, None) => v,
                Item::Segments(_, Some(odd)) | Item::Odd(odd) => {
                    return Err(missing(format!(
                        "segments[{}] is {}, not a segment dict with `blocks`",
                        odd.index, odd.found
                    ))
                    .into())
                }
                other => {
                    return Err(FormatError::NotASnapshot(format!(
                        "a dict whose `segments` is {}",
                        other.describe()
                    ))
                    .into())
                }
            },
            other => {
                return Err(FormatError::NotASnapshot(format!(
                    "a dict whose `segments` is {}",
                    other.map_or("missing", |v| v.kind())
                ))
                .into())
            }
        };
        let traces =
            match f.take(K_TRACES) {
                None | Some(Value::EmptyList) => Vec::new(),
                Some(Value::Item(i)) => match self.take_item(i) {
                    Item::Traces(v, None) => v,
                    Item::Traces(_, Some(odd)) | Item::Odd(odd) => {
                        return Err(missing(format!(
                            "device_traces[{}] is {}, not a list of trace entries",
                            odd.index, odd.found
                        ))
                        .into())
                    }
                    Item::Trace(..) => return Err(missing(
                        "device_traces is one list of trace entries, not a list of them per device"
                            .into(),
                    )
                    .into()),
                    other => {
                        return Err(missing(format!(
                            "device_traces is {}, not a list of traces",
                            other.describe()
                        ))
                        .into())
                    }
                },
                Some(v) => {
                    return Err(missing(format!(
                        "device_traces is {}, not a list of traces",
                        v.kind()
                    ))
                    .into())
                }
            };
        let _ = at;
        Ok(Owned::Item(Item::Root(segments, traces)))
    }
}

impl<'a> Build<'a> for Builder<'a> {
    type Error = ReadError;
    type Done = Owned;
    type Output = Snapshot;

    #[inline(always)]
    fn memo(&self) -> &Memo {
        &self.memo
    }

    #[inline(always)]
    fn memo_mut(&mut self) -> &mut Memo {
        &mut self.memo
    }

    fn intern(&mut self, bytes: &'a [u8], at: usize) -> Result<u32> {
        if let Some(&id) = self.text_ids.get(bytes) {
            return Ok(id);
        }
        let text =
            std::str::from_utf8(bytes).map_err(|_| malformed(at, "a string that is not UTF-8"))?;
        self.add_text(Cow::Borrowed(bytes), Cow::Borrowed(text), at)
    }

    fn intern_owned(&mut self, bytes: Vec<u8>, at: usize) -> Result<u32> {
        if let Some(&id) = self.text_ids.get(&bytes[..]) {
            return Ok(id);
        }
        let text =
            String::from_utf8(bytes).map_err(|_| malformed(at, "a string that is not UTF-8"))?;
        self.add_text(Cow::Owned(text.clone().into_bytes()), Cow::Owned(text), at)
    }

    #[inline]
    fn new_slot(&mut self, is_dict: bool, at: usize) -> Result<u32> {
        let id = match self.free_slots.pop() {
            Some(id) => id,
            None => {
                if self.slots.len() >= MAX_OPEN {
                    return Err(malformed(at, format!("more than {MAX_OPEN} dicts and lists open at once, nested deeper than any snapshot writer nests them (a corrupt or hostile file?)")));
                }
                self.slots.push(Slot {
                    is_dict,
                    memo: NO_KEY,
                    more_memo: Vec::new(),
                    fields: None,
                    touched: false,
                    at: 0,
                    list: ListKind::Empty,
                    count: 0,
                    odd: None,
                    frames: Vec::new(),
                });
                self.slots.len() as u32 - 1
            }
        };
        let s = &mut self.slots[id as usize];
        s.is_dict = is_dict;
        if is_dict && s.fields.is_none() {
            s.fields = Some(Box::default());
        }
        Ok(id)
    }

    /// Whether `slot` is a dict's; `None` for a slot that was never handed out.
    fn is_dict(&self, slot: u32) -> Option<bool> {
        self.slots.get(slot as usize).map(|s| s.is_dict)
    }

    #[inline]
    /// The stack position of the container in `slot`.
    fn place_of(&mut self, slot: u32) -> &mut usize {
        &mut self.slots[slot as usize].at
    }

    fn remember(&mut self, slot: u32, key: u32) {
        let s = &mut self.slots[slot as usize];
        if s.memo == NO_KEY {
            s.memo = key;
        } else {
            s.more_memo.push(key);
        }
    }

    /// `SETITEMS` (or `DICT`) on `target`: a dict's first batch finishes it (`Some`), as every
    /// writer of protocol 1 or later fills a dict of up to a thousand keys in one batch. A
    /// later batch goes nowhere: no snapshot dict has a thousand keys. Finishing it now keeps
    /// open containers few even for a list of a million dicts written in one batch. An empty
    /// batch (protocol 0's `(dp0`, filled item by item after) leaves it open.
    fn set_items(&mut self, target: Value, items: &[Value], at: usize) -> Result<Option<Owned>> {
        match target {
            Value::Dict(slot) => {
                let mut f = self.slots[slot as usize]
                    .fields
                    .take()
                    .expect("a dict slot has fields");
                // Protocol 0 opens every dict empty (`(dp0`) and then sets it item by item.
                let touched =
                    std::mem::replace(&mut self.slots[slot as usize].touched, !items.is_empty());
                self.fill(&mut f, items, at)?;
                if !touched && !items.is_empty() {
                    let owned = self.classify(&mut f, at)?;
                    self.slots[slot as usize].fields = Some(f);
                    self.release(slot, &owned);
                    return Ok(Some(owned));
                }
                self.slots[slot as usize].fields = Some(f);
                Ok(None)
            }
            // An object's state, a dict filled by its reduce or a dict already finished.
            Value::Opaque(_) => {
                for &v in items {
                    self.discard(v, at)?;
                }
                Ok(None)
            }
            other => Err(malformed(
                at,
                format!("SETITEMS on {}, not a dict{}", other.kind(), reused(other)),
            )),
        }
    }

    /// `SETITEM`: one pair, the way protocol 0 fills a dict.
    fn set_item(&mut self, target: Value, k: Value, v: Value, at: usize) -> Result<()> {
        match target {
            Value::Dict(slot) => {
                let mut f = self.slots[slot as usize]
                    .fields
                    .take()
                    .expect("a dict slot has fields");
                self.slots[slot as usize].touched = true;
                let r = self.set_field(&mut f, k, v, at);
                self.slots[slot as usize].fields = Some(f);
                r
            }
            Value::Opaque(_) => {
                self.discard(k, at)?;
                self.discard(v, at)
            }
            other => Err(malformed(
                at,
                format!("SETITEM on {}, not a dict{}", other.kind(), reused(other)),
            )),
        }
    }

    /// `APPEND`, `APPENDS`, `LIST` or `ADDITEMS` on `target`.
    fn append(&mut self, target: Value, items: &[Value], at: usize) -> Result<()> {
        match target {
            Value::List(slot) => {
                // The common batch, a stack's frames, goes straight into the list.
                let s = &mut self.slots[slot as usize];
                let mut rest = items;
                if matches!(s.list, ListKind::Empty | ListKind::Frames) {
                    let run = items
                        .iter()
                        .take_while(|v| matches!(v, Value::DictId(_)))
                        .count();
                    if run > 0 {
                        s.list = ListKind::Frames;
                        s.frames.extend(items[..run].iter().map(|v| {
                            if let Value::DictId(f) = v {
                                *f
                            } else {
                                0
                            }
                        }));
                        s.count += run;
                        rest = &items[run..];
                    }
                }
                for &v in rest {
                    let owned = self.take(v, at)?;
                    self.append_owned(slot, owned)?;
                }
                Ok(())
            }
            // A set, or an object with list-like state: not a snapshot's.
            Value::Opaque(_) => {
                for &v in items {
                    self.discard(v, at)?;
                }
                Ok(())
            }
            other => Err(malformed(
                at,
                format!("APPENDS to {}, not a list{}", other.kind(), reused(other)),
            )),
        }
    }

    /// Whether the list being filled in `slot` can take a run of frames.
    fn takes_dict_ids(&self, slot: u32) -> bool {
        matches!(
            self.slots[slot as usize].list,
            ListKind::Empty | ListKind::Frames
        )
    }

    /// A run of frames appended to the list in `slot` (which [`Build::takes_dict_ids`]).
    fn append_dict_ids(&mut self, slot: u32, frames: &[u32]) {
        let s = &mut self.slots[slot as usize];
        if !frames.is_empty() {
            s.list = ListKind::Frames;
            s.frames.extend_from_slice(frames);
            s.count += frames.len();
        }
    }

    /// Drops a value taken off the stack: only containers and items have anything to free.
    #[inline]
    fn discard(&mut self, v: Value, at: usize) -> Result<()> {
        match v {
            Value::Dict(_) | Value::List(_) | Value::Item(_) => self.take(v, at).map(drop),
            _ => Ok(()),
        }
    }

    fn freeze(&mut self, v: Value, at: usize) -> Result<Value> {
        Ok(match self.take(v, at)? {
            Owned::V(f) => f,
            Owned::Item(item) => Value::Opaque(item.kind()),
        })
    }

    /// The dict at `pos` was filled and became `owned`. A block, segment or trace event that
    /// is the only item above the mark of a list being filled goes into that list now, rather
    /// than waiting on the stack for the list's `APPENDS`: writers that append a whole list in
    /// one batch (PyTorch's C++ pickler) would otherwise stack millions of them.
    #[inline]
    fn place(r: &mut Reader<'a, Self>, pos: usize, owned: Owned) -> Result<()> {
        let v = match owned {
            Owned::Item(item) if item.is_record() && pos + 1 == r.stack.len() => {
                match r.list_below(pos) {
                    Some(slot) => {
                        r.stack.pop();
                        return r.b.append_owned(slot, Owned::Item(item));
                    }
                    None => Value::Item(r.b.store(item)),
                }
            }
            Owned::Item(item) => Value::Item(r.b.store(item)),
            Owned::V(v) => v,
        };
        r.stack[pos] = v;
        Ok(())
    }

    /// Segments, blocks and events are read in one pass ([`crate::record`]).
    #[inline(always)]
    fn dict_ahead(r: &mut Reader<'a, Self>, at: usize) -> Result<bool> {
        r.record(at)
    }

    /// The snapshot, from the value `STOP` found on the stack.
    fn stop(mut self, top: Value, at: usize) -> Result<Snapshot> {
        let (segments, traces) = match self.take(top, at)? {
            Owned::Item(Item::Root(segments, traces)) => (segments, traces),
            Owned::Item(item) => {
                return Err(FormatError::NotASnapshot(item.kind().name().into()).into())
            }
            Owned::V(Value::Opaque(Kind::Dict) | Value::DictId(_)) => {
                return Err(
                    FormatError::NotASnapshot("a dict without a `segments` list".into()).into(),
                )
            }
            Owned::V(v) => return Err(FormatError::NotASnapshot(v.kind().into()).into()),
        };
        let frames = std::mem::take(&mut self.frames)
            .into_iter()
            .map(|(filename, line, name)| Frame {
                filename: self.arc(filename),
                line,
                name: self.arc(name),
            })
            .collect();
        let mut stacks: Vec<Box<[u32]>> = vec![Box::from([]); self.stack_ids.len()];
        for (frames, id) in std::mem::take(&mut self.stack_ids) {
            stacks[id as usize] = frames;
        }
        let block_bytes = std::mem::take(&mut self.block_bytes);
        let mut types = std::mem::take(&mut self.segment_types);
        types.sort_by_key(|&(_, index)| index);
        let segment_types = types.into_iter().map(|(text, _)| self.arc(text)).collect();
        Ok(Snapshot {
            segments,
            traces,
            block_bytes,
            segment_types,
            frames,
            stacks,
        })
    }
}

/// A hint for an append or set on a list or dict that was already finished.
fn reused(v: Value) -> &'static str {
    match v {
        Value::EmptyList | Value::ListId(_) | Value::DictId(_) | Value::Item(_) => {
            " (it was already complete: a container that holds itself?)"
        }
        _ => "",
    }
}
