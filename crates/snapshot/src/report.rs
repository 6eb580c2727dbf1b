//! `snapshot explain` and `snapshot diff` as reports (printed, and with `--out DIR` written as
//! report.md, report.json and report.html), and the "who holds it" parts of a page that the
//! run-lab and scan reports embed: the holders as a table, the difference as a section.

use crate::diff::Difference;
use crate::explain::{Explanation, Holder, View};
use crate::model::Since;
use crate::render;
use leaklab_report::page::{Page, Section, Summary};
use leaklab_report::{human_bytes, Cell, Outcome, Report, Table, Tone};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Frames of a holder's stack shown on the page under its first frame in the user's code.
const STACK_FRAMES: usize = 4;

/// The holders as a table for a page: bytes, blocks, the first frame in the user's code and
/// the frames that called it.
pub fn holders_table(holders: &[Holder], top: usize) -> Table {
    let rows = holders.iter().take(top).map(|h| {
        let mut called = h
            .stack
            .iter()
            .take(STACK_FRAMES)
            .cloned()
            .collect::<Vec<_>>();
        if h.stack.len() > STACK_FRAMES {
            called.push(format!("… {} more frames", h.stack.len() - STACK_FRAMES));
        }
        let called = if called.is_empty() {
            Cell::new("-")
        } else {
            Cell::code(called.join("\n"))
        };
        vec![
            Cell::new(human_bytes(h.bytes as f64)),
            Cell::new(h.blocks.to_string()),
            Cell::code(&h.site),
            called,
        ]
    });
    let mut table = Table::new(["bytes", "blocks", "first frame in your code", "called from"])
        .numeric(&[0, 1])
        .rows(rows);
    if holders.len() > top {
        let rest: u64 = holders[top..].iter().map(|h| h.bytes).sum();
        table = table.caption(format!(
            "{} more stacks hold {}.",
            holders.len() - top,
            human_bytes(rest as f64)
        ));
    }
    table
}

/// What accumulated between two snapshots, as a section of a page, under `title`.
pub fn difference_section(title: &str, d: &Difference, top: usize) -> Section {
    let per_request = d.bytes_per_request.map_or(String::new(), |b| {
        format!(", {} per request", human_bytes(b))
    });
    Section::new(title)
        .text(format!(
            "Live in the second snapshot and not in the first: {} in {} blocks{per_request} (live {} → {}), grouped by the stack that allocated them, largest first.",
            human_bytes(d.bytes as f64),
            d.blocks,
            human_bytes(d.before_bytes as f64),
            human_bytes(d.after_bytes as f64)
        ))
        .table(holders_table(&d.holders, top))
}

/// `snapshot explain`: the explanation of one file, and how much of it to show.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct ExplainReport {
    pub explanation: Explanation,
    #[serde(skip)]
    pub file: PathBuf,
    #[serde(skip)]
    pub top: usize,
    /// Each holder's whole stack in the terminal's table.
    #[serde(skip)]
    pub stacks: bool,
}

/// Reads `file` and explains it.
pub fn explain_file(
    file: &Path,
    since: Option<Since>,
    view: View,
    top: usize,
    stacks: bool,
) -> crate::Result<ExplainReport> {
    let snapshot = crate::load(file)?;
    Ok(ExplainReport {
        explanation: crate::explain(&snapshot, view, since),
        file: file.to_path_buf(),
        top,
        stacks,
    })
}

impl Report for ExplainReport {
    fn outcome(&self) -> Outcome {
        Outcome::Pass
    }

    fn text(&self) -> String {
        render::explanation_text(&self.explanation, self.top, self.stacks)
    }

    fn markdown(&self) -> String {
        let e = &self.explanation;
        let mut md = format!("# leaklab snapshot explain {}\n\n", self.file.display());
        md.push_str(&render::explanation_markdown(
            &self.file.display().to_string(),
            e,
            self.top,
        ));
        if let Some(s) = &e.since {
            md.push_str(&format!(
                "\n#### Allocated after event {} and never freed: {}\n\n{}",
                s.from_event,
                human_bytes(s.bytes as f64),
                render::holder_table(&s.holders, self.top)
            ));
        }
        md
    }

