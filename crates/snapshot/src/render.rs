//! The answers as text for people (a table), markdown for reports, JSON for programs.

use crate::diff::Difference;
use crate::explain::{Explanation, Holder};
use leaklab_report::human_bytes;

fn holder_rows(holders: &[Holder], top: usize, stacks: bool, out: &mut String) {
    let width = holders
        .iter()
        .take(top)
        .map(|h| human_bytes(h.bytes as f64).len())
        .max()
        .unwrap_or(5)
        .max(5);
    out.push_str(&format!(
        "  {:>width$}  {:>7}  first frame in your code\n",
        "bytes", "blocks"
    ));
    for h in holders.iter().take(top) {
        out.push_str(&format!(
            "  {:>width$}  {:>7}  {}\n",
            human_bytes(h.bytes as f64),
            h.blocks,
            h.site
        ));
        if stacks {
            for f in &h.stack {
                out.push_str(&format!("  {:>width$}  {:>7}    called from {f}\n", "", ""));
            }
        }
    }
    if holders.len() > top {
        let rest: u64 = holders[top..].iter().map(|h| h.bytes).sum();
        out.push_str(&format!(
            "  ... {} more stacks holding {}\n",
            holders.len() - top,
            human_bytes(rest as f64)
        ));
    }
}

pub fn explanation_text(e: &Explanation, top: usize, stacks: bool) -> String {
    let mut out = format!(
        "{} segments: {} reserved, {} allocated, {} pending free, {} reserved but unallocated\n\nLive memory by allocating stack (largest first):\n",
        e.segments,
        human_bytes(e.reserved_bytes as f64),
        human_bytes(e.allocated_bytes as f64),
        human_bytes(e.pending_free_bytes as f64),
        human_bytes(e.unallocated_bytes as f64)
    );
    holder_rows(&e.holders, top, stacks, &mut out);
    if let Some(s) = &e.since {
        out.push_str(&format!(
            "\nAllocated after event {} ({} events) and never freed: {}\n",
            s.from_event,
            s.events,
            human_bytes(s.bytes as f64)
        ));
        holder_rows(&s.holders, top, stacks, &mut out);
    } else if e.trace_events == 0 {
        out.push_str("\n(no allocator trace in this snapshot: record one with torch.cuda.memory._record_memory_history() to see what crossed a point)\n");
    }
    if !e.fragmented_segments.is_empty() && e.unallocated_bytes > 0 {
        out.push_str("\nReserved but unallocated, by segment (empty_cache returns whole free segments; expandable_segments and shape bucketing reduce the rest):\n");
        for s in e.fragmented_segments.iter().take(top) {
            out.push_str(&format!(
                "  segment 0x{:x} ({}): {} of {} unallocated, largest free block {}\n",
                s.address,
                s.segment_type,
                human_bytes(s.unallocated as f64),
                human_bytes(s.reserved as f64),
                human_bytes(s.largest_free_block as f64)
            ));
        }
    }
    out
}

pub fn difference_text(d: &Difference, top: usize, stacks: bool) -> String {
    let per_request = d.bytes_per_request.map_or(String::new(), |b| {
        format!(", {} per request", human_bytes(b))
    });
    let mut out = format!(
        "Live in AFTER and not in BEFORE: {} in {} blocks{per_request} (live {} -> {})\n",
        human_bytes(d.bytes as f64),
        d.blocks,
        human_bytes(d.before_bytes as f64),
        human_bytes(d.after_bytes as f64)
    );
    holder_rows(&d.holders, top, stacks, &mut out);
    out
}

/// Holders as a markdown table.
pub fn holder_table(holders: &[Holder], top: usize) -> String {
    let mut md = String::from(
        "| bytes | blocks | first frame in your code | called from |\n|---|---|---|---|\n",
    );
    for h in holders.iter().take(top) {
        md.push_str(&format!(
            "| {} | {} | `{}` | {} |\n",
            human_bytes(h.bytes as f64),
            h.blocks,
            h.site,
            h.stack.first().map_or("-".into(), |s| format!("`{s}`"))
        ));
    }
    md
}

/// A "who holds it" section for run-lab's and scan's reports.
pub fn explanation_markdown(title: &str, e: &Explanation, top: usize) -> String {
    format!(
        "#### {title}: who holds the memory\n\n{} allocated in {} segments ({} reserved).\n\n{}",
        human_bytes(e.allocated_bytes as f64),
        e.segments,
        human_bytes(e.reserved_bytes as f64),
        holder_table(&e.holders, top)
    )
}

pub fn difference_markdown(title: &str, d: &Difference, top: usize) -> String {
    let per_request = d.bytes_per_request.map_or(String::new(), |b| {
        format!(", {} per request", human_bytes(b))
    });
    format!(
        "#### {title}: what accumulated\n\n{} in {} blocks{per_request}.\n\n{}",
        human_bytes(d.bytes as f64),
        d.blocks,
        holder_table(&d.holders, top)
    )
}
