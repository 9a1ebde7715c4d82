"""Tables that fit: a rich Table that never splits a name, address, instance type or price mid-word, at any
width and when piped, leaving optional columns out instead; and the colours every view shares.

`FitTable` keeps every non-prose cell whole (`no_wrap` with a `min_width` of its longest cell); when that does not
fit the width (the terminal, COLUMNS, or rich's 80 when piped) it leaves out optional columns in the order each
`Column.drop` gives, naming them in the caption, and a `Column.beneath` column goes on a line of its own under its
row instead (status's autostop and TTL at 80 columns). A prose cell folds between words and never splits a word of
up to `PROSE_MIN` characters. A column is never narrowed below that (rich's own last resort would narrow one to
nothing and leave it out unsaid); when even the columns that always stay do not fit, each row becomes a block of its
own, a cell a line, so every column is shown, beneath its row, or named in the caption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.box import Box
    from rich.console import JustifyMethod
    from rich.padding import PaddingDimensions
    from rich.style import StyleType
    from typing_extensions import Unpack

Cell = str | Text  # a table's cell: plain text, or rich Text with its styles


STYLE = {"ok": "green", "ready": "green", "interrupted": "yellow",
          "changed": "cyan", "unchanged": "green", "failed": "red", "unreachable": "red", "lost": "red",
          "running": "yellow", "rebooting": "magenta", "reboot": "magenta", "waiting": "dim"}


@dataclass(frozen=True)
class Column:
    """A column of a FitTable. `drop`: when the table is too wide, columns go highest first (0: always
    shown). `prose`: free text that may wrap between words; every other cell is never split."""


    header: str
    justify: str = "left"
    drop: int = 0
    prose: bool = False
    beneath: bool = False  # once left out, its cell goes on a line of its own under the row (`header: cell`)


PROSE_MIN = 16  # a prose word up to this long is never split; longer ones (paths, URLs, reasons) fold


class TableOptions(TypedDict, total=False):
    """What a FitTable passes on to rich's Table (the views use these)."""

    title_justify: JustifyMethod
    title_style: StyleType
    box: Box | None
    collapse_padding: bool
    pad_edge: bool
    padding: PaddingDimensions
    show_edge: bool


class FitTable:
    """A rich Table that never splits a name, address, instance type or price mid-word, at any width
    and when piped (`gpuprov gpus | grep p4d.24xlarge` finds the row): those cells are kept whole, and
    when they do not fit, optional columns are left out (highest `drop` first), as the caption says."""


    def __init__(self, columns: list[Column], title: str | None = None, **table_kw: Unpack[TableOptions]) -> None:
        self.columns = columns
        self.title = title
        self.table_kw = table_kw
        self.rows: list[tuple[tuple[Cell, ...], bool]] = []


    def add_row(self, *cells: Cell, end_section: bool = False) -> None:
        self.rows.append((cells, end_section))


    def _width(self, i: int) -> int:
        """Column i's narrowest width: a whole cell for most, the longest word for prose."""
        cells = [self.columns[i].header, *(plain(cells[i]) for cells, _ in self.rows)]
        if self.columns[i].prose:  # folds a longer word rather than push the names off the line
            return min(max((cell_len(word) for cell in cells for word in cell.split()), default=1), PROSE_MIN)
        return max(cell_len(cell) for cell in cells)


    def table(self, shown: list[int]) -> Table:
        beneath = [i for i, c in enumerate(self.columns) if i not in shown and c.beneath]
        dropped = [c.header for i, c in enumerate(self.columns) if i not in shown and i not in beneath]
        caption = f"left out at this width: {', '.join(dropped)} (wider terminal, or --json)" if dropped else None
        under = next((i for i in shown if self.columns[i].prose), None)  # where a line beneath a row goes
        table = Table(title=self.title, caption=caption, caption_justify="left", **self.table_kw)
        # rich ignores `justify` on an overflow="ignore" column, so right-aligned cells are padded here
        right = {i: self._width(i) for i in shown if self.columns[i].justify == "right" and not self.columns[i].prose}
        for i in shown:
            col = self.columns[i]
            header = rjust(col.header, right[i]) if i in right else col.header
            table.add_column(header, justify=col.justify, no_wrap=not col.prose,  # type: ignore[arg-type]
                             overflow="fold" if col.prose else "ignore",
                             min_width=self._width(i))  # prose: its longest word (up to PROSE_MIN) stays whole
        for cells, end_section in self.rows:
            extra = [f"{self.columns[i].header}: {plain(cells[i])}" for i in beneath if plain(cells[i]).strip()]
            table.add_row(*(rjust(cells[i], right[i]) if i in right else cells[i] for i in shown),
                          end_section=end_section and not (extra and under is not None))
            if extra and under is not None:
                table.add_row(*("; ".join(extra) if i == under else "" for i in shown), end_section=end_section)
        return table


    def fitted(self, console: Console, options: ConsoleOptions) -> Table | Group:
        shown = list(range(len(self.columns)))
        while True:
            table = self.table(shown)
            if self._fits(table, shown, console, options):
                return table
            optional = [i for i in shown if self.columns[i].drop]
            if not optional:
                return self.blocks()
            shown.remove(max(optional, key=lambda i: self.columns[i].drop))


    def _fits(self, table: Table, shown: list[int], console: Console, options: ConsoleOptions) -> bool:
        """Every shown column at least its narrowest (a whole cell; a prose column's longest word) within the width.
        rich's own arithmetic does not say so: as a last resort it narrows every column evenly, and a column it
        narrows to nothing is left out of the table without a word."""
        narrowest = [self._width(i) + table._get_padding_width(k) for k, i in enumerate(shown)]
        if sum(narrowest) + table._extra_width > options.max_width:
            return False
        # the widths rich will render it at (its column arithmetic can overshoot the narrowest by a cell or two)
        widths = table._calculate_column_widths(console, options.update_width(options.max_width - table._extra_width))
        return sum(widths) + table._extra_width <= options.max_width and all(
            width >= least for width, least in zip(widths, narrowest, strict=True))


    def blocks(self) -> Group:
        """Too narrow for even the columns that always stay: one row per block, its first cell on a line and each
        other cell beneath it as `header: cell`, so no column is ever left out unsaid."""
        parts: list[Text | Table] = [Text(self.title, style=self.table_kw.get("title_style") or "")] if self.title else []
        for cells, _ in self.rows:
            block = Table.grid(padding=(0, 1, 0, 0))
            block.add_column(no_wrap=True)
            block.add_column(overflow="fold")  # a long reason wraps beside its header, not under it
            for column, cell in zip(self.columns[1:], cells[1:], strict=True):
                if plain(cell).strip():
                    block.add_row(f"  {column.header}:", cell)
            parts.extend([Text(), Text.assemble(cells[0]), block])
        return Group(*parts)


    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(console, options)


    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.fitted(console, options))


def rjust(cell: Cell, width: int) -> Cell:
    pad = width - cell_len(plain(cell))
    if pad <= 0:
        return cell
    return Text(" " * pad) + cell if isinstance(cell, Text) else " " * pad + str(cell)


def plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def plural(count: int, word: str) -> str:
    """`1 GPU`, `8 GPUs`, `1 resource`, `5 resources`."""
    return f"{count} {word}" + ("" if count == 1 else "s")


def price_text(value: float | None) -> str:
    return f"${value:,.2f}/h" if value is not None else "n/a"
