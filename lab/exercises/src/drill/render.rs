//! One handler per incident, rendered from one template (`lab/exercises/incidents/handler.rs`).
//!
//! A template line that differs between incidents ends in a tag: `// LEAK(cause) name: why` puts
//! it in incident `name`'s handler only, `// FIX(cause) name: why` in every handler but that
//! one (the leak's fixed twin, beside it). Untagged lines are in every handler, `//#` lines
//! (notes on the template) in none. The Python drill's template (`incidents/service.py`) is
//! rendered the same way, its tags and notes in Python's comments (`# LEAK(…)`, `##`). The handler with no incident has every fix in: it is the
//! reference fix of every incident, and the bounded-cache incident as shipped.
//!
//! Std only: `build.rs` includes this file to render the originals the tests compile.

/// The template, as compiled in.
pub const TEMPLATE: &str = include_str!("../../incidents/handler.rs");

/// A tag at the end of a template line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag<'a> {
    /// `LEAK` (in the incident's handler only) or `FIX` (in every other one).
    pub leak: bool,
    pub cause: &'a str,
    pub incident: &'a str,
    pub why: &'a str,
}

/// The tag of `line` and where its comment starts, if it has one.
pub fn tag(line: &str) -> Option<(usize, Tag<'_>)> {
    [
        ("// LEAK(", true),
        ("// FIX(", false),
        ("# LEAK(", true),
        ("# FIX(", false),
    ]
    .into_iter()
    .find_map(|(marker, leak)| {
        let at = line.find(marker)?;
        let (cause, rest) = line[at + marker.len()..].split_once(") ")?;
        let (incident, why) = rest.split_once(':').unwrap_or((rest, ""));
        Some((
            at,
            Tag {
                leak,
                cause,
                incident: incident.trim(),
                why: why.trim(),
            },
        ))
    })
}

/// One line of a rendered handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    /// The code, without its tag.
    pub code: &'a str,
    pub tag: Option<Tag<'a>>,
}

/// A handler: `incident`'s, or with `None` the one with every fix in.
pub fn render<'a>(template: &'a str, incident: Option<&str>) -> Vec<Line<'a>> {
    template
        .lines()
        .filter(|l| !l.starts_with("//#") && !l.starts_with("##"))
        .filter_map(|l| match tag(l) {
            None => Some(Line { code: l, tag: None }),
            Some((at, t)) => (t.leak == (Some(t.incident) == incident)).then(|| Line {
                code: l[..at].trim_end(),
                tag: Some(t),
            }),
        })
        .collect()
}

/// The learner's copy: no tags, nothing that gives the incident away.
pub fn learner_text(lines: &[Line]) -> String {
    lines.iter().map(|l| format!("{}\n", l.code)).collect()
}

/// The copy the library compiles with `include!`, line for line the learner's, tags kept (inner
/// doc comments are not allowed there, so the `//!` header becomes plain comments).
pub fn included_text(lines: &[Line]) -> String {
    lines
        .iter()
        .map(|l| {
            let code = l
                .code
                .strip_prefix("//!")
                .map_or(l.code.to_string(), |rest| format!("//{rest}"));
            match l.tag {
                Some(t) => {
                    let why = if t.why.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", t.why)
                    };
                    format!(
                        "{code} // {}({}) {}{why}\n",
                        if t.leak { "LEAK" } else { "FIX" },
                        t.cause,
                        t.incident
                    )
                }
                None => format!("{code}\n"),
            }
        })
        .collect()
}

/// The incidents the template's tags name, in order of first appearance.
pub fn tagged_incidents(template: &str) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for (_, t) in template.lines().filter_map(tag) {
        if !names.contains(&t.incident) {
            names.push(t.incident);
        }
    }
    names
}

/// An incident's name as a Rust module name (`error-path` → `error_path`).
pub fn module_name(incident: &str) -> String {
    incident.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "//! doc\n//# note\nlet a = 1;\nkeep(a); // FIX(refs) x: the fix\nkeep(a.clone()); // LEAK(refs) x: the leak\nother(); // LEAK(cache) y\nbound(); // FIX(cache) y\n";

    #[test]
    fn each_incident_gets_its_leak_and_every_other_fix() {
        let x: Vec<&str> = render(T, Some("x")).iter().map(|l| l.code).collect();
        assert_eq!(x, ["//! doc", "let a = 1;", "keep(a.clone());", "bound();"]);
        let y: Vec<&str> = render(T, Some("y")).iter().map(|l| l.code).collect();
        assert_eq!(y, ["//! doc", "let a = 1;", "keep(a);", "other();"]);
        let fixed: Vec<&str> = render(T, None).iter().map(|l| l.code).collect();
        assert_eq!(fixed, ["//! doc", "let a = 1;", "keep(a);", "bound();"]);
        assert_eq!(tagged_incidents(T), ["x", "y"]);
    }

    #[test]
    fn the_learners_copy_has_no_tags_and_the_included_one_keeps_them_line_for_line() {
        let lines = render(T, Some("x"));
        let learner = learner_text(&lines);
        assert!(
            !learner.contains("LEAK") && !learner.contains("FIX") && !learner.contains("note"),
            "{learner}"
        );
        let included = included_text(&lines);
        assert_eq!(included.lines().count(), learner.lines().count());
        assert!(
            included.starts_with("// doc\n")
                && included.contains("keep(a.clone()); // LEAK(refs) x: the leak"),
            "{included}"
        );
    }

    #[test]
    fn tags_parse_with_or_without_a_reason() {
        assert_eq!(
            tag("a(); // LEAK(graph) g: why")
                .map(|(at, t)| (at, t.leak, t.cause, t.incident, t.why)),
            Some((5, true, "graph", "g", "why"))
        );
        assert_eq!(
            tag("b(); // FIX(graph) g").map(|(_, t)| (t.leak, t.incident, t.why)),
            Some((false, "g", ""))
        );
        assert_eq!(tag("c(); // a comment"), None);
        assert_eq!(
            tag("d()  # FIX(refs) h: why").map(|(at, t)| (at, t.leak, t.incident)),
            Some((5, false, "h")),
            "Python's comments too"
        );
    }
}
