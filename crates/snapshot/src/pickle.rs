//! A streaming pickle machine (protocols 0 to 5): the stack, the marks, the memo's encoding and
//! every opcode, and nothing of what the pickle means. What a dict or list becomes when it is
//! filled is its builder's (`Build`; for a snapshot, `build`'s: frames, stacks, blocks, trace
//! events); the builder may also read a dict ahead in one pass (`Build::dict_ahead`). No value
//! tree is ever built: a value on the stack is sixteen bytes (a number, a string's id in the
//! builder's intern table, the id of a dict or list the builder interned, or the slot of a
//! container being filled), and the memo is four bytes a key.
//!
//! Why not serde-pickle or a generic reader: snapshots run to gigabytes, most of their bytes are
//! stack frames that repeat, and a value tree of them costs several times the file (the reader
//! this one replaced took 5.3 times a 1 GB file and 20 s). Here strings are read in place from
//! the memory-mapped file and handed to the builder to intern, and a batch of references to
//! interned dicts goes straight into its list.
//!
//! Hostile input: every length is checked against the bytes left before anything is read or
//! allocated, the stack is capped at [`MAX_STACK`] values (the builder caps its open
//! containers), memo keys far beyond what was stored go to a sparse map, nothing recurses,
//! nothing is quadratic, and a container referred to while it is still being filled (a cycle)
//! is frozen as it stands (`Build::freeze`), so that filling it further is an error.

use rustc_hash::FxHashMap;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PickleError {
    #[error("not a pickle: it does not start with a pickle opcode (first byte 0x{0:02x})")]
    NotPickle(u8),
    #[error("the pickle is truncated at byte {0} of {1}: the file was cut short (an interrupted dump or copy?)")]
    Truncated(usize, usize),
    #[error("unsupported pickle opcode 0x{op:02x} at byte {at}")]
    Opcode { op: u8, at: usize },
    #[error("malformed pickle at byte {at}: {what}")]
    Malformed { at: usize, what: String },
}

/// The machine's own steps fail with a [`PickleError`]; those that hand values to the builder
/// with the builder's error, which a `PickleError` converts into.
pub(crate) type Result<T, E = PickleError> = std::result::Result<T, E>;

/// What the machine hands the pickle's values to. The machine keeps the stack and the marks and
/// reads the opcodes; the builder decides what each dict and list becomes when it is filled,
/// keeps the containers being filled (by slot) and the memo (whose keys that held a container
/// must hold what it became).
pub(crate) trait Build<'a>: Sized {
    /// What reading fails on: the pickle's errors and the builder's own.
    type Error: From<PickleError>;
    /// What a dict became when a batch finished it, for [`Build::place`].
    type Done;
    /// What the whole pickle becomes.
    type Output;

    fn memo(&self) -> &Memo;
    fn memo_mut(&mut self) -> &mut Memo;
    /// A string's id: `bytes` are in the data, read in place.
    fn intern(&mut self, bytes: &'a [u8], at: usize) -> Result<u32, Self::Error>;
    /// A string's id, decoded from the data.
    fn intern_owned(&mut self, bytes: Vec<u8>, at: usize) -> Result<u32, Self::Error>;
    /// A slot for a new dict or list to fill.
    fn new_slot(&mut self, is_dict: bool, at: usize) -> Result<u32, Self::Error>;
    /// Whether `slot` is a dict's; `None` for a slot that was never handed out.
    fn is_dict(&self, slot: u32) -> Option<bool>;
    /// Where the container in `slot` sits on the machine's stack (the machine keeps it there).
    fn place_of(&mut self, slot: u32) -> &mut usize;
    /// `key` is a memo key that holds the container in `slot`.
    fn remember(&mut self, slot: u32, key: u32);
    /// `SETITEMS` or `DICT` on `target`: `Some` when the batch finished the dict.
    fn set_items(
        &mut self,
        target: Value,
        items: &[Value],
        at: usize,
    ) -> Result<Option<Self::Done>, Self::Error>;
    /// `SETITEM` on `target`.
    fn set_item(&mut self, target: Value, k: Value, v: Value, at: usize)
        -> Result<(), Self::Error>;
    /// `APPEND`, `APPENDS`, `LIST` or `ADDITEMS` on `target`.
    fn append(&mut self, target: Value, items: &[Value], at: usize) -> Result<(), Self::Error>;
    /// Whether the list in `slot` takes a run of interned dicts ([`Value::DictId`]) at once.
    fn takes_dict_ids(&self, slot: u32) -> bool;
    /// A run of interned dicts appended to the list in `slot` (which [`Build::takes_dict_ids`]).
    fn append_dict_ids(&mut self, slot: u32, ids: &[u32]);
    /// Drops a value taken off the stack.
    fn discard(&mut self, v: Value, at: usize) -> Result<(), Self::Error>;
    /// A container being filled, or an item, referred to again: finished as it stands.
    fn freeze(&mut self, v: Value, at: usize) -> Result<Value, Self::Error>;
    /// Puts what the dict at stack position `pos` became in its place on the stack (or
    /// straight into the list below it).
    fn place(r: &mut Reader<'a, Self>, pos: usize, done: Self::Done) -> Result<(), Self::Error>;
    /// At `EMPTY_DICT` (read): reads the dict ahead if the builder can, and puts it where the
    /// machine would have. `Ok(false)`: nothing was read, and the machine reads the dict.
    fn dict_ahead(r: &mut Reader<'a, Self>, at: usize) -> Result<bool, Self::Error>;
    /// What the value that `STOP` found on the stack becomes.
    fn stop(self, top: Value, at: usize) -> Result<Self::Output, Self::Error>;
}

/// The most values the stack may hold at once. A snapshot writer's stack holds a batch of at
/// most a thousand items per open container, a few containers deep (blocks and events go
/// straight into their lists even from a writer that does not batch); a million values (16 MB)
/// only a hostile or broken file reaches.
pub const MAX_STACK: usize = 1 << 20;

/// What a finished value that cannot be looked into was, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bytes,
    Tuple,
    List,
    Dict,
    Set,
    Object,
}

impl Kind {
    pub(crate) fn from_u32(v: u32) -> Kind {
        [
            Kind::Bytes,
            Kind::Tuple,
            Kind::List,
            Kind::Dict,
            Kind::Set,
            Kind::Object,
        ][(v as usize).min(5)]
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Bytes => "bytes",
            Kind::Tuple => "a tuple",
            Kind::List => "a list",
            Kind::Dict => "a dict",
            Kind::Set => "a set",
            Kind::Object => "an object",
        }
    }
}

