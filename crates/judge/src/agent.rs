//! The agent's documents, as data: its tensor census (`GET /debug/leaklab/tensors`, schema
//! `leaklab.census/1`, written once as the Python package's TypedDicts) and the difference
//! between two censuses by holder, its collector's state (`/stats`), its trim probe and its
//! native trace. Fetching them is the front ends' (`leaklab_scan::agent`); judging reads them.
//!
//! The holders whose bytes grew between two censuses are who keeps what the requests between
//! them left live, named as a Python engineer reads them (`service.HISTORY`,
//! `app.state.responses`). The scan, the watch and `leaklab judge` (the pytest plugin's) diff
//! censuses the same way, so all say "who holds it" in one voice.

use crate::thresholds::TRACED_BLOCKS_PER_REQUEST;
use anyhow::{bail, Result};
use leaklab_report::{human_bytes, signed_bytes, Cell, Table};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The census schema this reader knows; a newer minor addition of fields is read as is.
pub const SCHEMA: &str = "leaklab.census/1";

/// What the autograd graphs of a holder's tensors keep alive beside the tensors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GraphStats {
    pub tensors: u64,
    pub nodes: u64,
    pub saved_tensors: u64,
    pub saved_bytes: u64,
}

/// One holder of a census: the container that keeps tensors alive, and what it keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub holder: String,
    pub kind: String,
    pub tensors: u64,
    /// Bytes of the storages first reached through this holder (each storage once per census).
    pub bytes: u64,
    #[serde(default)]
    pub devices: BTreeMap<String, u64>,
    #[serde(default)]
    pub dtypes: BTreeMap<String, u64>,
    #[serde(default)]
    pub shapes: Vec<Vec<i64>>,
    #[serde(default)]
    pub graph: GraphStats,
    /// `id()` of the deepest object every tensor of this holder is reached through (the list,
    /// the hook dict), the same object in every census of one process however it is reached;
    /// absent where the holder's tensors share none, and from older agents.
    #[serde(default)]
    pub identity: Option<u64>,
}

impl Holder {
    /// The tensors' storages plus what only their graphs keep.
    pub fn held_bytes(&self) -> u64 {
        self.bytes + self.graph.saved_bytes
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub tensors: u64,
    pub bytes: u64,
    pub graph_nodes: u64,
    pub graph_saved_bytes: u64,
}

/// A census as the agent (or `leaklab.census.census()`) writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Census {
    pub schema: String,
    pub pid: u32,
    pub taken_at: f64,
    /// Wall time of the walk.
    pub seconds: f64,
    pub complete: bool,
    pub stopped_early: Option<String>,
    /// gc-tracked objects when it started.
    pub objects: u64,
    pub totals: Totals,
    /// Largest first.
    pub holders: Vec<Holder>,
    #[serde(default)]
    pub holders_omitted: u64,
    /// Python's own heap beside the tensors (absent from older agents).
    #[serde(default)]
    pub heap: Option<Heap>,
}

/// Python's own heap, as a census saw it: where objects that hold no tensor grow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heap {
    /// `sys.getallocatedblocks()`: pymalloc blocks in use.
    pub blocks: i64,
    /// gc-tracked objects by type (`module.qualname`), the most numerous only.
    pub types: BTreeMap<String, i64>,
}

/// How Python's own heap grew between two censuses: objects that hold no tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeapGrowth {
    /// gc-tracked objects, after minus before.
    pub objects: i64,
    /// pymalloc blocks, after minus before.
    pub blocks: i64,
    /// The types whose objects grew most, with how many more (at most [`HEAP_TYPES`]).
    pub types: Vec<(String, i64)>,
}

/// The grown types a [`HeapGrowth`] keeps.
pub const HEAP_TYPES: usize = 5;

impl Census {
    /// Reads a census document; anything else is a clear error.
    pub fn from_json(bytes: &[u8]) -> Result<Census> {
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| anyhow::anyhow!("not a census (not JSON: {e})"))?;
        match value.get("schema").and_then(|s| s.as_str()) {
            Some(SCHEMA) => {}
            Some(other) => bail!("a census of schema `{other}`; this leaklab reads `{SCHEMA}`: upgrade the one or the other"),
            None => bail!("not a census: the JSON has no `schema` field (is this the agent's /tensors route?)"),
        }
        serde_json::from_value(value).map_err(|e| anyhow::anyhow!("a malformed census: {e}"))
    }
}

/// A holder that grew between two censuses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Growth {
    pub holder: String,
    pub kind: String,
    /// Held bytes (storages plus graph-saved) after minus before.
    pub bytes: i64,
    /// `bytes` over the calls or requests between the censuses.
    pub bytes_per_step: f64,
    pub tensors: i64,
    pub graph_nodes: i64,
    /// Held bytes in the second census.
    pub bytes_after: u64,
    /// A few of the holder's shapes in the second census.
    pub shapes: Vec<Vec<i64>>,
    /// Where this is one container's entries added under generated names (`svc.MODEL.buf_17`,
    /// `svc.MODEL.buf_18`, …, as `svc.MODEL.buf_*`): how many grew ([`siblings`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
}

impl Growth {
    /// The holder as a sentence names it: `svc.HISTORY (module global)`, or for entries added
    /// under generated names `svc.MODEL.buf_* (module global, 150 entries under generated names)`.
    pub fn named(&self) -> String {
        format!("{} ({})", self.holder, self.kind_words())
    }

