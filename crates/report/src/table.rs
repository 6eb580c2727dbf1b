//! Tables: one set of rows, written three ways. The terminal gets columns padded to their
//! widest cell ([`aligned_table`]), report.md a markdown table ([`markdown_table`]) and
//! report.html the same rows with each verdict's colour ([`Table`], drawn by the page).

use serde::{Deserialize, Serialize};

/// How good a figure is, for the page's colours: a leak or a failure is `Bad`, a plateau or a
/// likely pass `Warn`, a flat series or a pass `Good`; the rest `Plain`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tone {
    #[default]
    Plain,
    Good,
    Warn,
    Bad,
}

/// One cell: its text (the same in every format) and how the page shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cell {
    pub text: String,
    pub tone: Tone,
    /// Code, a file:line or a Python name: set in a fixed-width font on the page.
    pub code: bool,
}

impl Cell {
    pub fn new(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            ..Cell::default()
        }
    }

    /// A cell in a fixed-width font on the page (in backticks in markdown where the caller
    /// writes them).
    pub fn code(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            code: true,
            ..Cell::default()
        }
    }

    pub fn tone(mut self, tone: impl Into<Tone>) -> Cell {
        self.tone = tone.into();
        self
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell::new(text)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::new(text)
    }
}

impl AsRef<str> for Cell {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

/// A table as data: the header, the rows, which columns hold numbers (right-aligned on the
/// page) and an optional caption (what the figures are and how they were measured).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    /// Columns of figures, right-aligned on the page.
    pub numeric: Vec<usize>,
    pub caption: Option<String>,
}

impl Table {
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Table {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            ..Table::default()
        }
    }

    pub fn rows<R: IntoIterator<Item = C>, C: Into<Cell>>(
        mut self,
        rows: impl IntoIterator<Item = R>,
    ) -> Table {
        self.rows.extend(
            rows.into_iter()
                .map(|r| r.into_iter().map(Into::into).collect()),
        );
        self
    }

    pub fn numeric(mut self, columns: &[usize]) -> Table {
        self.numeric = columns.to_vec();
        self
    }

    pub fn caption(mut self, caption: impl Into<String>) -> Table {
        self.caption = Some(caption.into());
        self
    }

    /// For the terminal ([`aligned_table`]).
    pub fn text(&self) -> String {
        aligned_table(&self.header, &self.rows)
    }

    /// For report.md ([`markdown_table`]).
    pub fn markdown(&self) -> String {
        markdown_table(&self.header, &self.rows)
    }
}

/// A table for the terminal: columns padded to their widest cell, a rule under the header,
/// two spaces between columns, no trailing spaces (run-lab's verdicts, scan's series, the
/// fleet's groups).
pub fn aligned_table<H: AsRef<str>, C: AsRef<str>, R: AsRef<[C]>>(
    header: &[H],
    rows: &[R],
) -> String {
    let width = |s: &str| s.chars().count();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| width(r.as_ref()[c].as_ref()))
                .chain([width(header[c].as_ref())])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![
        line(header.iter().map(AsRef::as_ref).collect()),
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  "),
    ];
    out.extend(
        rows.iter()
            .map(|r| line(r.as_ref().iter().map(AsRef::as_ref).collect())),
    );
    out.join("\n")
}

/// The same table in markdown, for report.md.
pub fn markdown_table<H: AsRef<str>, C: AsRef<str>, R: AsRef<[C]>>(
    header: &[H],
    rows: &[R],
) -> String {
    let cells = |r: &mut dyn Iterator<Item = &str>| r.collect::<Vec<_>>().join(" | ");
    let mut md = format!(
        "| {} |\n|{}\n",
        cells(&mut header.iter().map(AsRef::as_ref)),
        "---|".repeat(header.len())
    );
    for r in rows {
        md.push_str(&format!(
            "| {} |\n",
            cells(&mut r.as_ref().iter().map(AsRef::as_ref))
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<[String; 3]> {
        vec![
            ["graph-leaky".into(), "leak".into(), "81.92 kB ± 0 B".into()],
            ["baseline".into(), "flat".into(), "0 B ± 0 B".into()],
        ]
    }

    #[test]
    fn an_aligned_table_pads_every_column_to_its_widest_cell_and_rules_the_header() {
        let table = aligned_table(&["variant", "verdict", "bytes/request"], &rows());
        let expected = "\
variant      verdict  bytes/request
-----------  -------  --------------
graph-leaky  leak     81.92 kB ± 0 B
baseline     flat     0 B ± 0 B";
        assert_eq!(table, expected);
        assert!(
            table.lines().all(|l| !l.ends_with(' ')),
            "no trailing spaces"
        );
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        // "±" and "→" are two and three bytes: padding by bytes would misalign the columns.
        let table = aligned_table(&["a", "b"], &[["± → ±", "x"], ["abcde", "y"]]);
        let second_column: Vec<Option<char>> = table.lines().map(|l| l.chars().nth(7)).collect();
        assert_eq!(
            second_column,
            [Some('b'), Some('-'), Some('x'), Some('y')],
            "{table}"
        );
    }

    #[test]
    fn a_header_wider_than_every_cell_sets_the_width_and_an_empty_table_is_its_header() {
        let table = aligned_table(&["a very long header", "b"], &[["x", "y"]]);
        assert_eq!(table.lines().nth(2).unwrap(), "x                   y");
        let empty: Vec<[String; 2]> = Vec::new();
        assert_eq!(aligned_table(&["one", "two"], &empty), "one  two\n---  ---");
    }

    #[test]
    fn a_markdown_table_has_a_rule_per_column_and_a_line_per_row() {
        let md = markdown_table(&["variant", "verdict", "bytes/request"], &rows());
        assert_eq!(md, "| variant | verdict | bytes/request |\n|---|---|---|\n| graph-leaky | leak | 81.92 kB ± 0 B |\n| baseline | flat | 0 B ± 0 B |\n");
    }

    #[test]
    fn a_table_writes_the_same_cells_as_the_functions_and_keeps_tones_out_of_the_text() {
        let table = Table::new(["variant", "verdict", "bytes/request"]).rows(
            rows()
                .into_iter()
                .map(|[a, b, c]| [Cell::new(a), Cell::new(b).tone(Tone::Bad), Cell::code(c)]),
        );
        assert_eq!(
            table.text(),
            aligned_table(&["variant", "verdict", "bytes/request"], &rows())
        );
        assert_eq!(
            table.markdown(),
            markdown_table(&["variant", "verdict", "bytes/request"], &rows())
        );
        assert_eq!(table.rows[0][1].tone, Tone::Bad);
    }
}
