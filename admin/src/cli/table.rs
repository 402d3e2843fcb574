//! Plain-text tables for a terminal: a header, columns padded to their
//! widest cell, numbers right-aligned.

/// A table being filled row by row.
#[derive(Debug)]
pub(crate) struct Table {
    header: Vec<&'static str>,
    /// Which columns are right-aligned (numbers).
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns named `header`; a name starting with `>` is right-aligned
    /// (the `>` is not shown).
    pub(crate) fn new(header: &[&'static str]) -> Table {
        Table {
            right: header.iter().map(|h| h.starts_with('>')).collect(),
            header: header.iter().map(|h| h.trim_start_matches('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, `empty` when it has no rows.
    pub(crate) fn render(&self, empty: &str) -> String {
        if self.rows.is_empty() {
            return format!("{empty}\n");
        }
        let width = |i: usize| {
            self.rows
                .iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .chain([self.header[i].len()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let mut out = String::new();
        let header: Vec<String> = self.header.iter().map(|h| h.to_uppercase()).collect();
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = cells.get(i).map_or("", String::as_str);
                let pad = w.saturating_sub(cell.chars().count());
                if i > 0 {
                    line.push_str("  ");
                }
                if self.right[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `n` bytes in binary units (`1.5 MiB`).
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_and_numbers_right_aligned() {
        let mut t = Table::new(&["name", ">ready"]);
        t.row(vec!["orders".into(), "7".into()]);
        t.row(vec!["q".into(), "1200".into()]);
        assert_eq!(
            t.render("none"),
            "NAME    READY\norders      7\nq        1200\n"
        );
        assert_eq!(Table::new(&["a"]).render("no queues"), "no queues\n");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}