    /// Its kind, and for entries added under generated names how many grew.
    pub fn kind_words(&self) -> String {
        match self.entries {
            Some(n) => format!("{}, {n} entries under generated names", self.kind),
            None => self.kind.clone(),
        }
    }

    /// What to do about it: stop keeping what it keeps, or, for entries added under generated
    /// names, stop the act that adds one a `step`.
    pub fn fix(&self, step: &str) -> String {
        match (self.entries, self.holder.rsplit_once(['.', ' '])) {
            (Some(_), Some((parent, pattern))) => format!(
                "stop adding an entry a {step} to `{parent}` under a generated name (`{pattern}`): a module's `register_buffer` or `register_parameter`, a `setattr`, or a `globals()[…]` per {step}; keep one bounded holder, or a number"
            ),
            _ => format!(
                "stop keeping it in `{}` (drop the reference, bound it, or detach and copy what is kept)",
                self.holder
            ),
        }
    }
}

/// `holder` with the digits of its last segment masked (`svc.MODEL.buf_17` → `svc.MODEL.buf_*`),
/// where that segment has any: the name its siblings added under generated names share.
fn generated_pattern(holder: &str) -> Option<String> {
    let cut = holder.rfind(['.', ' ']).map_or(0, |i| i + 1);
    let (parent, last) = holder.split_at(cut);
    if !last.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut pattern = parent.to_string();
    for c in last.chars() {
        if !c.is_ascii_digit() {
            pattern.push(c);
        } else if !pattern.ends_with('*') {
            pattern.push('*');
        }
    }
    Some(pattern)
}

/// Grown holders of one kind under one parent whose names differ only by their digits, at
/// least [`crate::thresholds::SIBLINGS`] of them, merged into one: the container's entries added
/// under generated names (a module's buffers registered per request as `buf_{n}`, attributes
/// set as `out_{n}`, globals as `cache_{n}`) are one holder with a count, not a row each.
pub fn siblings(grown: Vec<Growth>, steps: u64) -> Vec<Growth> {
    let mut groups: BTreeMap<(String, String), Vec<Growth>> = BTreeMap::new();
    let mut out = Vec::new();
    for g in grown {
        match generated_pattern(&g.holder) {
            Some(p) if g.entries.is_none() => {
                groups.entry((p, g.kind.clone())).or_default().push(g)
            }
            _ => out.push(g),
        }
    }
    for ((pattern, kind), members) in groups {
        if members.len() < crate::thresholds::SIBLINGS {
            out.extend(members);
            continue;
        }
        let sum = |f: fn(&Growth) -> i64| members.iter().map(f).sum::<i64>();
        out.push(Growth {
            holder: pattern,
            kind,
            bytes: sum(|g| g.bytes),
            bytes_per_step: sum(|g| g.bytes) as f64 / steps.max(1) as f64,
            tensors: sum(|g| g.tensors),
            graph_nodes: sum(|g| g.graph_nodes),
            bytes_after: members.iter().map(|g| g.bytes_after).sum(),
            shapes: members[0].shapes.clone(),
            entries: Some(members.len() as u64),
        });
    }
    out
}

/// Who holds what accumulated between two censuses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CensusDiff {
    /// The process both censuses were taken in (absent where they were not one process's, and
    /// in recordings made before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Requests (or calls) between the two censuses.
    pub steps: u64,
    /// Holders whose held bytes, tensors or graph nodes grew, most bytes first.
    pub grown: Vec<Growth>,
    /// Every tensor's bytes plus graph-saved bytes, after minus before.
    pub total_bytes: i64,
    pub total_tensors: i64,
    pub total_graph_nodes: i64,
    /// Seconds each census held the service (walk time), before and after.
    pub census_seconds: (f64, f64),
    /// A census that stopped early, said as it said it.
    pub notes: Vec<String>,
    /// Python's own heap over the same steps, where both censuses read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap: Option<HeapGrowth>,
}