/// A value on the pickle stack.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer from 2^63 to 2^64 - 1 (Python writes these in nine bytes).
    UInt(u64),
    /// An integer beyond 64 bits: no field of a snapshot holds one.
    Huge,
    Float(f64),
    /// A string, by its id in the builder's intern table.
    Str(u32),
    /// A finished dict that the builder interned, by its id.
    DictId(u32),
    /// A finished list that the builder interned, by its id.
    ListId(u32),
    /// A finished empty list.
    EmptyList,
    /// A dict being filled, by its slot.
    Dict(u32),
    /// A list being filled, by its slot.
    List(u32),
    /// A finished dict or list that the builder holds until the container that takes it is
    /// filled, by its slot there.
    Item(u32),
    /// Anything else, finished.
    Opaque(Kind),
}

impl Value {
    /// What kind of value this is, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::UInt(_) | Value::Huge => "an int",
            Value::Float(_) => "a float",
            Value::Str(_) => "a str",
            Value::DictId(_) | Value::Dict(_) => "a dict",
            Value::ListId(_) | Value::EmptyList | Value::List(_) => "a list",
            Value::Item(_) => "a dict or list",
            Value::Opaque(k) => k.name(),
        }
    }
}

/// A memo entry in four bytes: a tag in the top three bits, an id below.
pub(crate) const PAYLOAD: u32 = (1 << 29) - 1;
pub(crate) const T_STR: u32 = 1 << 29;
pub(crate) const T_DICT_ID: u32 = 2 << 29;
pub(crate) const T_LIST_ID: u32 = 3 << 29;
pub(crate) const T_OPEN: u32 = 4 << 29;
pub(crate) const T_SCALAR: u32 = 5 << 29;
pub(crate) const T_OPAQUE: u32 = 6 << 29;
pub(crate) const T_EMPTY: u32 = 7 << 29;
pub(crate) const TAG: u32 = 7 << 29;

/// The memo: dense while keys come in order (every writer's case), sparse for keys far beyond
/// what was stored, so that a key of four billion in a small file costs one map entry.
#[derive(Default)]
pub(crate) struct Memo {
    pub(crate) dense: Vec<u32>,
    sparse: FxHashMap<u32, u32>,
    /// Distinct keys stored: MEMOIZE stores at this key, as Python's unpickler does.
    pub(crate) count: u32,
    /// Numbers and None that were memoized (no writer here does; kept for correctness).
    pub(crate) scalars: Vec<Value>,
}

impl Memo {
    #[inline]
    pub(crate) fn get(&self, key: u32) -> u32 {
        match self.dense.get(key as usize) {
            Some(&e) => e,
            None => self.sparse.get(&key).copied().unwrap_or(0),
        }
    }

    #[inline]
    pub(crate) fn set(&mut self, key: u32, entry: u32) {
        let k = key as usize;
        if k < self.dense.len() {
            self.count += (self.dense[k] == 0) as u32;
            self.dense[k] = entry;
        } else if k == self.dense.len() && self.sparse.is_empty() {
            self.dense.push(entry);
            self.count += 1;
        } else if k < 2 * self.count as usize + 1024 && self.sparse.is_empty() {
            self.dense.resize(k + 1, 0);
            self.dense[k] = entry;
            self.count += 1;
        } else {
            self.count += self.sparse.insert(key, entry).is_none() as u32;
        }
    }

