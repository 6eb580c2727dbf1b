//! report.html: one self-contained page a person opens, in the conventions of the reports
//! people already like (criterion's, memray's): the verdict first, in a box with its key
//! figures, then the evidence (tables with their units, charts with how they were measured).
//!
//! The page is data ([`Page`], [`Section`], [`Block`]) that each command fills and this module
//! draws with maud, which escapes every string it interpolates: a census holder, a series name
//! or a URL that contains `<` or `&` is text, never markup. The one way in for raw markup is
//! [`Svg`], which only this crate's charts can make. Nothing is fetched: the styles are inline,
//! charts are inline SVG, there is no script, and a Content-Security-Policy forbids any load,
//! so a page that tried would say so in the browser's console (the cli's browser test reads it).

use crate::table::{Table, Tone};
use maud::{html, Markup, PreEscaped, DOCTYPE};

/// An SVG drawing, inline in the page. Made only by this crate's charts, from plotters, which
/// escapes the text it draws: the page trusts it as markup.
#[derive(Debug, Clone, PartialEq)]
pub struct Svg(String);

impl Svg {
    /// Markup this crate drew itself.
    #[cfg_attr(not(feature = "plot"), allow(dead_code))]
    pub(crate) fn drawn(markup: String) -> Svg {
        Svg(markup)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The verdict box: the answer in a word or two, one sentence, the key figures and what to do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub tone: Tone,
    /// "FAIL", "PASS", "CANNOT JUDGE", or for a report that does not judge, its main figure.
    pub answer: String,
    pub headline: String,
    /// The figures that carry the verdict, each with its unit: ("bytes/request", "7.12 kB ± 43 B").
    pub figures: Vec<(String, String)>,
    /// Sentences after the figures: which memory grows, what to do.
    pub text: Vec<String>,
}

/// One block of evidence.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Text(String),
    Table(Table),
    /// A chart and what it shows, with its units and how it was measured.
    Chart {
        svg: Svg,
        caption: String,
    },
    /// Facts as label and value: how it was measured (requests, warm-up, time).
    Facts(Vec<(String, String)>),
    /// Things the reader must know (a signal dropped, an early stop), set apart.
    Notes(Vec<String>),
}

/// A headed part of the page.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub title: String,
    pub blocks: Vec<Block>,
}

impl Section {
    pub fn new(title: impl Into<String>) -> Section {
        Section {
            title: title.into(),
            blocks: Vec::new(),
        }
    }

    pub fn text(mut self, text: impl Into<String>) -> Section {
        self.blocks.push(Block::Text(text.into()));
        self
    }

    pub fn table(mut self, table: Table) -> Section {
        self.blocks.push(Block::Table(table));
        self
    }

    pub fn chart(mut self, svg: Svg, caption: impl Into<String>) -> Section {
        self.blocks.push(Block::Chart {
            svg,
            caption: caption.into(),
        });
        self
    }

    pub fn facts(mut self, facts: Vec<(String, String)>) -> Section {
        self.blocks.push(Block::Facts(facts));
        self
    }

    /// Notes, when there are any.
    pub fn notes(mut self, notes: &[String]) -> Section {
        if !notes.is_empty() {
            self.blocks.push(Block::Notes(notes.to_vec()));
        }
        self
    }
}

/// A whole report page.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The command that wrote it, shown above the title: "leaklab scan".
    pub command: String,
    /// What was examined: a URL, a Prometheus server, a snapshot file.
    pub title: String,
    pub summary: Summary,
    pub sections: Vec<Section>,
}

impl Page {
    pub fn new(command: impl Into<String>, title: impl Into<String>, summary: Summary) -> Page {
        Page {
            command: command.into(),
            title: title.into(),
            summary,
            sections: Vec::new(),
        }
    }

    pub fn section(mut self, section: Section) -> Page {
        self.sections.push(section);
        self
    }