/// The holders that grew from `before` to `after`, `steps` requests or calls apart. A holder of
/// `after` is compared with the holder of `before` that is the same object where the censuses
/// say so (the same `identity`, in the same process, its name gone from `after`: reached by
/// another path), else with the one of the same name (the agent collapses indices and keys, so
/// a holder keeps its name); one new in `after` grew from nothing.
pub fn diff(before: &Census, after: &Census, steps: u64) -> CensusDiff {
    let old: BTreeMap<&str, &Holder> = before
        .holders
        .iter()
        .map(|h| (h.holder.as_str(), h))
        .collect();
    let per = |b: i64| b as f64 / steps.max(1) as f64;
    let new: std::collections::BTreeSet<&str> =
        after.holders.iter().map(|h| h.holder.as_str()).collect();
    // Holders of `before` whose name is gone: a holder of `after` with a new name may be one of
    // them. Only these are matched by identity: an object freed between the censuses can leave
    // its address to another, and a name that stayed says which holder it is.
    let mut gone: Vec<&Holder> = before
        .holders
        .iter()
        .filter(|h| !new.contains(h.holder.as_str()))
        .collect();
    let mut was: Vec<Option<&Holder>> = after
        .holders
        .iter()
        .map(|h| old.get(h.holder.as_str()).copied())
        .collect();
    let mut notes = Vec::new();
    // The same object reached by another path: the walk names a holder by its shortest path
    // from a root, and a shorter one can appear between the censuses (a connection's scope
    // that reaches the route's closure). Ids are only comparable within one process.
    let mut moved = vec![false; after.holders.len()];
    if before.pid == after.pid {
        for ((h, w), m) in after
            .holders
            .iter()
            .zip(was.iter_mut())
            .zip(moved.iter_mut())
        {
            let Some(id) = h.identity.filter(|_| w.is_none()) else {
                continue;
            };
            // Holders that share their deepest object (a module's `.weight` and `.bias`, both
            // in its parameters dict): the one whose name ends the same way.
            let tail = |g: &&Holder| {
                let ends = g.holder.chars().rev().zip(h.holder.chars().rev());
                ends.take_while(|(a, b)| a == b).count()
            };
            let same = gone
                .iter()
                .enumerate()
                .filter(|(_, g)| g.identity == Some(id))
                .max_by_key(|(i, g)| (tail(g), std::cmp::Reverse(*i)));
            if let Some((i, _)) = same {
                *w = Some(gone.remove(i));
                *m = true;
            }
        }
    }
    // A holder can also change its name without changing what it holds, where the census
    // gives no identity: tensors reached only through another thread's frames (a test client's
    // event loop) are named by the first path the walk finds, which may differ between
    // censuses. A holder new in `after` that holds exactly what a holder gone from `before`
    // held is that holder renamed, not growth.
    for (h, w) in after.holders.iter().zip(was.iter_mut()) {
        if w.is_some() {
            continue;
        }
        let same = |g: &&Holder| {
            (&g.kind, g.tensors, g.bytes, &g.graph) == (&h.kind, h.tensors, h.bytes, &h.graph)
        };
        if let Some(i) = gone.iter().position(same) {
            let g = gone.remove(i);
            notes.push(format!("`{}` is `{}` of the first census under another name (the same kind, tensors, bytes and graph): not counted as growth", h.holder, g.holder));
            *w = Some(g);
        }
    }
    // Said of the holders that grew; the others that moved, counted.
    let mut quiet = 0;
    for ((h, o), m) in after.holders.iter().zip(&was).zip(&moved) {
        let Some(o) = o.filter(|_| *m) else {
            continue;
        };
        if h.held_bytes() > o.held_bytes() || h.tensors > o.tensors || h.graph.nodes > o.graph.nodes
        {
            notes.push(format!("`{}` is `{}` of the first census reached by another path (the same object): its growth is counted from it", h.holder, o.holder));
        } else {
            quiet += 1;
        }
    }
    if quiet > 0 {
        notes.push(format!("{quiet} holders that did not grow were reached by another path in the second census (the same objects, compared with themselves)"));
    }
    let mut grown: Vec<Growth> = after
        .holders
        .iter()
        .zip(was)
        .filter_map(|(h, o)| {
            let bytes = h.held_bytes() as i64 - o.map_or(0, |o| o.held_bytes() as i64);
            let tensors = h.tensors as i64 - o.map_or(0, |o| o.tensors as i64);
            let graph_nodes = h.graph.nodes as i64 - o.map_or(0, |o| o.graph.nodes as i64);
            (bytes > 0 || tensors > 0 || graph_nodes > 0).then(|| Growth {
                holder: h.holder.clone(),
                kind: h.kind.clone(),
                bytes,
                bytes_per_step: per(bytes),
                tensors,
                graph_nodes,
                bytes_after: h.held_bytes(),
                shapes: h.shapes.iter().take(3).cloned().collect(),
                entries: None,
            })
        })
        .collect();
    grown = siblings(grown, steps);
    grown.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.graph_nodes.cmp(&a.graph_nodes))
            .then(a.holder.cmp(&b.holder))
    });
    let total = |c: &Census| (c.totals.bytes + c.totals.graph_saved_bytes) as i64;
    for (which, c) in [("the first", before), ("the second", after)] {
        if let Some(why) = &c.stopped_early {
            notes.push(format!(
                "{which} census stopped early ({why}): holders it did not reach are missing"
            ));
        }
        if c.holders_omitted > 0 {
            notes.push(format!(
                "{which} census left out {} small holders (asked with top=)",
                c.holders_omitted
            ));
        }
    }
    CensusDiff {
        pid: (before.pid == after.pid).then_some(after.pid),
        steps,
        grown,
        total_bytes: total(after) - total(before),
        total_tensors: after.totals.tensors as i64 - before.totals.tensors as i64,
        total_graph_nodes: after.totals.graph_nodes as i64 - before.totals.graph_nodes as i64,
        census_seconds: (before.seconds, after.seconds),
        notes,
        heap: heap_growth(before, after),
    }
}

/// How Python's heap grew from `before` to `after`: objects, blocks, the types that grew most.
fn heap_growth(before: &Census, after: &Census) -> Option<HeapGrowth> {
    let (a, b) = (before.heap.as_ref()?, after.heap.as_ref()?);
    let mut types: Vec<(String, i64)> = b
        .types
        .iter()
        .map(|(name, n)| (name.clone(), n - a.types.get(name).copied().unwrap_or(0)))
        .filter(|(_, grew)| *grew > 0)
        .collect();
    types.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    types.truncate(HEAP_TYPES);
    Some(HeapGrowth {
        objects: after.objects as i64 - before.objects as i64,
        blocks: b.blocks - a.blocks,
        types,
    })
}

