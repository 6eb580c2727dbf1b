//! The snapshot as a pickle the way Python's own `pickle` writes one: every string, frame and
//! frame list stored in the memo once and referred to after. A stack is shared by thousands of
//! events and its frames by many stacks; written out each time (serde_pickle keeps no memo) a
//! run-lab variant's snapshot of 20,000 events was 185-210 MB, nearly all of it the same frames.
//!
//! Protocol 2, the opcodes every unpickler reads (pickletools' names): `PROTO`, `EMPTY_DICT`,
//! `EMPTY_LIST`, `MARK`, `SETITEMS`, `APPENDS`, `TUPLE2`, `BININT`, `LONG1`, `BINUNICODE`,
//! `NEWTRUE`/`NEWFALSE`, `BINPUT`/`LONG_BINPUT`, `BINGET`/`LONG_BINGET`, `STOP`.

use crate::snapshot::{Block, Frame, Segment, Snapshot, TraceEntry};
use std::collections::HashMap;

/// The pickle of `snapshot`.
pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    let mut p = Pickler::default();
    p.out.extend_from_slice(&[0x80, 2]);
    p.dict(|p| {
        p.key("segments");
        p.list(&snapshot.segments, Pickler::segment);
        p.key("device_traces");
        p.list(&snapshot.device_traces, |p, trace| {
            p.list(trace, Pickler::entry)
        });
        p.key("allocator_settings");
        p.dict(|p| {
            p.key("allocator");
            p.str(snapshot.allocator_settings.allocator);
        });
    });
    p.out.push(b'.');
    p.out
}

#[derive(Default)]
struct Pickler<'a> {
    out: Vec<u8>,
    /// Memo keys given so far (the next one is this).
    memo: u32,
    strings: HashMap<&'a str, u32>,
    frames: HashMap<&'a Frame, u32>,
    /// Frame lists by address: the snapshot shares one list among the events of a stack.
    stacks: HashMap<*const Vec<Frame>, u32>,
}

impl<'a> Pickler<'a> {
    /// A memo opcode with its key: the one-byte form (`short`) where the key fits a byte, else
    /// the four-byte one (`long`).
    fn memo_op(&mut self, short: u8, long: u8, key: u32) {
        match u8::try_from(key) {
            Ok(k) => self.out.extend_from_slice(&[short, k]),
            Err(_) => {
                self.out.push(long);
                self.out.extend_from_slice(&key.to_le_bytes());
            }
        }
    }

    /// Stores the object just written in the memo (`BINPUT`/`LONG_BINPUT`) under the next key.
    fn put(&mut self) -> u32 {
        let key = self.memo;
        self.memo_op(b'q', b'r', key);
        self.memo += 1;
        key
    }

    /// Writes the object stored under `key` again (`BINGET`/`LONG_BINGET`).
    fn get(&mut self, key: u32) {
        self.memo_op(b'h', b'j', key);
    }

    fn str(&mut self, s: &'a str) {
        if let Some(&key) = self.strings.get(s) {
            return self.get(key);
        }
        self.out.push(b'X');
        self.out.extend_from_slice(
            &u32::try_from(s.len())
                .expect("a short string")
                .to_le_bytes(),
        );
        self.out.extend_from_slice(s.as_bytes());
        let key = self.put();
        self.strings.insert(s, key);
    }

    fn key(&mut self, k: &'a str) {
        self.str(k);
    }

    fn int(&mut self, v: i128) {
        match i32::try_from(v) {
            Ok(v) => {
                self.out.push(b'J');
                self.out.extend_from_slice(&v.to_le_bytes());
            }
            Err(_) => {
                // LONG1: little-endian two's complement; nine bytes hold any u64 or i64.
                self.out.extend_from_slice(&[0x8a, 9]);
                self.out.extend_from_slice(&v.to_le_bytes()[..9]);
            }
        }
    }

    fn bool(&mut self, v: bool) {
        self.out.push(if v { 0x88 } else { 0x89 });
    }

    fn dict(&mut self, items: impl FnOnce(&mut Self)) {
        self.out.push(b'}');
        self.put();
        self.out.push(b'(');
        items(self);
        self.out.push(b'u');
    }

    fn list<T>(&mut self, items: &'a [T], mut item: impl FnMut(&mut Self, &'a T)) {
        self.out.push(b']');
        self.put();
        if !items.is_empty() {
            self.out.push(b'(');
            for i in items {
                item(self, i);
            }
            self.out.push(b'e');
        }
    }

    fn frames(&mut self, frames: &'a Vec<Frame>) {
        if let Some(&key) = self.stacks.get(&(frames as *const _)) {
            return self.get(key);
        }
        let key = self.memo;
        self.list(frames, |p, f| match p.frames.get(f) {
            Some(&key) => p.get(key),
            None => {
                let key = p.memo;
                p.dict(|p| {
                    p.key("name");
                    p.str(&f.name);
                    p.key("filename");
                    p.str(&f.filename);
                    p.key("line");
                    p.int(f.line.into());
                });
                p.frames.insert(f, key);
            }
        });
        self.stacks.insert(frames as *const _, key);
    }

    fn segment(&mut self, s: &'a Segment) {
        self.dict(|p| {
            p.key("device");
            p.int(s.device.into());
            for (k, v) in [
                ("address", s.address),
                ("total_size", s.total_size),
                ("allocated_size", s.allocated_size),
                ("active_size", s.active_size),
                ("requested_size", s.requested_size),
            ] {
                p.key(k);
                p.int(v.into());
            }
            p.key("stream");
            p.int(s.stream.into());
            p.key("segment_type");
            p.str(s.segment_type);
            p.key("segment_pool_id");
            p.int(s.segment_pool_id.0.into());
            p.int(s.segment_pool_id.1.into());
            p.out.push(0x86);
            p.key("is_expandable");
            p.bool(s.is_expandable);
            p.key("frames");
            p.frames(&s.frames);
            p.key("blocks");
            p.list(&s.blocks, Pickler::block);
        });
    }

    fn block(&mut self, b: &'a Block) {
        self.dict(|p| {
            for (k, v) in [
                ("address", b.address),
                ("size", b.size),
                ("requested_size", b.requested_size),
            ] {
                p.key(k);
                p.int(v.into());
            }
            p.key("state");
            p.str(b.state);
            p.key("frames");
            p.frames(&b.frames);
        });
    }

    fn entry(&mut self, e: &'a TraceEntry) {
        self.dict(|p| {
            p.key("action");
            p.str(e.action);
            p.key("addr");
            p.int(e.addr.into());
            p.key("size");
            p.int(e.size.into());
            p.key("stream");
            p.int(e.stream.into());
            p.key("time_us");
            p.int(e.time_us.into());
            p.key("frames");
            p.frames(&e.frames);
        });
    }
}