    fn page(&self) -> Option<Page> {
        let e = &self.explanation;
        let headline = match (&e.since, e.holders.first()) {
            (Some(s), _) if !s.holders.is_empty() => format!(
                "Allocated after event {} and never freed: {}, most of it by {}.",
                s.from_event,
                human_bytes(s.bytes as f64),
                s.holders[0].site
            ),
            (_, Some(top)) => format!(
                "The largest holder, {}, holds {} in {} blocks.",
                top.site,
                human_bytes(top.bytes as f64),
                top.blocks
            ),
            _ => "No live block in this snapshot.".into(),
        };
        let summary = Summary {
            tone: Tone::Plain,
            answer: format!("{} allocated", human_bytes(e.allocated_bytes as f64)),
            headline,
            figures: vec![
                ("reserved".into(), human_bytes(e.reserved_bytes as f64)),
                ("allocated".into(), human_bytes(e.allocated_bytes as f64)),
                (
                    "pending free".into(),
                    human_bytes(e.pending_free_bytes as f64),
                ),
                (
                    "reserved, unallocated".into(),
                    human_bytes(e.unallocated_bytes as f64),
                ),
                ("segments".into(), e.segments.to_string()),
                ("trace events".into(), e.trace_events.to_string()),
            ],
            text: Vec::new(),
        };
        let mut page = Page::new(
            "leaklab snapshot explain",
            self.file.display().to_string(),
            summary,
        );
        page = page.section(Section::new("Live memory by allocating stack").text("Every live block, grouped by the stack that allocated it and named by the first frame in your code (PyTorch's and the runtime's frames skipped), largest first.").table(holders_table(&e.holders, self.top)));
        match &e.since {
            Some(s) => {
                page = page.section(
                    Section::new(format!("Allocated after event {} and never freed", s.from_event))
                        .text(format!("{} in the {} trace events after event {}: what a leak leaves behind.", human_bytes(s.bytes as f64), s.events, s.from_event))
                        .table(holders_table(&s.holders, self.top)),
                )
            }
            None if e.trace_events == 0 => page = page.section(Section::new("After a point").text("This snapshot has no allocator trace: record one with torch.cuda.memory._record_memory_history() to see what was allocated after a point and never freed.")),
            None => {}
        }
        if !e.fragmented_segments.is_empty() && e.unallocated_bytes > 0 {
            let rows = e.fragmented_segments.iter().take(self.top).map(|s| {
                vec![
                    Cell::code(format!("0x{:x}", s.address)),
                    Cell::new(&s.segment_type),
                    Cell::new(human_bytes(s.unallocated as f64)),
                    Cell::new(human_bytes(s.reserved as f64)),
                    Cell::new(human_bytes(s.largest_free_block as f64)),
                ]
            });
            page = page.section(
                Section::new("Reserved but unallocated, by segment")
                    .text("empty_cache returns whole free segments; expandable_segments and shape bucketing reduce the rest.")
                    .table(Table::new(["segment", "type", "unallocated", "reserved", "largest free block"]).numeric(&[2, 3, 4]).rows(rows)),
            );
        }
        Some(page.section(Section::new("How this was read").facts(vec![
            ("file".into(), self.file.display().to_string()),
            ("holders shown".into(), format!("the {} largest (--top)", self.top)),
            ("bytes".into(), "the blocks' sizes as the snapshot records them, in decimal units (1 kB = 1,000 bytes)".into()),
        ])))
    }
}

/// `snapshot diff`: what accumulated between two files.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct DiffReport {
    pub difference: Difference,
    #[serde(skip)]
    pub files: (PathBuf, PathBuf),
    #[serde(skip)]
    pub top: usize,
    #[serde(skip)]
    pub stacks: bool,
}

/// Reads both files and diffs them (`requests`: the request counts at the two, for bytes per request).
pub fn diff_files(
    before: &Path,
    after: &Path,
    requests: Option<(u64, u64)>,
    view: View,
    top: usize,
    stacks: bool,
) -> crate::Result<DiffReport> {
    let (b, a) = (crate::load(before)?, crate::load(after)?);
    Ok(DiffReport {
        difference: crate::diff(&b, &a, view, requests),
        files: (before.to_path_buf(), after.to_path_buf()),
        top,
        stacks,
    })
}

impl Report for DiffReport {
    fn outcome(&self) -> Outcome {
        Outcome::Pass
    }

    fn text(&self) -> String {
        render::difference_text(&self.difference, self.top, self.stacks)
    }

    fn markdown(&self) -> String {
        format!(
            "# leaklab snapshot diff {} {}\n\n{}",
            self.files.0.display(),
            self.files.1.display(),
            render::difference_markdown("From the first to the second", &self.difference, self.top)
        )
    }

    fn page(&self) -> Option<Page> {
        let d = &self.difference;
        let summary = Summary {
            tone: Tone::Plain,
            answer: format!("{} accumulated", human_bytes(d.bytes as f64)),
            headline: d.holders.first().map_or(
                "No block is live in the second snapshot and not in the first.".into(),
                |h| {
                    format!(
                        "Most of it allocated by {}: {} in {} blocks.",
                        h.site,
                        human_bytes(h.bytes as f64),
                        h.blocks
                    )
                },
            ),
            figures: [
                ("blocks", d.blocks.to_string()),
                ("live before", human_bytes(d.before_bytes as f64)),
                ("live after", human_bytes(d.after_bytes as f64)),
            ]
            .into_iter()
            .map(|(l, v)| (l.to_string(), v))
            .chain(
                d.bytes_per_request
                    .map(|b| ("per request".to_string(), human_bytes(b))),
            )
            .collect(),
            text: Vec::new(),
        };
        Some(
            Page::new(
                "leaklab snapshot diff",
                format!("{} → {}", self.files.0.display(), self.files.1.display()),
                summary,
            )
            .section(difference_section(
                "What accumulated, by allocating stack",
                d,
                self.top,
            ))
            .section(Section::new("How this was read").facts(vec![
                ("before".into(), self.files.0.display().to_string()),
                ("after".into(), self.files.1.display().to_string()),
                (
                    "holders shown".into(),
                    format!("the {} largest (--top)", self.top),
                ),
            ])),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(site: &str, bytes: u64, frames: usize) -> Holder {
        Holder {
            site: site.into(),
            bytes,
            blocks: 3,
            stack: (0..frames).map(|i| format!("app.py:{i} in f{i}")).collect(),
        }
    }

    #[test]
    fn a_holder_shows_its_first_frames_and_counts_the_rest() {
        let table = holders_table(
            &[
                holder("model.py:10 in forward", 4096, 6),
                holder("cache.py:3 in put", 1000, 0),
                holder("x.py:1 in y", 10, 1),
            ],
            2,
        );
        assert_eq!(
            table.rows[0][3].text,
            "app.py:0 in f0\napp.py:1 in f1\napp.py:2 in f2\napp.py:3 in f3\n… 2 more frames"
        );
        assert_eq!(table.rows[1][3].text, "-");
        assert_eq!(table.caption.as_deref(), Some("1 more stacks hold 10 B."));
        assert!(table.rows[0][2].code);
    }
}