/// The service's census, process by process: `own`, the census through the agent the scan was
/// given (where it compared two censuses of one process), and `workers`, each other process's
/// census through its own agent, by PID. Holders of the same name and kind in several processes
/// are summed (a worker pool runs the same code in each worker, each keeping its share), so the
/// whole growth is weighed against the whole service's; the steps are the looks' own, which all
/// the censuses share. The sum is no one process's (`pid` None).
pub fn merged(own: Option<&CensusDiff>, workers: &BTreeMap<u32, CensusDiff>) -> Option<CensusDiff> {
    if workers.is_empty() {
        return own.cloned();
    }
    // A worker's census through its own agent is the same process's as `own` where the agent
    // the scan was given answered from that worker: counted once.
    let mut all = own.into_iter().chain(
        workers
            .iter()
            .filter(|(pid, _)| own.is_none_or(|o| o.pid != Some(**pid)))
            .map(|(_, c)| c),
    );
    let mut sum = all.next()?.clone();
    for c in all {
        sum.pid = None;
        for g in &c.grown {
            match sum
                .grown
                .iter_mut()
                .find(|s| (&s.holder, &s.kind) == (&g.holder, &g.kind))
            {
                Some(s) => {
                    s.bytes += g.bytes;
                    s.tensors += g.tensors;
                    s.graph_nodes += g.graph_nodes;
                    s.bytes_after += g.bytes_after;
                    s.entries = s.entries.zip(g.entries).map(|(a, b)| a + b);
                }
                None => sum.grown.push(g.clone()),
            }
        }
        sum.steps = sum.steps.max(c.steps);
        sum.total_bytes += c.total_bytes;
        sum.total_tensors += c.total_tensors;
        sum.total_graph_nodes += c.total_graph_nodes;
        sum.census_seconds.0 = sum.census_seconds.0.max(c.census_seconds.0);
        sum.census_seconds.1 = sum.census_seconds.1.max(c.census_seconds.1);
        sum.notes.extend(c.notes.iter().cloned());
        sum.heap = sum.heap.zip(c.heap.as_ref()).map(|(a, b)| {
            let mut types: BTreeMap<String, i64> = a.types.into_iter().collect();
            for (name, n) in &b.types {
                *types.entry(name.clone()).or_default() += n;
            }
            let mut types: Vec<(String, i64)> = types.into_iter().collect();
            types.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
            types.truncate(HEAP_TYPES);
            HeapGrowth {
                objects: a.objects + b.objects,
                blocks: a.blocks + b.blocks,
                types,
            }
        });
    }
    for g in &mut sum.grown {
        g.bytes_per_step = g.bytes as f64 / sum.steps.max(1) as f64;
    }
    sum.grown
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.holder.cmp(&b.holder)));
    Some(sum)
}

/// The processes whose census grew `holder`, by PID, from [`merged`]'s `workers`.
pub fn holding(workers: &BTreeMap<u32, CensusDiff>, holder: &str) -> Vec<u32> {
    workers
        .iter()
        .filter(|(_, c)| c.grown.iter().any(|g| g.holder == holder && g.bytes > 0))
        .map(|(pid, _)| *pid)
        .collect()
}

impl CensusDiff {
    /// The holders that grew with a Python referrer, most bytes first: tensors the census
    /// reached from no Python object ([`crate::diagnosis::NATIVE_KIND`]) are not Python's.
    pub fn python_grown(&self) -> impl Iterator<Item = &Growth> {
        self.grown
            .iter()
            .filter(|g| g.kind != crate::diagnosis::NATIVE_KIND)
    }

    /// Bytes gained by tensors held from native code (no Python referrer), over all steps.
    pub fn native_bytes(&self) -> f64 {
        self.grown
            .iter()
            .filter(|g| g.kind == crate::diagnosis::NATIVE_KIND)
            .map(|g| g.bytes.max(0) as f64)
            .sum()
    }

    /// One line per grown holder, the way a failure message lists them:
    /// `service.HISTORY (module global): +300 tensors, +1.23 MB (4.10 kB per request)`.
    pub fn lines(&self, top: usize, step: &str) -> Vec<String> {
        self.grown
            .iter()
            .take(top)
            .map(|g| {
                let mut parts = Vec::new();
                if g.tensors != 0 {
                    parts.push(format!("{:+} tensors", g.tensors));
                }
                parts.push(format!(
                    "{} ({} per {step})",
                    signed_bytes(g.bytes as f64),
                    human_bytes(g.bytes_per_step)
                ));
                if g.graph_nodes != 0 {
                    parts.push(format!("{:+} autograd graph nodes", g.graph_nodes));
                }
                format!("{}: {}", g.named(), parts.join(", "))
            })
            .collect()
    }

