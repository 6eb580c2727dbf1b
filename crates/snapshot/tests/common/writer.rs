//! A streaming pickle writer that emits what real writers emit for a memory snapshot
//! (CPython's pickle at protocols 2, 4 and 5, serde-pickle's protocol 3), and the snapshot
//! shapes the bench measures and the fuzzing mutates. Shared by benches/explain.rs (which
//! includes this file) and the tests.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;

/// Which writer's bytes to emit.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Writer {
    /// CPython's pickle at this protocol (2, 4 or 5).
    Python(u8),
    /// serde-pickle 1.x, protocol 3.
    Serde,
}

/// A pickle written straight to `out`, with the writer's memo and framing.
pub struct Pickle<W: Write> {
    out: W,
    writer: Writer,
    /// Protocol 4+ frames: the opcodes of the frame being built.
    frame: Vec<u8>,
    written: u64,
    next_memo: u32,
    /// Shared objects already written (strings, frames), by a name: their memo keys.
    shared: HashMap<String, u32>,
}

impl<W: Write> Pickle<W> {
    pub fn new(mut out: W, writer: Writer) -> Pickle<W> {
        let proto = match writer {
            Writer::Python(p) => p,
            Writer::Serde => 3,
        };
        // CPython writes PROTO before framing starts.
        out.write_all(&[0x80, proto]).expect("write");
        Pickle {
            out,
            writer,
            frame: Vec::with_capacity(80 << 10),
            written: 2,
            next_memo: 0,
            shared: HashMap::new(),
        }
    }

    fn framed(&self) -> bool {
        matches!(self.writer, Writer::Python(4..))
    }

    fn raw(&mut self, bytes: &[u8]) {
        if self.framed() {
            self.frame.extend_from_slice(bytes);
        } else {
            self.out.write_all(bytes).expect("write");
            self.written += bytes.len() as u64;
        }
    }

    /// Ends the frame once it passes 64 kB, as CPython does between objects.
    fn commit(&mut self) {
        if self.framed() && self.frame.len() >= 64 << 10 {
            self.flush_frame();
        }
    }

    fn flush_frame(&mut self) {
        if self.frame.is_empty() {
            return;
        }
        let mut head = vec![0x95];
        head.extend_from_slice(&(self.frame.len() as u64).to_le_bytes());
        self.out
            .write_all(&head)
            .and_then(|()| self.out.write_all(&self.frame))
            .expect("write");
        self.written += (head.len() + self.frame.len()) as u64;
        self.frame.clear();
    }

    fn len(&self) -> u64 {
        self.written + self.frame.len() as u64
    }

    pub fn finish(mut self) -> (W, u64) {
        self.raw(b".");
        self.flush_frame();
        self.out.flush().expect("flush");
        (self.out, self.written)
    }

    /// Memoizes the object just written (Python memoizes every str, dict, list and tuple).
    fn put(&mut self) -> u32 {
        let key = self.next_memo;
        match self.writer {
            Writer::Serde => return u32::MAX,
            Writer::Python(4..) => self.raw(&[0x94]),
            Writer::Python(_) if key < 256 => self.raw(&[b'q', key as u8]),
            Writer::Python(_) => {
                self.raw(b"r");
                self.raw(&key.to_le_bytes());
            }
        }
        self.next_memo += 1;
        key
    }

    fn get(&mut self, key: u32) {
        if key < 256 {
            self.raw(&[b'h', key as u8]);
        } else {
            self.raw(b"j");
            self.raw(&key.to_le_bytes());
        }
    }

    /// A string: `shared` ones are one Python object, written once and then fetched from the
    /// memo; others are new objects, written (and memoized) each time.
    fn str(&mut self, s: &str, shared: bool) {
        if shared && self.writer != Writer::Serde {
            if let Some(&key) = self.shared.get(s) {
                return self.get(key);
            }
        }
        match self.writer {
            Writer::Python(4..) if s.len() < 256 => self.raw(&[0x8c, s.len() as u8]),
            _ => {
                self.raw(b"X");
                self.raw(&(s.len() as u32).to_le_bytes());
            }
        }
        self.raw(s.as_bytes());
        let key = self.put();
        if shared && self.writer != Writer::Serde {
            self.shared.insert(s.to_string(), key);
        }
    }