    /// The dense memo's length.
    pub(crate) fn len(&self) -> usize {
        self.dense.len()
    }

    /// Whether storing at `key` is an append past `from` (a key no older entry holds), which
    /// `truncate(from)` undoes.
    #[inline]
    pub(crate) fn appends(&self, key: u32, from: usize) -> bool {
        let k = key as usize;
        self.sparse.is_empty() && k >= from && k <= self.dense.len()
    }

    /// Drops the dense entries from `len` on.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.dense.truncate(len);
    }

    /// Puts back what a key held (`0`: nothing), leaving the count to the caller.
    pub(crate) fn restore(&mut self, key: u32, entry: u32) {
        match self.dense.get_mut(key as usize) {
            Some(e) => *e = entry,
            None if entry == 0 => {
                self.sparse.remove(&key);
            }
            None => {
                self.sparse.insert(key, entry);
            }
        }
    }

    /// After a container finishes: the keys that held it now hold what it became.
    #[inline]
    pub(crate) fn finished(&mut self, key: u32, slot: u32, entry: u32) {
        if self.get(key) == T_OPEN | slot {
            self.set(key, entry);
        }
    }

    /// The entry for a finished value.
    #[inline]
    pub(crate) fn entry(&mut self, v: Value) -> std::result::Result<u32, String> {
        let id = |tag: u32, id: u32| {
            if id <= PAYLOAD {
                Ok(tag | id)
            } else {
                Err("more than 500 million distinct values in the memo".to_string())
            }
        };
        match v {
            Value::Str(s) => id(T_STR, s),
            Value::DictId(f) => id(T_DICT_ID, f),
            Value::ListId(s) => id(T_LIST_ID, s),
            Value::EmptyList => Ok(T_EMPTY),
            Value::Dict(slot) | Value::List(slot) => id(T_OPEN, slot),
            Value::Item(_) => Ok(T_OPAQUE | Kind::Dict as u32),
            Value::Opaque(k) => Ok(T_OPAQUE | k as u32),
            Value::None
            | Value::Bool(_)
            | Value::Int(_)
            | Value::UInt(_)
            | Value::Huge
            | Value::Float(_) => {
                self.scalars.push(v);
                id(T_SCALAR, self.scalars.len() as u32 - 1)
            }
        }
    }
}

/// Runs a whole pickle through the machine into `b`. `plain`: no shortcuts, every opcode
/// through the general steps (slower, the same result; tests compare the two).
pub(crate) fn run<'a, B: Build<'a>>(
    data: &'a [u8],
    b: B,
    plain: bool,
) -> Result<B::Output, B::Error> {
    match data.first() {
        None => return Err(PickleError::Truncated(0, 0).into()),
        Some(&b) if !(b == 0x80 || b == 0x95 || b"(}])NKJILFGMcVSXUT\x8c\x88\x89".contains(&b)) => {
            return Err(PickleError::NotPickle(b).into())
        }
        _ => {}
    }
    let mut r = Reader {
        data,
        pos: 0,
        stack: Vec::with_capacity(1024),
        marks: Vec::new(),
        b,
        run: Vec::new(),
        plain,
    };
    loop {
        let at = r.pos;
        let op = r.u8()?;
        // The opcodes that make most of a snapshot's bytes are handled here, the rest in `step`.
        match op {
            b'h' | b'j' => {
                let key = if op == b'h' {
                    r.u8()? as u32
                } else {
                    u32::from_le_bytes(r.le()?)
                };
                let e = r.b.memo().get(key);
                match e & TAG {
                    T_DICT_ID => r.push(Value::DictId(e & PAYLOAD), at)?,
                    T_STR => r.push(Value::Str(e & PAYLOAD), at)?,
                    _ => r.get(key, at)?,
                }
            }
            0x94 => {
                let key = r.b.memo().count;
                r.memoize(key, at)?;
            }
            b'(' => r.mark(at)?,
            b'}' => {
                if plain || !B::dict_ahead(&mut r, at)? {
                    r.step(op, at)?;
                }
            }
            b'.' => {
                let top = r.pop(at)?;
                return r.b.stop(top, at);
            }
            _ => r.step(op, at)?,
        }
    }
}

/// The machine: the data, where it is, the stack and the marks; the builder it fills.
pub(crate) struct Reader<'a, B> {
    pub(crate) data: &'a [u8],
    pub(crate) pos: usize,
    pub(crate) stack: Vec<Value>,
    pub(crate) marks: Vec<usize>,
    pub(crate) b: B,
    /// The ids of a run of memo references to interned dicts read ahead of a list's `APPENDS`.
    run: Vec<u32>,
    /// No shortcuts: every opcode through `step`.
    plain: bool,
}