    /// The text under a report's "who holds it" heading.
    pub fn text(&self, top: usize, step: &str) -> String {
        let mut out = if self.grown.is_empty() {
            vec![format!("No holder grew: the tensors reachable from Python are the same {} {step}s later ({} in all).", self.steps, signed_bytes(self.total_bytes as f64))]
        } else {
            self.lines(top, step)
                .into_iter()
                .map(|l| format!("  {l}"))
                .collect()
        };
        if self.grown.len() > top {
            out.push(format!(
                "  … and {} more holders that grew",
                self.grown.len() - top
            ));
        }
        out.push(format!("  {}", self.totals(step)));
        if let Some(h) = self.heap.as_ref().filter(|h| h.objects > 0) {
            let types: Vec<String> = h
                .types
                .iter()
                .take(3)
                .map(|(name, n)| format!("`{name}` {n:+}"))
                .collect();
            out.push(format!(
                "  Python's own heap: {:+} gc-tracked objects ({:.1} a {step}), {:+} pymalloc blocks; most: {}",
                h.objects,
                h.objects as f64 / self.steps.max(1) as f64,
                h.blocks,
                types.join(", ")
            ));
        }
        out.extend(self.notes.iter().map(|n| format!("  Note: {n}")));
        out.join("\n")
    }

    /// The grown holders, most bytes first: holder, kind, tensors, bytes, bytes per step,
    /// autograd graph nodes.
    pub fn table(&self, top: usize, step: &str) -> Table {
        let rows = self.grown.iter().take(top).map(|g| {
            let grew = |n: i64| Cell::new(format!("{n:+}"));
            vec![
                Cell::code(&g.holder),
                Cell::new(&g.kind),
                grew(g.tensors),
                Cell::new(signed_bytes(g.bytes as f64)),
                Cell::new(human_bytes(g.bytes_per_step)),
                grew(g.graph_nodes),
            ]
        });
        Table::new([
            "holder",
            "kind",
            "tensors",
            "bytes",
            &format!("per {step}"),
            "graph nodes",
        ])
        .numeric(&[2, 3, 4, 5])
        .rows(rows)
    }

    /// Every tensor's growth in one sentence, and what each census cost.
    pub fn totals(&self, step: &str) -> String {
        format!(
            "In all: {:+} tensors, {} ({} per {step}) over {} {step}s; each census took {:.2} s and {:.2} s.",
            self.total_tensors,
            signed_bytes(self.total_bytes as f64),
            human_bytes(self.total_bytes as f64 / self.steps.max(1) as f64),
            self.steps,
            self.census_seconds.0,
            self.census_seconds.1
        )
    }

    pub fn markdown(&self, top: usize, step: &str) -> String {
        let mut md = format!(
            "## Who holds it (the agent's tensor census, {} {step}s apart)\n\n",
            self.steps
        );
        if self.grown.is_empty() {
            md.push_str("No holder grew.\n\n");
        } else {
            // Holder names in backticks, as markdown shows code.
            let mut table = self.table(top, step);
            for row in &mut table.rows {
                row[0].text = format!("`{}`", row[0].text);
            }
            md.push_str(&table.markdown());
            md.push('\n');
        }
        for n in &self.notes {
            md.push_str(&format!("Note: {n}\n\n"));
        }
        md
    }
}

/// The collector's state, as the agent's `/stats` says it (`leaklab.stats/1`, `collector`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Collector {
    /// False where the service called `gc.disable()`: cycles are never freed.
    pub enabled: bool,
    #[serde(default)]
    pub thresholds: Vec<u64>,
    /// Objects `gc.freeze()` moved aside, never collected.
    #[serde(default)]
    pub frozen: u64,
    #[serde(default)]
    pub uncollectable: u64,
}

impl Default for Collector {
    fn default() -> Collector {
        Collector {
            enabled: true,
            thresholds: Vec::new(),
            frozen: 0,
            uncollectable: 0,
        }
    }
}

/// The threads alive in the agent's process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadsAlive {
    pub python: u64,
    /// Every OS thread (`Threads:` of /proc/self/status); None without /proc.
    pub os: Option<u64>,
}

/// What the scan reads of `GET {base}/stats`: the process state that explains a cause.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Absent from an agent older than the collector's state.
    #[serde(default)]
    pub collector: Option<Collector>,
    #[serde(default)]
    pub threads: Option<ThreadsAlive>,
    /// Where the workers share a folder (`workers_dir`): the whole server.
    #[serde(default)]
    pub workers: Option<Workers>,
}

/// The agents a server's workers serve of their own, by PID, from its `stats`.
pub fn registered(workers: Option<&Workers>) -> BTreeMap<u32, String> {
    workers.map_or_else(BTreeMap::new, |w| {
        w.agents
            .iter()
            .filter_map(|(pid, url)| Some((pid.parse().ok()?, url.clone())))
            .collect()
    })
}

/// The workers of one server, as the agent's `stats` lists them (`workers`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Workers {
    #[serde(default)]
    pub pids: Vec<u32>,
    /// PID -> the agent's base URL, for the workers that serve one of their own
    /// (`leaklab.serve_agent()`): where to look inside each.
    #[serde(default)]
    pub agents: BTreeMap<String, String>,
}

/// One step of the trim probe: the resident anonymous memory it gave back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TrimShare {
    /// Before minus after; None where the step did not run.
    #[serde(default)]
    pub given_back_bytes: Option<i64>,
}

/// What the agent's trim probe said (`POST {base}/trim`, `leaklab.trim/1`): what the allocator
/// kept, what the collector freed and what `malloc_trim(0)` then returned, as its findings
/// word them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trim {
    #[serde(default)]
    pub findings: Vec<String>,
    #[serde(default)]
    pub seconds: f64,
    /// `malloc_trim(0)` first: free memory the allocator kept.
    #[serde(default)]
    pub kept_by_allocator: TrimShare,
    /// Then `gc.collect()`: the garbage's memory given back as it was freed.
    #[serde(default)]
    pub collect: TrimShare,
    /// `malloc_trim(0)` again: what of the garbage's memory the allocator kept.
    #[serde(default)]
    pub malloc_trim: TrimShare,
    /// The whole answer, for programs.
    #[serde(default)]
    pub document: serde_json::Value,
}

