//! What the tests share: a writer of snapshot pickles in every real writer's shape, a way to
//! compare what two readings of a snapshot say, and a heap-counting allocator.

#[allow(dead_code)]
pub mod counting;
pub mod writer;

use leaklab_snapshot::Snapshot;

/// What a snapshot says, with stacks spelled out: two readings intern strings, frames and
/// stacks in their own order, so ids may differ where the snapshot does not.
#[allow(dead_code)]
pub fn canonical(s: &Snapshot) -> String {
    let stack = |id| {
        s.stack(id)
            .map(|f| format!("{}:{}:{}", f.filename, f.line, f.name))
            .collect::<Vec<_>>()
            .join("|")
    };
    let mut out = String::new();
    for seg in &s.segments {
        out += &format!(
            "segment {} {} {} {} {}\n",
            seg.device,
            seg.address,
            seg.total_size,
            seg.stream,
            s.segment_type(seg)
        );
        for b in s.blocks(seg) {
            out += &format!(
                "  block {} {} {} {:?} {}\n",
                b.address,
                b.size,
                b.requested_size,
                b.state,
                stack(b.stack)
            );
        }
    }
    for t in &s.traces {
        out += &format!("trace {} {:?} from {}\n", t.len(), t.times, t.window_from);
        for v in &t.survivors {
            out += &format!("  kept {} {} {}\n", v.index, v.size, stack(v.stack));
        }
        for e in &t.window {
            out += &format!(
                "  event {:?} {:?} {} {} {} {:?} {:?} {}\n",
                e.action,
                e.other_action,
                e.addr,
                e.size,
                e.stream,
                e.time_us,
                e.device_free,
                stack(e.stack)
            );
        }
    }
    out
}
