//! What the command line prints for people: aligned tables with headers (comfy-table) and
//! colour, both decided the way every well-behaved tool decides them (anstream): colour only
//! when stdout is a terminal that takes it, never with `NO_COLOR` set, always with
//! `CLICOLOR_FORCE`. Every cell is text a child, a parent, a config or a registry may control,
//! so each is escaped before it reaches the table.

use anstyle::{AnsiColor, Style};
use comfy_table::{
    Attribute, Cell, CellAlignment, Color, ColumnConstraint, ContentArrangement, Row, Table, Width,
};

/// Whether what goes to stdout may carry colour.
pub(crate) fn colour() -> bool {
    anstream::AutoStream::choice(&std::io::stdout()) != anstream::ColorChoice::Never
}

/// `text` in `style` when stdout takes colour, else as it is.
pub(crate) fn paint(text: &str, style: Style) -> String {
    if colour() {
        format!("{style}{text}{style:#}")
    } else {
        text.to_owned()
    }
}

/// The style of a verdict word: `OK` green, `FAIL` red, `warning` yellow.
pub(crate) fn verdict(word: &str) -> String {
    let colour = match word {
        "OK" => AnsiColor::Green,
        "FAIL" => AnsiColor::Red,
        _ => AnsiColor::Yellow,
    };
    paint(word, Style::new().bold().fg_color(Some(colour.into())))
}

/// The narrowest a free-text column gets on a narrow terminal.
const MIN_TEXT: u16 = 12;

/// How a column is laid out.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Col {
    /// Never wrapped or cut (ids, names: they are copied into other commands).
    Whole,
    /// Free text: wrapped on a terminal too narrow for it, and never wider than this many
    /// columns anywhere, so one long value cannot push the others off the screen.
    Text(u16),
    /// Numbers: right-aligned, never cut.
    Number,
}

/// A table under construction: a header row, then one row per item.
pub(crate) struct Grid {
    table: Table,
    colour: bool,
}

impl Grid {
    pub(crate) fn new(columns: &[(&str, Col)]) -> Grid {
        let colour = colour();
        let mut table = Table::new();
        table.load_style(comfy_table::presets::NOTHING);
        table.set_content_arrangement(ContentArrangement::Dynamic);
        if colour {
            // Our decision (NO_COLOR, CLICOLOR_FORCE), not comfy-table's look at the tty.
            table.enforce_styling();
            table.style_text_only();
        }
        let header: Vec<Cell> = columns
            .iter()
            .map(|(name, _)| {
                let cell = Cell::new(name);
                if colour {
                    cell.add_attribute(Attribute::Bold)
                } else {
                    cell
                }
            })
            .collect();
        table.set_header(header);
        for (i, (name, col)) in columns.iter().enumerate() {
            let Some(column) = table.column_mut(i) else {
                continue;
            };
            // No left padding: the first column starts at the margin, two spaces between.
            column.set_padding((0, 2));
            match col {
                Col::Whole => {
                    column.set_constraint(ColumnConstraint::ContentWidth);
                }
                Col::Text(max) => {
                    // Never squeezed below its header (or a readable width) on a narrow
                    // terminal: the line runs long rather than one letter a line.
                    let header = u16::try_from(name.len()).unwrap_or(u16::MAX);
                    let lower = header.max(MIN_TEXT).min(*max);
                    column.set_constraint(ColumnConstraint::Boundaries {
                        lower: Width::Fixed(lower.saturating_add(2)),
                        upper: Width::Fixed(max.saturating_add(2)),
                    });
                }
                Col::Number => {
                    column.set_constraint(ColumnConstraint::ContentWidth);
                    column.set_cell_alignment(CellAlignment::Right);
                }
            }
        }
        Grid { table, colour }
    }

    /// One row of cells, each escaped for the terminal.
    pub(crate) fn row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.styled_row(cells.into_iter().map(|c| (c, None)));
    }

    /// A row whose cells may carry a colour (shown only when stdout takes colour).
    pub(crate) fn styled_row<S: AsRef<str>>(
        &mut self,
        cells: impl IntoIterator<Item = (S, Option<Color>)>,
    ) {
        let row: Vec<Cell> = cells
            .into_iter()
            .map(|(text, fg)| {
                let cell = Cell::new(crate::trace::escape_controls(text.as_ref()));
                match fg {
                    Some(fg) if self.colour => cell.fg(fg),
                    _ => cell,
                }
            })
            .collect();
        self.table.add_row(Row::from(row));
    }

    /// The table's lines, trailing blanks trimmed.
    pub(crate) fn print(&self) -> std::io::Result<()> {
        for line in self.table.lines() {
            outln!("{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// The colour a run's or a session's state is shown in.
pub(crate) fn state_colour(state: &str) -> Option<Color> {
    match state {
        "running" | "attached" => Some(Color::Cyan),
        "idle" | "completed" | "detached" => Some(Color::Green),
        "failed" | "error" => Some(Color::Red),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(grid: &Grid) -> Vec<String> {
        grid.table
            .lines()
            .map(|l| l.trim_end().to_owned())
            .collect()
    }

    #[test]
    fn columns_line_up_under_their_headers() {
        let mut g = Grid::new(&[
            ("NAME", Col::Whole),
            ("N", Col::Number),
            ("TEXT", Col::Text(10)),
        ]);
        g.row(["a", "7", "short"]);
        g.row(["longer-name", "12345", "x"]);
        let l = lines(&g);
        assert_eq!(l[0].find('N').unwrap(), 0, "{l:?}");
        let text_at = l[0].find("TEXT").unwrap();
        assert_eq!(l[1].find("short"), Some(text_at), "{l:?}");
        // Numbers end where their column ends.
        assert_eq!(
            l[1].find('7').unwrap() + 1,
            l[2].find("12345").unwrap() + 5,
            "{l:?}"
        );
    }

    #[test]
    fn long_text_wraps_inside_its_column_and_controls_are_escaped() {
        let mut g = Grid::new(&[
            ("ID", Col::Whole),
            ("LABEL", Col::Text(8)),
            ("END", Col::Whole),
        ]);
        g.row(["one", "a label far longer than eight", "z"]);
        g.row(["two", "b\x07", "y"]);
        let l = lines(&g);
        let end_at = l[0].find("END").unwrap();
        assert!(end_at <= "ID".len() + 2 + 8 + 2 + 2, "{l:?}");
        assert!(
            l.iter().all(|line| !line.chars().any(char::is_control)),
            "{l:?}"
        );
        assert!(l.iter().any(|line| line.contains(r"b\u{7}")), "{l:?}");
        assert!(l.len() > 3, "the long label wrapped: {l:?}");
    }
}