impl Trim {
    /// What the allocator returned when asked (both `malloc_trim(0)` steps), not the garbage.
    pub fn allocator_returned(&self) -> i64 {
        [self.kept_by_allocator, self.malloc_trim]
            .iter()
            .filter_map(|s| s.given_back_bytes)
            .filter(|b| *b > 0)
            .sum()
    }
}

/// A native holder the agent's map knows (oneDNN's primitive cache, cuDNN's plan cache...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NativeHolder {
    pub mechanism: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub knobs: Vec<String>,
    #[serde(default)]
    pub fix: String,
    #[serde(default)]
    pub bytes: u64,
}

/// One native stack the traced window left memory live under.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NativeStack {
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub mechanism: Option<String>,
    /// The allocating frame first.
    #[serde(default)]
    pub frames: Vec<NativeFrame>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NativeFrame {
    pub symbol: String,
    #[serde(default)]
    pub file: String,
    #[serde(default)]
    pub line: u64,
}

/// The agent's Python trace over a window of requests (`POST {base}/pytrace`,
/// `leaklab.pytrace/1`): what Python objects the window allocated and left alive, by line
/// (tracemalloc), where no tensor holds the memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PyTrace {
    #[serde(default)]
    pub requests: u64,
    #[serde(default)]
    pub seconds: f64,
    /// Allocated within the window and alive at its end, leaklab's own left out.
    #[serde(default)]
    pub kept_bytes: i64,
    #[serde(default)]
    pub kept_blocks: i64,
    /// Both snapshots taken with no request in flight (absent from agents before it was kept:
    /// false, a request's objects may read as kept).
    #[serde(default)]
    pub between_requests: bool,
    /// By bytes, most first.
    #[serde(default)]
    pub top: Vec<TracedLine>,
    #[serde(default)]
    pub note: Option<String>,
}

/// A line that allocated what a Python trace's window kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TracedLine {
    pub file: String,
    pub line: u64,
    pub bytes: i64,
    pub blocks: i64,
}

impl PyTrace {
    /// The lines that gained at least [`TRACED_BLOCKS_PER_REQUEST`] blocks a request: a growth
    /// per request, not a request in flight at one snapshot.
    fn grown_per_request(&self) -> impl Iterator<Item = &TracedLine> {
        let least = TRACED_BLOCKS_PER_REQUEST * self.requests as f64;
        self.top.iter().filter(move |l| l.blocks as f64 >= least)
    }

    /// Bytes kept a request over the window by those lines, where it counted any request.
    pub fn kept_per_request(&self) -> Option<f64> {
        (self.requests > 0).then(|| {
            self.grown_per_request()
                .map(|l| l.bytes.max(0) as f64)
                .sum::<f64>()
                / self.requests as f64
        })
    }

    /// `prometheus_client/metrics.py:193`: the top line that grew per request, its path cut
    /// to its last two parts.
    pub fn top_line(&self) -> Option<String> {
        self.grown_per_request().next().map(|l| {
            let parts: Vec<&str> = l.file.rsplit('/').take(2).collect();
            let short: Vec<&str> = parts.into_iter().rev().collect();
            format!("{}:{}", short.join("/"), l.line)
        })
    }
}

/// The agent's native trace over a window of requests (`POST {base}/native`, `leaklab.native/1`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Native {
    #[serde(default)]
    pub traced: bool,
    #[serde(default)]
    pub requests: u64,
    #[serde(default)]
    pub seconds: f64,
    #[serde(default)]
    pub live_bytes: u64,
    #[serde(default)]
    pub holders: Vec<NativeHolder>,
    #[serde(default)]
    pub unattributed_bytes: u64,
    #[serde(default)]
    pub top: Vec<NativeStack>,
    #[serde(default)]
    pub note: Option<String>,
}