pub(crate) fn malformed(at: usize, what: impl Into<String>) -> PickleError {
    PickleError::Malformed {
        at,
        what: what.into(),
    }
}

impl<'a, B: Build<'a>> Reader<'a, B> {
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let data = self.data;
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= data.len())
            .ok_or(PickleError::Truncated(self.pos, data.len()))?;
        let s = &data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8> {
        let b = *self
            .data
            .get(self.pos)
            .ok_or(PickleError::Truncated(self.pos, self.data.len()))?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn le<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// A length that the rest of the file must hold, so that no huge declared length is trusted.
    fn len64(&mut self) -> Result<usize> {
        let n = u64::from_le_bytes(self.le()?);
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn line(&mut self) -> Result<&'a [u8]> {
        let data = self.data;
        let rest = &data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(PickleError::Truncated(data.len(), data.len()))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    #[inline]
    pub(crate) fn push(&mut self, v: Value, at: usize) -> Result<()> {
        if self.stack.len() >= MAX_STACK {
            return Err(malformed(at, format!("more than {MAX_STACK} values on the stack at once: no snapshot writer does that (a corrupt or hostile file?)")));
        }
        self.stack.push(v);
        Ok(())
    }

    /// Pushes a container being filled, remembering where it is.
    fn push_open(&mut self, v: Value, at: usize) -> Result<()> {
        if let Value::Dict(slot) | Value::List(slot) = v {
            *self.b.place_of(slot) = self.stack.len();
        }
        self.push(v, at)
    }

    #[inline]
    fn pop(&mut self, at: usize) -> Result<Value> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(malformed(at, "pop below a mark"));
        }
        self.stack
            .pop()
            .ok_or_else(|| malformed(at, "pop from an empty stack"))
    }

    /// `MARK`. When it opens a batch of a list and the batch is memo references to interned
    /// dicts up to `APPENDS` (for a snapshot, a stack's frames, as recent PyTorch writes every
    /// block's and event's), they go straight into the list: a third of such a file's opcodes,
    /// read in one tight loop.
    /// Anything else in the batch ends the run, and what was read is put on the stack as the
    /// plain reading would have.
    fn mark(&mut self, at: usize) -> Result<()> {
        if let (Some(&Value::List(slot)), false) = (self.stack.last(), self.plain) {
            if self.b.takes_dict_ids(slot) {
                let data = self.data;
                let mut pos = self.pos;
                self.run.clear();
                loop {
                    let key = match data.get(pos) {
                        Some(b'h') if pos + 1 < data.len() => {
                            pos += 2;
                            data[pos - 1] as u32
                        }
                        Some(b'j') if pos + 4 < data.len() => {
                            pos += 5;
                            u32::from_le_bytes(data[pos - 4..pos].try_into().expect("4 bytes"))
                        }
                        Some(0x95) if pos + 8 < data.len() => {
                            pos += 9;
                            continue;
                        }
                        Some(b'e') => {
                            self.pos = pos + 1;
                            self.b.append_dict_ids(slot, &self.run);
                            return Ok(());
                        }
                        _ => break,
                    };
                    let e = self.b.memo().get(key);
                    if e & TAG != T_DICT_ID {
                        break;
                    }
                    self.run.push(e & PAYLOAD);
                    self.pos = pos;
                }
                // Not a run of interned dicts to the end of the batch: read on as usual from the first
                // opcode that was not one.
                self.push_mark(at)?;
                for i in 0..self.run.len() {
                    self.push(Value::DictId(self.run[i]), at)?;
                }
                return Ok(());
            }
        }
        self.push_mark(at)
    }

    pub(crate) fn push_mark(&mut self, at: usize) -> Result<()> {
        if self.marks.len() >= MAX_STACK {
            return Err(malformed(at, "more marks than any snapshot writer sets"));
        }
        self.marks.push(self.stack.len());
        Ok(())
    }

    /// The last mark's position: the items above it are the batch of the opcode that pops
    /// it, which reads them in place and then truncates the stack to it.
    fn pop_mark(&mut self, at: usize) -> Result<usize> {
        self.marks
            .pop()
            .ok_or_else(|| malformed(at, "no mark to pop to"))
    }

    /// Pops to the last mark, dropping the items.
    fn drop_to_mark(&mut self, at: usize) -> Result<(), B::Error> {
        let mark = self.pop_mark(at)?;
        for i in mark..self.stack.len() {
            self.b.discard(self.stack[i], at)?;
        }
        self.stack.truncate(mark);
        Ok(())
    }

    fn top(&self, at: usize) -> Result<Value> {
        match self.stack.last() {
            Some(&v) if self.marks.last().is_none_or(|&m| m < self.stack.len()) => Ok(v),
            _ => Err(malformed(at, "an empty stack")),
        }
    }

    /// A container referred to again while it is being filled (a cycle, or `DUP`): it is
    /// finished as it stands, here and wherever the stack holds it.
    fn freeze(&mut self, v: Value, at: usize) -> Result<Value, B::Error> {
        // An open container is on the stack once, where it was pushed; an item or a value
        // pushed by DUP is the top.
        let place = match v {
            Value::Dict(slot) | Value::List(slot) => *self.b.place_of(slot),
            _ => self.stack.len().saturating_sub(1),
        };
        let frozen = self.b.freeze(v, at)?;
        if let Some(s) = self.stack.get_mut(place).filter(|s| **s == v) {
            *s = frozen;
        }
        Ok(frozen)
    }

    #[inline]
    fn memoize(&mut self, key: u32, at: usize) -> Result<()> {
        let v = self.top(at)?;
        let entry = self.b.memo_mut().entry(v).map_err(|e| malformed(at, e))?;
        if let Value::Dict(slot) | Value::List(slot) = v {
            self.b.remember(slot, key);
        }
        self.b.memo_mut().set(key, entry);
        Ok(())
    }

    fn get(&mut self, key: u32, at: usize) -> Result<(), B::Error> {
        let e = self.b.memo().get(key);
        let v = match e & TAG {
            T_STR => Value::Str(e & PAYLOAD),
            T_DICT_ID => Value::DictId(e & PAYLOAD),
            T_LIST_ID => Value::ListId(e & PAYLOAD),
            T_EMPTY => Value::EmptyList,
            T_OPAQUE => Value::Opaque(Kind::from_u32(e & PAYLOAD)),
            T_SCALAR => self.b.memo().scalars[(e & PAYLOAD) as usize],
            T_OPEN => {
                let slot = e & PAYLOAD;
                let open = match self.b.is_dict(slot) {
                    Some(true) => Value::Dict(slot),
                    Some(false) => Value::List(slot),
                    None => {
                        return Err(malformed(
                            at,
                            format!("memo key {key} refers to a container still being read"),
                        )
                        .into())
                    }
                };
                self.freeze(open, at)?
            }
            _ => return Err(malformed(at, format!("memo key {key} was never stored")).into()),
        };
        Ok(self.push(v, at)?)
    }

    /// The opcode after this one is a memo store (writers that memoize a container after
    /// filling it): a finished record must then stay on the stack to be memoized.
    fn next_is_put(&self) -> bool {
        let mut at = self.pos;
        if self.data.get(at) == Some(&0x95) {
            at += 9;
        }
        matches!(self.data.get(at), Some(0x94 | b'q' | b'r' | b'p'))
    }

    /// The list whose batch a value at stack position `pos` would be the first item of, if the
    /// next opcode does not memoize that value.
    #[inline]
    pub(crate) fn list_below(&self, pos: usize) -> Option<u32> {
        match (pos.checked_sub(1).map(|p| self.stack[p]), self.marks.last()) {
            (Some(Value::List(slot)), Some(&m)) if m == pos && !self.next_is_put() => Some(slot),
            _ => None,
        }
    }

    fn int_line(&mut self, at: usize) -> Result<Value> {
        let line = self.line()?;
        let text = std::str::from_utf8(line)
            .unwrap_or("")
            .trim()
            .trim_end_matches('L');
        Ok(match text {
            "00" => Value::Bool(false),
            "01" => Value::Bool(true),
            t => match (t.parse::<i64>(), t.parse::<u64>()) {
                (Ok(i), _) => Value::Int(i),
                (_, Ok(u)) => Value::UInt(u),
                _ if !t.is_empty()
                    && t.trim_start_matches('-')
                        .bytes()
                        .all(|b| b.is_ascii_digit()) =>
                {
                    Value::Huge
                }
                _ => return Err(malformed(at, format!("an integer written `{t}`"))),
            },
        })
    }

    fn key_line(&mut self, at: usize) -> Result<u32> {
        let line = self.line()?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| malformed(at, "a memo key that is not a number"))
    }

    fn step(&mut self, op: u8, at: usize) -> Result<(), B::Error> {
        match op {
            // Framing and protocol: nothing to do.
            0x80 => {
                let proto = self.u8()?;
                if proto > 5 {
                    return Err(malformed(at, format!("pickle protocol {proto} is newer than this reader (0 to 5): re-save with protocol 5 or lower")).into());
                }
            }
            0x95 => {
                self.le::<8>()?;
            }

            // Containers.
            b'}' => {
                let slot = self.b.new_slot(true, at)?;
                self.push_open(Value::Dict(slot), at)?;
            }
            b']' => {
                let slot = self.b.new_slot(false, at)?;
                self.push_open(Value::List(slot), at)?;
            }
            b')' => self.push(Value::Opaque(Kind::Tuple), at)?,
            0x8f => self.push(Value::Opaque(Kind::Set), at)?,
            b'd' => {
                let mark = self.pop_mark(at)?;
                let slot = self.b.new_slot(true, at)?;
                let done = self.b.set_items(Value::Dict(slot), &self.stack[mark..], at);
                self.stack.truncate(mark);
                self.push_open(Value::Dict(slot), at)?;
                if let Some(owned) = done? {
                    B::place(self, mark, owned)?;
                }
            }
            b'u' => {
                let mark = self.pop_mark(at)?;
                let target = mark
                    .checked_sub(1)
                    .map(|p| self.stack[p])
                    .ok_or_else(|| malformed(at, "SETITEMS with no dict under its mark"))?;
                let done = self.b.set_items(target, &self.stack[mark..], at);
                self.stack.truncate(mark);
                if let Some(owned) = done? {
                    B::place(self, mark - 1, owned)?;
                }
            }
            b's' => {
                let v = self.pop(at)?;
                let k = self.pop(at)?;
                let target = self.top(at)?;
                self.b.set_item(target, k, v, at)?;
            }
            b'l' => {
                let mark = self.pop_mark(at)?;
                let slot = self.b.new_slot(false, at)?;
                let done = self.b.append(Value::List(slot), &self.stack[mark..], at);
                self.stack.truncate(mark);
                self.push_open(Value::List(slot), at)?;
                done?;
            }
            b'e' | 0x90 => {
                let mark = self.pop_mark(at)?;
                let target = mark
                    .checked_sub(1)
                    .map(|p| self.stack[p])
                    .ok_or_else(|| malformed(at, "APPENDS with no list under its mark"))?;
                let done = self.b.append(target, &self.stack[mark..], at);
                self.stack.truncate(mark);
                done?;
            }
            b'a' => {
                let v = self.pop(at)?;
                let target = self.top(at)?;
                self.b.append(target, &[v], at)?;
            }
            b't' => {
                self.drop_to_mark(at)?;
                self.push(Value::Opaque(Kind::Tuple), at)?;
            }
            0x85..=0x87 => {
                for _ in 0..(op - 0x84) {
                    let v = self.pop(at)?;
                    self.b.discard(v, at)?;
                }
                self.push(Value::Opaque(Kind::Tuple), at)?;
            }
            0x91 => {
                self.drop_to_mark(at)?;
                self.push(Value::Opaque(Kind::Set), at)?;
            }

            // Numbers and constants.
            b'N' => self.push(Value::None, at)?,
            0x88 => self.push(Value::Bool(true), at)?,
            0x89 => self.push(Value::Bool(false), at)?,
            b'J' => {
                let v = i32::from_le_bytes(self.le()?);
                self.push(Value::Int(v as i64), at)?;
            }
            b'K' => {
                let v = self.u8()?;
                self.push(Value::Int(v as i64), at)?;
            }
            b'M' => {
                let v = u16::from_le_bytes(self.le()?);
                self.push(Value::Int(v as i64), at)?;
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    self.u8()? as usize
                } else {
                    u32::from_le_bytes(self.le()?) as usize
                };
                let bytes = self.take(n)?;
                self.push(long(bytes), at)?;
            }
            b'I' | b'L' => {
                let v = self.int_line(at)?;
                self.push(v, at)?;
            }
            b'G' => {
                let v = f64::from_be_bytes(self.le()?);
                self.push(Value::Float(v), at)?;
            }
            b'F' => {
                let line = self.line()?;
                let text = std::str::from_utf8(line).unwrap_or("").trim();
                let v = text
                    .parse()
                    .map_err(|_| malformed(at, format!("a float written `{text}`")))?;
                self.push(Value::Float(v), at)?;
            }

            // Strings: read in place and interned.
            0x8c | b'X' | 0x8d | b'U' | b'T' => {
                let n = match op {
                    0x8c | b'U' => self.u8()? as usize,
                    b'X' => u32::from_le_bytes(self.le()?) as usize,
                    b'T' => usize::try_from(i32::from_le_bytes(self.le()?))
                        .map_err(|_| malformed(at, "a string of negative length"))?,
                    _ => self.len64()?,
                };
                let bytes = self.take(n)?;
                let id = self.b.intern(bytes, at)?;
                self.push(Value::Str(id), at)?;
            }
            b'V' => {
                let line = self.line()?;
                let id = match raw_unicode_escape(line) {
                    None => self.b.intern(line, at)?,
                    Some(text) => self.b.intern_owned(text?.into_bytes(), at)?,
                };
                self.push(Value::Str(id), at)?;
            }
            b'S' => {
                let line = self.line()?;
                let text = line
                    .strip_prefix(b"'")
                    .and_then(|l| l.strip_suffix(b"'"))
                    .or_else(|| line.strip_prefix(b"\"").and_then(|l| l.strip_suffix(b"\"")))
                    .unwrap_or(line);
                let id = self.b.intern(text, at)?;
                self.push(Value::Str(id), at)?;
            }
            b'C' | b'B' | 0x8e | 0x96 => {
                let n = match op {
                    b'C' => self.u8()? as usize,
                    b'B' => u32::from_le_bytes(self.le()?) as usize,
                    _ => self.len64()?,
                };
                self.take(n)?;
                self.push(Value::Opaque(Kind::Bytes), at)?;
            }
            // Out-of-band buffers (protocol 5): the data is not in the file.
            0x97 => self.push(Value::Opaque(Kind::Bytes), at)?,
            0x98 => {
                self.top(at)?;
            }

            // The memo.
            0x94 => {
                let key = self.b.memo().count;
                self.memoize(key, at)?;
            }
            b'q' => {
                let key = self.u8()? as u32;
                self.memoize(key, at)?;
            }
            b'r' => {
                let key = u32::from_le_bytes(self.le()?);
                self.memoize(key, at)?;
            }
            b'p' => {
                let key = self.key_line(at)?;
                self.memoize(key, at)?;
            }
            b'h' => {
                let key = self.u8()? as u32;
                self.get(key, at)?;
            }
            b'j' => {
                let key = u32::from_le_bytes(self.le()?);
                self.get(key, at)?;
            }
            b'g' => {
                let key = self.key_line(at)?;
                self.get(key, at)?;
            }

            // Objects: classes, calls and their state are not a snapshot's; they stand as
            // opaque values so that a pickle of something else is reported as such.
            b'c' => {
                self.line()?;
                self.line()?;
                self.push(Value::Opaque(Kind::Object), at)?;
            }
            0x93 => {
                for _ in 0..2 {
                    let v = self.pop(at)?;
                    self.b.discard(v, at)?;
                }
                self.push(Value::Opaque(Kind::Object), at)?;
            }
            b'R' | 0x81 | 0x92 => {
                for _ in 0..(if op == 0x92 { 3 } else { 2 }) {
                    let v = self.pop(at)?;
                    self.b.discard(v, at)?;
                }
                self.push(Value::Opaque(Kind::Object), at)?;
            }
            b'i' => {
                self.line()?;
                self.line()?;
                self.drop_to_mark(at)?;
                self.push(Value::Opaque(Kind::Object), at)?;
            }
            b'o' => {
                self.drop_to_mark(at)?;
                self.push(Value::Opaque(Kind::Object), at)?;
            }
            b'b' => {
                let state = self.pop(at)?;
                self.b.discard(state, at)?;
                self.top(at)?;
            }
            b'P' => {
                self.line()?;
                self.push(Value::Opaque(Kind::Object), at)?;
            }
            b'Q' => {
                let id = self.pop(at)?;
                self.b.discard(id, at)?;
                self.push(Value::Opaque(Kind::Object), at)?;
            }
            0x82..=0x84 => {
                self.take(1 << (op - 0x82))?;
                self.push(Value::Opaque(Kind::Object), at)?;
            }

            // The stack itself.
            b'0' => {
                let v = self.pop(at)?;
                self.b.discard(v, at)?;
            }
            b'1' => self.drop_to_mark(at)?,
            b'2' => {
                let v = match self.top(at)? {
                    open @ (Value::Dict(_) | Value::List(_) | Value::Item(_)) => {
                        self.freeze(open, at)?
                    }
                    v => v,
                };
                self.push(v, at)?;
            }
            _ => return Err(PickleError::Opcode { op, at }.into()),
        }
        Ok(())
    }
}