    /// The page as one HTML document.
    pub fn render(&self) -> String {
        let s = &self.summary;
        let contents = self.sections.len() >= 4;
        let charts = self
            .sections
            .iter()
            .flat_map(|s| &s.blocks)
            .any(|b| matches!(b, Block::Chart { .. }));
        let doc = html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    meta http-equiv="Content-Security-Policy" content=(CSP);
                    meta name="generator" content={ "leaklab " (VERSION) };
                    title { (s.answer) " · " (self.command) " " (self.title) }
                    style { (PreEscaped(CSS)) }
                }
                body {
                    header {
                        p.command { (self.command) }
                        h1 { (self.title) }
                    }
                    main {
                        section.summary.(tone_class(s.tone)) aria-label="verdict" {
                            p.answer { (s.answer) }
                            @if !s.headline.is_empty() { p.headline { (inline(&s.headline)) } }
                            @if !s.figures.is_empty() {
                                dl.figures {
                                    @for (label, value) in &s.figures { div { dt { (label) } dd { (value) } } }
                                }
                            }
                            @for t in &s.text { p { (inline(t)) } }
                        }
                        @if contents {
                            nav aria-label="contents" {
                                ol { @for (i, section) in self.sections.iter().enumerate() { li { a href={ "#s" (i + 1) } { (section.title) } } } }
                            }
                        }
                        @for (i, section) in self.sections.iter().enumerate() {
                            section id={ "s" (i + 1) } {
                                h2 { (section.title) }
                                @for block in &section.blocks { (draw(block)) }
                            }
                        }
                    }
                    footer {
                        p {
                            "Written by leaklab " (VERSION) ". Every figure is also in report.json beside this page"
                            @if charts { ", and each chart as an SVG and a PNG file" }
                            "."
                        }
                    }
                }
            }
        };
        doc.into_string()
    }
}

fn draw(block: &Block) -> Markup {
    match block {
        Block::Text(text) => html! { p { (inline(text)) } },
        Block::Table(table) => draw_table(table),
        Block::Chart { svg, caption } => html! {
            figure {
                (PreEscaped(svg.as_str()))
                figcaption { (inline(caption)) }
            }
        },
        Block::Facts(facts) => html! {
            dl.facts { @for (label, value) in facts { dt { (label) } dd { (inline(value)) } } }
        },
        Block::Notes(notes) => html! {
            ul.notes { @for n in notes { li { (inline(n)) } } }
        },
    }
}