impl Native {
    /// The top stacks in a line each: bytes, mechanism (or "unknown"), the first frames.
    pub fn stack_lines(&self, top: usize) -> Vec<String> {
        self.top
            .iter()
            .take(top)
            .map(|s| {
                let frames: Vec<&str> =
                    s.frames.iter().take(3).map(|f| f.symbol.as_str()).collect();
                format!(
                    "{} under {} ({})",
                    human_bytes(s.bytes as f64),
                    frames.join(" ← "),
                    s.mechanism.as_deref().unwrap_or("unknown holder")
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(name: &str, tensors: u64, bytes: u64, nodes: u64, saved: u64) -> Holder {
        Holder {
            holder: name.into(),
            kind: "module global".into(),
            tensors,
            bytes,
            devices: BTreeMap::new(),
            dtypes: BTreeMap::new(),
            shapes: vec![vec![8, 512]],
            graph: GraphStats {
                tensors: (nodes > 0) as u64,
                nodes,
                saved_tensors: 0,
                saved_bytes: saved,
            },
            identity: None,
        }
    }

    fn census(holders: Vec<Holder>) -> Census {
        let totals = Totals {
            tensors: holders.iter().map(|h| h.tensors).sum(),
            bytes: holders.iter().map(|h| h.bytes).sum(),
            graph_nodes: holders.iter().map(|h| h.graph.nodes).sum(),
            graph_saved_bytes: holders.iter().map(|h| h.graph.saved_bytes).sum(),
        };
        Census {
            schema: SCHEMA.into(),
            pid: 1,
            taken_at: 0.0,
            seconds: 0.1,
            complete: true,
            stopped_early: None,
            objects: 1000,
            totals,
            holders,
            holders_omitted: 0,
            heap: None,
        }
    }

    /// Entries added per request under generated names, in three kinds of container (a
    /// module's buffers, app.state's attributes, a module's globals) and one more the issue did
    /// not name (an instance's attributes): each container one holder with its count, its
    /// growth summed, and its fix the act that adds them. Two such names, or names without
    /// digits, stay apart.
    #[test]
    fn entries_added_under_generated_names_are_one_holder_with_a_count() {
        let mut after = vec![holder("svc.HISTORY", 50, 50 * 4096, 0, 0)];
        for n in 0..30 {
            after.push(holder(&format!("svc.MODEL.buf_{n}"), 1, 8192, 0, 0));
            after.push(holder(&format!("svc.app.state.out_{n}"), 1, 4096, 0, 0));
            after.push(holder(&format!("svc.cache_{n}"), 1, 2048, 0, 0));
            after.push(holder(&format!("svc.RECORDER.step{n}x"), 1, 1024, 0, 0));
        }
        after.push(holder("svc.pair_1", 1, 100, 0, 0));
        after.push(holder("svc.pair_2", 1, 100, 0, 0));
        let d = diff(&census(vec![]), &census(after), 30);
        let grown: BTreeMap<&str, &Growth> =
            d.grown.iter().map(|g| (g.holder.as_str(), g)).collect();
        let buffers = grown["svc.MODEL.buf_*"];
        assert_eq!(
            (
                buffers.entries,
                buffers.tensors,
                buffers.bytes,
                buffers.bytes_per_step
            ),
            (Some(30), 30, 30 * 8192, 8192.0)
        );
        assert_eq!(grown["svc.app.state.out_*"].entries, Some(30));
        assert_eq!(grown["svc.cache_*"].entries, Some(30));
        assert_eq!(grown["svc.RECORDER.step*x"].entries, Some(30));
        assert_eq!(grown["svc.HISTORY"].entries, None);
        assert!(grown.contains_key("svc.pair_1") && grown.contains_key("svc.pair_2"));
        assert_eq!(d.grown.len(), 7, "{:?}", grown.keys());
        assert_eq!(
            d.lines(1, "request")[0],
            "svc.MODEL.buf_* (module global, 30 entries under generated names): +30 tensors, +245.76 kB (8.19 kB per request)"
        );
        assert!(buffers.fix("request").starts_with(
            "stop adding an entry a request to `svc.MODEL` under a generated name (`buf_*`): a module's `register_buffer`"
        ));
        assert!(grown["svc.HISTORY"]
            .fix("request")
            .starts_with("stop keeping it in `svc.HISTORY`"));
    }

    #[test]
    fn holders_that_grew_are_named_with_their_growth_per_step_and_the_others_are_not() {
        let before = census(vec![
            holder("service.HISTORY", 50, 819_200, 0, 0),
            holder("model.weights", 4, 4_000_000, 0, 0),
            holder("Pipeline.acc", 1, 4, 100, 40_000),
        ]);
        let after = census(vec![
            holder("service.HISTORY", 650, 10_649_600, 0, 0),
            holder("model.weights", 4, 4_000_000, 0, 0),
            holder("Pipeline.acc", 1, 4, 700, 280_000),
            holder("service.CACHE", 3, 12, 0, 0),
        ]);
        let d = diff(&before, &after, 600);
        let names: Vec<&str> = d.grown.iter().map(|g| g.holder.as_str()).collect();
        assert_eq!(
            names,
            ["service.HISTORY", "Pipeline.acc", "service.CACHE"],
            "weights did not grow"
        );
        assert_eq!(d.grown[0].bytes, 9_830_400);
        assert_eq!(d.grown[0].bytes_per_step, 16_384.0);
        assert_eq!(
            (d.grown[1].tensors, d.grown[1].graph_nodes, d.grown[1].bytes),
            (0, 600, 240_000),
            "one tensor whose graph grows"
        );
        assert_eq!(d.total_bytes, 9_830_400 + 240_000 + 12);
        let lines = d.lines(5, "request");
        assert_eq!(
            lines[0],
            "service.HISTORY (module global): +600 tensors, +9.83 MB (16.38 kB per request)"
        );
        assert!(
            lines[1].contains("+600 autograd graph nodes"),
            "{}",
            lines[1]
        );
        assert!(d.text(1, "call").contains("… and 2 more holders that grew"));
    }

    #[test]
    fn a_holder_that_only_changed_its_name_is_not_growth_and_a_new_one_is() {
        let frame = |name: &str| Holder {
            kind: "frame".into(),
            ..holder(name, 5, 20_480, 0, 0)
        };
        let before = census(vec![frame("thread 'loop' run (a.py:3) local 'x'")]);
        // The newcomer comes first and holds the same: the kind tells the rename apart.
        let after = census(vec![
            holder("service.CACHE", 5, 20_480, 0, 0),
            frame("thread 'loop' _run_once (b.py:9) local 'y'"),
        ]);
        let d = diff(&before, &after, 100);
        assert_eq!(
            d.grown
                .iter()
                .map(|g| g.holder.as_str())
                .collect::<Vec<_>>(),
            ["service.CACHE"],
            "one rename, one real newcomer: {d:?}"
        );
        assert!(d.notes[0].contains("under another name"), "{:?}", d.notes);
    }

    /// The zoo's forward_hook entry: the hooks' dict reached by a shorter path in the second
    /// census (a connection's scope that reaches the route's closure) changed the holder's name,
    /// and every hook counted as new (90.11 kB a request reported, 16.38 the truth).
    #[test]
    fn the_same_object_under_another_name_is_compared_with_itself() {
        let hooks = |name: &str, hooks: u64| Holder {
            kind: "closure".into(),
            identity: Some(0x7f00_dead_beef),
            ..holder(name, hooks, hooks * 16_384, 0, 0)
        };
        let before = census(vec![hooks(
            "app.router.routes[…] → predict → cell 'hidden'._forward_hooks[…] → hook → cell 'noise'",
            50,
        )]);
        let after = census(vec![hooks(
            "server.server_state.connections[…].scope[…] → predict → cell 'hidden'._forward_hooks[…] → hook → cell 'noise'",
            450,
        )]);
        let d = diff(&before, &after, 400);
        assert_eq!(d.grown.len(), 1, "{d:?}");
        assert_eq!(
            d.grown[0].bytes_per_step, 16_384.0,
            "400 hooks in 400 requests"
        );
        assert!(d.grown[0].holder.starts_with("server."), "named as now");
        assert!(
            d.notes[0].contains("reached by another path"),
            "{:?}",
            d.notes
        );
        // Another process's census: its ids say nothing of this one's objects.
        let mut elsewhere = after.clone();
        elsewhere.pid = 2;
        assert_eq!(
            diff(&before, &elsewhere, 400).grown[0].bytes_per_step,
            18_432.0,
            "all of it new"
        );
        // A holder whose name stayed is compared by name, whatever object now has its id.
        let mut kept = after.clone();
        kept.holders.push(Holder {
            identity: None,
            ..hooks("app.state.other", 50)
        });
        kept.holders[0].identity = Some(1);
        let reused = census(vec![Holder {
            identity: Some(1),
            ..hooks("app.state.other", 50)
        }]);
        let d = diff(&reused, &kept, 400);
        let names: Vec<&str> = d.grown.iter().map(|g| g.holder.as_str()).collect();
        assert_eq!(names.len(), 1, "{d:?}");
        assert!(names[0].starts_with("server."), "{names:?}");
        assert_eq!(
            d.grown[0].bytes,
            450 * 16_384,
            "new: the id belongs to a name that stayed"
        );
        // Two holders with one deepest object (a layer's parameters dict), both renamed: each
        // is compared with the one whose name ends as its own.
        let param = |name: &str, bytes| Holder {
            identity: Some(7),
            ..holder(name, 1, bytes, 0, 0)
        };
        let before = census(vec![
            param("svc.MODEL.2.bias", 32),
            param("svc.MODEL.2.weight", 256),
        ]);
        let after = census(vec![
            param("svc.LAYER.weight", 256),
            param("svc.LAYER.bias", 32),
        ]);
        let d = diff(&before, &after, 10);
        assert!(d.grown.is_empty(), "{d:?}");
        assert_eq!(
            d.notes,
            ["2 holders that did not grow were reached by another path in the second census (the same objects, compared with themselves)"]
        );
        // Had the weight grown, its line says what it was, however the two are listed.
        let mut bigger = after.clone();
        bigger.holders[0].bytes = 512;
        let d = diff(&before, &bigger, 10);
        assert_eq!(d.grown[0].bytes, 256, "{d:?}");
        assert!(
            d.notes[0].contains("`svc.LAYER.weight` is `svc.MODEL.2.weight`"),
            "{:?}",
            d.notes
        );
    }

    #[test]
    fn a_bounded_holder_full_before_the_first_census_does_not_grow() {
        let full = census(vec![holder("Recorder.buffer", 1024, 2_097_152, 0, 0)]);
        let d = diff(&full, &full.clone(), 300);
        assert!(d.grown.is_empty());
        assert!(
            d.text(5, "call").starts_with("No holder grew"),
            "{}",
            d.text(5, "call")
        );
    }

    #[test]
    fn other_documents_are_refused_clearly() {
        assert!(Census::from_json(b"<html>")
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
        assert!(Census::from_json(b"{\"holders\": []}")
            .unwrap_err()
            .to_string()
            .contains("no `schema`"));
        assert!(Census::from_json(b"{\"schema\": \"leaklab.census/9\"}")
            .unwrap_err()
            .to_string()
            .contains("leaklab.census/9"));
        assert!(
            Census::from_json(b"{\"schema\": \"leaklab.census/1\", \"pid\": 1}")
                .unwrap_err()
                .to_string()
                .contains("malformed")
        );
        let mut doc = serde_json::to_value(census(vec![holder("a", 1, 1, 0, 0)])).unwrap();
        doc["a_field_from_a_newer_agent"] = serde_json::json!(1);
        assert!(
            Census::from_json(doc.to_string().as_bytes()).is_ok(),
            "unknown fields are read past"
        );
    }
}
