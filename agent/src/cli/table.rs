//! The one table renderer of the commands (`status`, `status --cluster`,
//! `held`, `plan`, `audit`): a column is as wide as its widest cell counted
//! in characters (not bytes: "é" or "マ" is one), columns two spaces apart,
//! no blank at the end of a line, and every cell shown through
//! [`crate::text::shown`] (ids and names are others' text).

/// A header and rows of cells, rendered by [`Table::render`].
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    min_widths: Vec<usize>,
}

impl Table {
    pub fn new<const N: usize>(header: [&str; N]) -> Table {
        Table { header: header.map(String::from).to_vec(), rows: Vec::new(), min_widths: Vec::new() }
    }

    /// Columns at least this wide (`audit --follow` prints batch after
    /// batch, which then line up in the common case).
    pub fn min_widths(mut self, widths: &[usize]) -> Table {
        self.min_widths = widths.to_vec();
        self
    }

    /// Adds a row: one cell per column (missing ones are empty).
    pub fn row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(|cell| crate::text::shown(cell.as_ref()).into_owned()).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The header line, then one line per row.
    pub fn render(&self) -> String {
        self.lines(true)
    }

    /// The rows alone, as wide as [`Table::render`] makes them (a later
    /// batch of `audit --follow`, under the header already printed).
    pub fn render_rows(&self) -> String {
        self.lines(false)
    }

    fn lines(&self, with_header: bool) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                let cells = std::iter::once(&self.header).chain(&self.rows).filter_map(|row| row.get(c));
                let widest = cells.map(|cell| cell.chars().count()).max().unwrap_or(0);
                widest.max(self.min_widths.get(c).copied().unwrap_or(0))
            })
            .collect();
        let rows: Vec<&Vec<String>> = if with_header {
            std::iter::once(&self.header).chain(&self.rows).collect()
        } else {
            self.rows.iter().collect()
        };
        let mut out = String::new();
        for row in rows {
            let mut line = String::new();
            for (c, width) in widths.iter().enumerate() {
                let cell = row.get(c).map_or("", String::as_str);
                if c > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                let shown = cell.chars().count();
                line.extend(std::iter::repeat_n(' ', width.saturating_sub(shown)));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The character (not byte) where `cell` starts in `line`.
    fn at(line: &str, cell: &str) -> usize {
        line[..line.find(cell).unwrap_or_else(|| panic!("{cell:?} not in {line:?}"))].chars().count()
    }

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_in_characters() {
        let mut table = Table::new(["MINION", "MASTER", "STATE"]);
        table.row(["wéb01", "mästér-b", "accepted"]);
        table.row(["ウェブ02", "master-c", "rejected"]);
        table.row(["db01", "m", ""]);
        let text = table.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        for (line, master, state) in [(lines[1], "mästér-b", "accepted"), (lines[2], "master-c", "rejected")] {
            assert_eq!(at(line, master), at(lines[0], "MASTER"), "{text}");
            assert_eq!(at(line, state), at(lines[0], "STATE"), "{text}");
        }
        assert_eq!(lines[0], "MINION  MASTER    STATE");
        assert_eq!(lines[3], "db01    m", "no blank at the end of a line");
    }

    #[test]
    fn cells_are_shown_safely_and_minimum_widths_hold() {
        let mut table = Table::new(["ID", "WHY"]).min_widths(&[6, 0]);
        table.row(["evil\n\u{1b}[8m", "x"]);
        let text = table.render();
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        assert_eq!(text.lines().count(), 2, "{text}");
        let mut short = Table::new(["ID", "WHY"]).min_widths(&[6, 0]);
        short.row(["a", "b"]);
        assert_eq!(short.render(), "ID      WHY\na       b\n");
        assert_eq!(short.render_rows(), "a       b\n");
    }
}