    fn int(&mut self, v: u64) {
        match self.writer {
            Writer::Serde if v < 1 << 31 => {
                self.raw(b"J");
                self.raw(&(v as u32).to_le_bytes());
            }
            Writer::Serde => {
                self.raw(&[0x8a, 9]);
                self.raw(&v.to_le_bytes());
                self.raw(&[0]);
            }
            Writer::Python(_) if v <= 0xff => self.raw(&[b'K', v as u8]),
            Writer::Python(_) if v <= 0xffff => {
                self.raw(b"M");
                self.raw(&(v as u16).to_le_bytes());
            }
            Writer::Python(_) if v < 1 << 31 => {
                self.raw(b"J");
                self.raw(&(v as u32).to_le_bytes());
            }
            // CPython's encode_long: the bit length's bytes plus one (a sign byte when needed).
            Writer::Python(_) => {
                let n = ((64 - v.leading_zeros()) / 8 + 1) as usize;
                let bytes = (v as u128).to_le_bytes();
                self.raw(&[0x8a, n as u8]);
                self.raw(&bytes[..n]);
            }
        }
    }

    fn key(&mut self, k: &str) {
        self.str(k, true);
    }

    fn dict(&mut self, body: impl FnOnce(&mut Pickle<W>)) {
        self.raw(b"}");
        self.put();
        self.raw(b"(");
        body(self);
        self.raw(b"u");
    }

    /// A new list of `n` items, in CPython's batches of a thousand (a batch of one is APPEND).
    fn list(&mut self, n: usize, mut item: impl FnMut(&mut Pickle<W>, usize)) {
        self.raw(b"]");
        self.put();
        for start in (0..n).step_by(1000) {
            let batch = (n - start).min(1000);
            let single = batch == 1 && self.writer != Writer::Serde;
            if !single {
                self.raw(b"(");
            }
            for i in start..start + batch {
                item(self, i);
            }
            self.raw(if single { b"a" } else { b"e" });
        }
    }

    fn tuple_zero_zero(&mut self) {
        self.int(0);
        self.int(0);
        self.raw(&[0x86]);
        self.put();
    }

    fn bool(&mut self, b: bool) {
        self.raw(&[if b { 0x88 } else { 0x89 }]);
    }
}