/// A little-endian two's-complement integer of `bytes.len()` bytes. Writers may pad with sign
/// bytes (serde-pickle writes a u64 in 9 bytes): those still fit.
#[inline(always)]
pub(crate) fn long(bytes: &[u8]) -> Value {
    if bytes.len() <= 8 {
        let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
        let mut buf = if negative { [0xff; 8] } else { [0; 8] };
        buf[..bytes.len()].copy_from_slice(bytes);
        return Value::Int(i64::from_le_bytes(buf));
    }
    long_wide(bytes)
}

/// [`long`] of the `n` bytes at `p` in `data`: read as one word, sign-extended, when eight
/// bytes are there (a copy of a few bytes is a call to memcpy, on the path of every address).
#[inline(always)]
pub(crate) fn long_at(data: &[u8], p: usize, n: usize) -> Option<Value> {
    let bytes = data.get(p..p.checked_add(n)?)?;
    match data.get(p..p + 8) {
        Some(w) if (1..=8).contains(&n) => {
            let word = u64::from_le_bytes(w.try_into().ok()?);
            let unused = 64 - 8 * n as u32;
            Some(Value::Int(((word << unused) as i64) >> unused))
        }
        _ => Some(long(bytes)),
    }
}

/// [`long`] for more than eight bytes.
fn long_wide(bytes: &[u8]) -> Value {
    let mut bytes = bytes;
    while bytes.len() > 8 {
        let (last, rest) = bytes.split_last().expect("longer than 8");
        let sign_of_rest = if rest.last().is_some_and(|b| b & 0x80 != 0) {
            0xff
        } else {
            0x00
        };
        if *last != sign_of_rest {
            break;
        }
        bytes = rest;
    }
    match bytes.len() {
        0..=8 => {
            let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
            let mut buf = if negative { [0xff; 8] } else { [0; 8] };
            buf[..bytes.len()].copy_from_slice(bytes);
            Value::Int(i64::from_le_bytes(buf))
        }
        // 2^63 to 2^64 - 1: eight bytes of magnitude and a zero sign byte.
        9 if bytes[8] == 0 => {
            Value::UInt(u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")))
        }
        _ => Value::Huge,
    }
}

/// Protocol 0's UNICODE argument (Python's `raw-unicode-escape`): bytes below 256 stand for
/// themselves, `\uXXXX` and `\UXXXXXXXX` for the rest. `None` when there is nothing to decode
/// (plain ASCII, the usual case), so that the text is read in place.
fn raw_unicode_escape(line: &[u8]) -> Option<Result<String>> {
    if line.iter().all(|&b| b < 0x80 && b != b'\\') {
        return None;
    }
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        let digits = match (b, line.get(i + 1)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => 0,
        };
        if digits > 0 {
            let hex = line
                .get(i + 2..i + 2 + digits)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok());
            match hex.and_then(char::from_u32) {
                Some(c) => out.push(c),
                None => {
                    return Some(Err(malformed(
                        0,
                        "a protocol 0 string with a bad \\u escape",
                    )))
                }
            }
            i += 2 + digits;
        } else {
            out.push(b as char);
            i += 1;
        }
    }
    Some(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_longs_decode_with_their_sign() {
        assert_eq!(long(&[0xff]), Value::Int(-1));
        assert_eq!(long(&[0x00, 0x01]), Value::Int(256));
        assert_eq!(long(&[]), Value::Int(0));
        assert_eq!(
            long(&[0; 9]),
            Value::Int(0),
            "sign padding is not a wide int"
        );
        assert_eq!(
            long(&[64, 55, 82, 40, 85, 86, 0, 0, 0]),
            Value::Int(94_923_748_685_632),
            "serde-pickle's u64"
        );
        assert_eq!(
            long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
            Value::UInt(1 << 63),
            "2^63 is a u64"
        );
        assert_eq!(
            long(&[0xff; 8].iter().copied().chain([0]).collect::<Vec<_>>()),
            Value::UInt(u64::MAX)
        );
        assert_eq!(long(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 1]), Value::Huge);
        assert_eq!(
            long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0xff]),
            Value::Int(i64::MIN)
        );
        assert_eq!(
            long(&[0, 0, 0, 0, 0, 0, 0, 0x7f, 0xff]),
            Value::Huge,
            "below -2^63"
        );
        // The word read agrees with the bytes read, whatever follows them.
        for bytes in [
            &[][..],
            &[0xff],
            &[0x7f],
            &[0x00, 0x80],
            &[1, 2, 3, 4, 5, 6, 7],
            &[0xff; 8],
            &[0, 0, 0, 0, 0, 0, 0, 0x80, 0],
        ] {
            let mut data = bytes.to_vec();
            data.extend_from_slice(&[0xaa; 9]);
            assert_eq!(
                long_at(&data, 0, bytes.len()),
                Some(long(bytes)),
                "{bytes:?} then more"
            );
            assert_eq!(
                long_at(bytes, 0, bytes.len()),
                Some(long(bytes)),
                "{bytes:?} at the end"
            );
        }
        assert_eq!(long_at(&[1, 2], 0, 3), None, "past the end");
    }

    #[test]
    fn protocol_zero_strings_decode_their_escapes() {
        assert!(raw_unicode_escape(b"plain").is_none());
        assert_eq!(
            raw_unicode_escape(b"caf\xe9 \\u2603 \\U0001f600 \\u005c")
                .unwrap()
                .unwrap(),
            "café ☃ 😀 \\"
        );
        assert!(raw_unicode_escape(b"\\uzz").unwrap().is_err());
    }

    #[test]
    fn the_memo_stays_dense_in_order_and_sparse_far_beyond() {
        let mut m = Memo::default();
        for k in 0..10 {
            m.set(k, T_STR | k);
        }
        m.set(20, T_STR | 20);
        assert_eq!(m.dense.len(), 21, "a small gap is filled in place");
        m.set(4_000_000_000, T_STR | 1);
        assert_eq!(
            m.dense.len(),
            21,
            "a key of four billion does not allocate four billion slots"
        );
        assert_eq!(
            (m.get(4_000_000_000), m.get(3), m.get(15), m.count),
            (T_STR | 1, T_STR | 3, 0, 12)
        );
    }
}