fn draw_table(table: &Table) -> Markup {
    let class = |column: usize, tone: Tone| {
        let mut c = Vec::new();
        if table.numeric.contains(&column) {
            c.push("num");
        }
        if tone != Tone::Plain {
            c.push(tone_class(tone));
        }
        (!c.is_empty()).then(|| c.join(" "))
    };
    html! {
        div.table {
            table {
                @if let Some(caption) = &table.caption { caption { (inline(caption)) } }
                thead { tr { @for (i, h) in table.header.iter().enumerate() { th scope="col" class=[class(i, Tone::Plain)] { (h) } } } }
                tbody {
                    @for row in &table.rows {
                        tr {
                            @for (i, cell) in row.iter().enumerate() {
                                td class=[class(i, cell.tone)] {
                                    @if cell.text.contains('\n') {
                                        // A stack, a frame a line: each its own block, its
                                        // wrapped tail indented under it.
                                        @for line in cell.text.split('\n') {
                                            div.line { @if cell.code { code { (line) } } @else { (line) } }
                                        }
                                    } @else if cell.code {
                                        code { (cell.text) }
                                    } @else {
                                        (cell.text)
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Text with `code` in backticks, as the reports' sentences write commands and names (the
/// same sentence serves report.md): each backticked span in a fixed-width font, every part
/// escaped. An odd backtick leaves the text as it is.
fn inline(text: &str) -> Markup {
    let parts: Vec<&str> = text.split('`').collect();
    if parts.len().is_multiple_of(2) {
        return html! { (text) };
    }
    html! {
        @for (i, part) in parts.iter().enumerate() {
            @if i % 2 == 1 { code { (part) } } @else { (part) }
        }
    }
}

fn tone_class(tone: Tone) -> &'static str {
    match tone {
        Tone::Plain => "plain",
        Tone::Good => "good",
        Tone::Warn => "warn",
        Tone::Bad => "bad",
    }
}

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Nothing may be loaded: no script, no font, no image, no style sheet from anywhere. Inline
/// styles and inline SVG need no permission; `data:` images are allowed for charts that might
/// come as PNG one day.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:";

/// Laptop first (a column of at most 72 rem, tables that scroll sideways inside their box rather
/// than the page), then print: no backgrounds but the verdict's, nothing split across pages
/// that would read wrong split, colours kept where they carry meaning.
const CSS: &str = r#"
:root { --ink: #1c1917; --muted: #57534e; --rule: #e7e5e4; --head: #f5f5f4;
  --good: #166534; --good-bg: #f0fdf4; --good-line: #16a34a;
  --warn: #92400e; --warn-bg: #fffbeb; --warn-line: #d97706;
  --bad: #991b1b; --bad-bg: #fef2f2; --bad-line: #dc2626;
  --plain: #1e293b; --plain-bg: #f8fafc; --plain-line: #64748b; }
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body { margin: 0 auto; max-width: 72rem; padding: 1.5rem 1.5rem 3rem; color: var(--ink); background: #fff;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", "Liberation Sans", sans-serif; }
header .command { margin: 0; color: var(--muted); font-size: .85rem; letter-spacing: .04em; text-transform: uppercase; }
h1 { margin: .1rem 0 1rem; font-size: 1.5rem; line-height: 1.25; overflow-wrap: anywhere; }
h2 { margin: 2rem 0 .6rem; padding-bottom: .25rem; font-size: 1.2rem; border-bottom: 1px solid var(--rule); }
p { margin: .5rem 0; max-width: 60rem; }
code { font: .85em/1.4 ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace; overflow-wrap: anywhere; }
.summary { margin: 0 0 1.5rem; padding: 1rem 1.25rem; border: 1px solid; border-left-width: .5rem; border-radius: .35rem; }
.summary .answer { margin: 0; font-size: 1.6rem; font-weight: 700; letter-spacing: .02em; }
.summary .headline { margin: .2rem 0 .6rem; font-size: 1.05rem; font-weight: 600; }
.summary.good { color: var(--good); background: var(--good-bg); border-color: var(--good-line); }
.summary.warn { color: var(--warn); background: var(--warn-bg); border-color: var(--warn-line); }
.summary.bad { color: var(--bad); background: var(--bad-bg); border-color: var(--bad-line); }
.summary.plain { color: var(--plain); background: var(--plain-bg); border-color: var(--plain-line); }
.summary p:not(.answer):not(.headline) { color: var(--ink); }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(13rem, 1fr)); gap: .5rem 1.5rem; margin: .75rem 0; }
.figures div { min-width: 0; }
.figures dt { color: var(--muted); font-size: .8rem; text-transform: uppercase; letter-spacing: .03em; }
.figures dd { margin: 0; color: var(--ink); font-size: 1.05rem; font-weight: 600; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
nav ol { margin: 0 0 1rem; padding-left: 1.25rem; columns: 2 16rem; }
nav a { color: inherit; }
.table { overflow-x: auto; margin: .5rem 0 1rem; }
table { border-collapse: collapse; font-size: .88rem; min-width: 50%; }
caption { caption-side: bottom; text-align: left; padding-top: .35rem; color: var(--muted); font-size: .82rem; }
th, td { padding: .3rem .65rem; border-bottom: 1px solid var(--rule); text-align: left; vertical-align: top; }
th { background: var(--head); font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.good { color: var(--good); background: var(--good-bg); font-weight: 600; }
td.warn { color: var(--warn); background: var(--warn-bg); font-weight: 600; }
td.bad { color: var(--bad); background: var(--bad-bg); font-weight: 600; }
figure { margin: 1rem 0 1.5rem; max-width: 60rem; }
figure svg { display: block; width: 100%; height: auto; border: 1px solid var(--rule); }
figcaption { margin-top: .35rem; color: var(--muted); font-size: .82rem; }
.line { padding-left: 1.5em; text-indent: -1.5em; }
.line + .line { margin-top: .15rem; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; margin: .5rem 0; }
.facts dt { color: var(--muted); }
.facts dd { margin: 0; overflow-wrap: anywhere; }
.notes { padding: .6rem 1rem .6rem 2rem; background: var(--warn-bg); border-left: .25rem solid var(--warn-line); }
footer { margin-top: 3rem; padding-top: .5rem; border-top: 1px solid var(--rule); color: var(--muted); font-size: .8rem; }
@media print {
  @page { margin: 14mm; }
  body { max-width: none; padding: 0; font-size: 10pt; }
  nav { display: none; }
  .summary, td.good, td.warn, td.bad, .notes { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  .table { overflow: visible; }
  table { font-size: 8.5pt; }
  th { white-space: normal; }
  h2 { break-after: avoid; }
  .summary, figure, tr, .notes { break-inside: avoid; }
  figure { max-width: 100%; }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Cell;

    fn page(hostile: &str) -> Page {
        let table = Table::new(["holder", "bytes"])
            .numeric(&[1])
            .rows([[Cell::code(hostile), Cell::new("1.02 kB").tone(Tone::Bad)]])
            .caption(format!("held by {hostile}"));
        Page::new(
            "leaklab scan",
            format!("http://h/{hostile}"),
            Summary {
                tone: Tone::Bad,
                answer: "FAIL".into(),
                headline: hostile.into(),
                figures: vec![("series".into(), hostile.into())],
                text: vec![hostile.into()],
            },
        )
        .section(
            Section::new(hostile)
                .table(table)
                .facts(vec![(hostile.into(), hostile.into())])
                .notes(&[hostile.to_string()])
                .text(hostile),
        )
    }

    #[test]
    fn every_string_from_outside_is_text_never_markup() {
        let hostile = r#"<script>alert("x")</script> & <img src=x onerror=alert(1)> '"#;
        let html = page(hostile).render();
        assert!(
            !html.contains("<script") && !html.contains("<img"),
            "{html}"
        );
        let escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;img src=x onerror=alert(1)&gt; '";
        // The title, the header, the box (headline, figure, text), the section's title, the
        // table's cell and caption, the facts (label and value), the note and the text.
        assert_eq!(html.matches(escaped).count(), 12, "{html}");
    }

    #[test]
    fn the_verdict_comes_before_the_evidence_and_nothing_is_fetched() {
        let html = page("x").render();
        let (verdict, table) = (
            html.find("class=\"summary bad\"").unwrap(),
            html.find("<table>").unwrap(),
        );
        assert!(verdict < table);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("Content-Security-Policy") && html.contains("default-src 'none'"));
        for fetch in [
            "src=\"http",
            "href=\"http",
            "url(",
            "@import",
            "<script",
            "<link",
        ] {
            assert!(!html.contains(fetch), "{fetch} in the page");
        }
        assert!(
            html.contains("<td class=\"num bad\">1.02 kB</td>"),
            "{html}"
        );
        assert!(html.contains("<td><code>x</code></td>"), "{html}");
    }

    #[test]
    fn a_cell_of_several_lines_keeps_them_apart() {
        let table = Table::new(["called from"]).rows([[Cell::code("a.py:1 in f\nb.py:2 in g")]]);
        let html = Page::new("c", "t", Summary::default())
            .section(Section::new("s").table(table))
            .render();
        assert!(html.contains("<td><div class=\"line\"><code>a.py:1 in f</code></div><div class=\"line\"><code>b.py:2 in g</code></div></td>"), "{html}");
    }

    #[test]
    fn backticks_mark_code_in_sentences_and_an_odd_one_is_left_alone() {
        let page = |text: &str| {
            Page::new("c", "t", Summary::default())
                .section(Section::new("s").text(text))
                .render()
        };
        assert!(page("run `leaklab snapshot explain <f>` for more")
            .contains("<p>run <code>leaklab snapshot explain &lt;f&gt;</code> for more</p>"));
        assert!(page("a ` alone").contains("<p>a ` alone</p>"));
    }

    #[test]
    fn long_pages_get_contents_and_short_ones_do_not() {
        let mut long = Page::new("c", "t", Summary::default());
        for i in 0..4 {
            long = long.section(Section::new(format!("part {i}")));
        }
        assert!(long.render().contains("<nav aria-label=\"contents\">"));
        assert!(!page("x").render().contains("<nav"));
    }
}