/// A deterministic hash for the generators' choices.
pub fn h(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The distinct frames and stacks a service's snapshot draws from.
struct Bank {
    frames: Vec<(String, u64, String)>,
    stacks: Vec<Vec<usize>>,
}

fn bank(max_depth: usize, count: u64) -> Bank {
    let torch = [
        "nn/modules/module.py",
        "nn/modules/linear.py",
        "nn/modules/conv.py",
        "nn/functional.py",
        "_tensor.py",
        "utils/_contextlib.py",
    ];
    let framework = [
        "starlette/routing.py",
        "fastapi/routing.py",
        "uvicorn/protocols/http/httptools_impl.py",
        "anyio/_backends/_asyncio.py",
        "asyncio/events.py",
    ];
    let mut frames = Vec::new();
    let mut ids = HashMap::new();
    let mut frame = |file: String, line: u64, name: String| -> usize {
        let n = ids.len();
        *ids.entry((file.clone(), line, name.clone()))
            .or_insert_with(|| {
                frames.push((file, line, name));
                n
            })
    };
    let mut stacks = Vec::new();
    for s in 0..count {
        let depth = 8 + (h(s) % 17) as usize;
        let mut stack = Vec::with_capacity(depth);
        for t in 0..2 + h(s + 1) % 3 {
            let f = torch[(h(s * 7 + t) % 6) as usize];
            stack.push(frame(
                format!("/srv/app/.venv/lib/python3.11/site-packages/torch/{f}"),
                100 + h(s + t) % 1700,
                [
                    "forward",
                    "_call_impl",
                    "_wrapped_call_impl",
                    "linear",
                    "decorate_context",
                ][(h(t + s) % 5) as usize]
                    .into(),
            ));
        }
        for u in 0..2 + h(s + 2) % 5 {
            let k = h(s * 13 + u) % 60;
            stack.push(frame(
                format!("/srv/app/service/handlers_{}.py", k % 12),
                10 + h(k + u) % 400,
                format!("handle_step_{k}"),
            ));
        }
        while stack.len() < depth {
            let f = framework[(h(s + stack.len() as u64) % 5) as usize];
            stack.push(frame(
                format!("/srv/app/.venv/lib/python3.11/site-packages/{f}"),
                50 + h(s ^ stack.len() as u64) % 700,
                "run".into(),
            ));
        }
        // Small shapes (for tests) draw stacks of one to `max_depth` frames, so that lists of
        // one frame (written with APPEND, without a mark) occur.
        stack.truncate(if max_depth < 8 {
            1 + h(s ^ 77) as usize % max_depth
        } else {
            max_depth
        });
        stacks.push(stack);
    }
    Bank { frames, stacks }
}

#[derive(Clone, Copy)]
pub struct Shape {
    pub name: &'static str,
    pub writer: Writer,
    /// Frame dicts are shared objects (written once, then memo references).
    pub shared_frames: bool,
    /// The share of the file that is segments; the rest is traces.
    pub segment_share: f64,
    /// At most this many segments (0: no limit).
    pub max_segments: usize,
    pub blocks_per_segment: (u64, u64),
    pub devices: u64,
    /// Stacks (8 to 24 frames deep) are cut to this many frames; below 8, to one to this many.
    pub max_depth: usize,
    /// How many distinct stacks blocks and events draw from.
    pub stacks: u64,
}

impl Shape {
    /// The same writer and sharing at a size for tests: a few KB.
    pub fn small(&self) -> Shape {
        Shape {
            max_segments: 3,
            blocks_per_segment: (1, 3),
            max_depth: 2,
            stacks: 5,
            ..*self
        }
    }
}

pub const SHAPES: [Shape; 5] = [
    Shape {
        name: "memo",
        writer: Writer::Python(4),
        shared_frames: true,
        segment_share: 0.33,
        max_segments: 0,
        blocks_per_segment: (8, 64),
        devices: 1,
        max_depth: 24,
        stacks: 600,
    },
    Shape {
        name: "fresh",
        writer: Writer::Python(2),
        shared_frames: false,
        segment_share: 0.33,
        max_segments: 0,
        blocks_per_segment: (8, 64),
        devices: 1,
        max_depth: 24,
        stacks: 600,
    },
    Shape {
        name: "long-trace",
        writer: Writer::Python(5),
        shared_frames: true,
        segment_share: 0.0,
        max_segments: 8,
        blocks_per_segment: (32, 64),
        devices: 1,
        max_depth: 24,
        stacks: 600,
    },
    Shape {
        name: "many-segments",
        writer: Writer::Python(4),
        shared_frames: true,
        segment_share: 0.995,
        max_segments: 0,
        blocks_per_segment: (2, 4),
        devices: 1,
        max_depth: 24,
        stacks: 600,
    },
    Shape {
        name: "devices",
        writer: Writer::Serde,
        shared_frames: false,
        segment_share: 0.33,
        max_segments: 0,
        blocks_per_segment: (8, 64),
        devices: 4,
        max_depth: 24,
        stacks: 600,
    },
];

fn frames<W: Write>(p: &mut Pickle<W>, bank: &Bank, shape: &Shape, stack: Option<usize>) {
    let Some(s) = stack else {
        // Blocks that no tensor holds have an empty stack.
        p.raw(b"]");
        p.put();
        return;
    };
    let ids = &bank.stacks[s];
    p.list(ids.len(), |p, i| {
        let f = ids[i];
        let shared = format!("frame {f}");
        if shape.shared_frames {
            if let Some(&key) = p.shared.get(&shared) {
                return p.get(key);
            }
        }
        let (file, line, name) = &bank.frames[f];
        p.raw(b"}");
        let key = p.put();
        p.raw(b"(");
        p.key("filename");
        p.str(file, shape.shared_frames);
        p.key("line");
        p.int(*line);
        p.key("name");
        p.str(name, shape.shared_frames);
        p.raw(b"u");
        if shape.shared_frames && p.writer != Writer::Serde {
            p.shared.insert(shared, key);
        }
    });
}

/// Writes a snapshot of about `target` bytes in `shape` to `out`, appending lists in batches
/// of `batch` (CPython's and serde-pickle's are a thousand); returns `out` and the size.
pub fn generate<W: Write>(out: W, shape: &Shape, target: u64, batch: usize) -> (W, u64) {
    let bank = bank(shape.max_depth, shape.stacks);
    let mut p = Pickle::new(out, shape.writer);
    let big = |v: u64| {
        if shape.writer == Writer::Serde {
            v | 1 << 63
        } else {
            v
        }
    };
    p.dict(|p| {
        p.key("segments");
        // The segments list is written in batches as it grows, since its length is not known.
        p.raw(b"]");
        p.put();
        let (mut n, mut address) = (0u64, 0x7f00_0000_0000u64);
        let segment_bytes = (target as f64 * shape.segment_share) as u64;
        let more = |n: u64, len: u64| {
            if shape.max_segments > 0 {
                (n as usize) < shape.max_segments
            } else {
                n == 0 || len < segment_bytes
            }
        };
        while more(n, p.len()) {
            p.raw(b"(");
            for _ in 0..batch {
                let (lo, hi) = shape.blocks_per_segment;
                let count = lo + h(n) % (hi - lo + 1);
                let sizes: Vec<u64> = (0..count)
                    .map(|b| (1 + h(n * 64 + b) % 4096) * 512)
                    .collect();
                let total: u64 = sizes.iter().sum();
                p.dict(|p| {
                    p.key("device");
                    p.int(n % shape.devices);
                    p.key("address");
                    p.int(big(address));
                    p.key("total_size");
                    p.int(total);
                    p.key("allocated_size");
                    p.int(total / 2);
                    p.key("active_size");
                    p.int(total / 2);
                    p.key("requested_size");
                    p.int(total / 2);
                    p.key("stream");
                    p.int(0);
                    p.key("segment_type");
                    p.str(if total > 1 << 20 { "large" } else { "small" }, true);
                    p.key("segment_pool_id");
                    p.tuple_zero_zero();
                    p.key("is_expandable");
                    p.bool(false);
                    p.key("frames");
                    frames(p, &bank, shape, None);
                    p.key("blocks");
                    let mut offset = 0;
                    p.list(count as usize, |p, b| {
                        let r = h(n * 131 + b as u64);
                        let state = [
                            "active_allocated",
                            "active_allocated",
                            "active_allocated",
                            "inactive",
                            "active_pending_free",
                        ][(r % 5) as usize];
                        p.dict(|p| {
                            p.key("address");
                            p.int(big(address + offset));
                            p.key("size");
                            p.int(sizes[b]);
                            p.key("requested_size");
                            p.int(sizes[b] - r % 512);
                            p.key("state");
                            p.str(state, true);
                            p.key("frames");
                            frames(
                                p,
                                &bank,
                                shape,
                                (state != "inactive").then_some((r % shape.stacks) as usize),
                            );
                        });
                        offset += sizes[b];
                    });
                });
                address += total;
                n += 1;
                p.commit();
                if !more(n, p.len()) {
                    break;
                }
            }
            p.raw(b"e");
        }
        p.key("device_traces");
        p.raw(b"]");
        p.put();
        p.raw(b"(");
        let per_device = (target - p.len().min(target)) / shape.devices;
        for d in 0..shape.devices {
            trace(p, &bank, shape, d, p.len() + per_device, batch);
        }
        p.raw(b"e");
        p.key("allocator_settings");
        p.dict(|p| {
            p.key("expandable_segments");
            p.bool(false);
            p.key("max_split_size");
            p.int(0);
        });
    });
    p.finish()
}

/// One device's trace, until the file reaches `until` bytes: requests that allocate
/// activations and free them, a few kept for good (the leak), a segment now and then.
fn trace<W: Write>(
    p: &mut Pickle<W>,
    bank: &Bank,
    shape: &Shape,
    device: u64,
    until: u64,
    batch: usize,
) {
    p.raw(b"]");
    p.put();
    let (mut t, mut event, mut request) = (1_700_000_000_000_000u64, 0u64, 0u64);
    let big = |v: u64| {
        if shape.writer == Writer::Serde {
            v | 1 << 63
        } else {
            v
        }
    };
    loop {
        // A batch of events at a time (the last batch too, for simplicity: the generator stops
        // on a batch boundary).
        p.raw(b"(");
        let mut in_batch = 0;
        while in_batch < batch {
            let kept = h(request ^ 0xdead).is_multiple_of(33);
            let base = 0x7e00_0000_0000 + device * (1 << 36) + (request % 4096) * (1 << 24);
            let mut events: Vec<(&str, u64, u64, usize)> = Vec::new();
            for k in 0..4u64 {
                let stack = (h(request * 4 + k) % shape.stacks) as usize;
                events.push((
                    "alloc",
                    base + k * (1 << 20),
                    (1 + h(request + k) % 2048) * 512,
                    stack,
                ));
            }
            for k in 0..4u64 {
                if kept && k == 0 {
                    continue;
                }
                let (_, addr, size, stack) = events[k as usize];
                events.push(("free_requested", addr, size, stack));
                events.push(("free_completed", addr, size, stack));
            }
            if request % 500 == 499 {
                events.push(("segment_alloc", base, 2 << 20, 0));
                events.push(("segment_free", base, 2 << 20, 0));
            }
            for (action, addr, size, stack) in events {
                if in_batch == batch {
                    break;
                }
                p.dict(|p| {
                    p.key("action");
                    p.str(action, true);
                    p.key("addr");
                    p.int(big(addr));
                    p.key("size");
                    p.int(size);
                    p.key("stream");
                    p.int(0);
                    p.key("time_us");
                    p.int(t);
                    p.key("frames");
                    frames(p, bank, shape, Some(stack));
                    p.key("compile_context");
                    p.str("N/A", true);
                    p.key("user_metadata");
                    p.str("", true);
                });
                t += 1 + h(event) % 7;
                event += 1;
                in_batch += 1;
            }
            request += 1;
            p.commit();
        }
        p.raw(b"e");
        if p.len() >= until {
            break;
        }
    }
}
