"""HTML page → plain text, with the standard library's ``html.parser`` (deterministic, no dependencies).

What is kept: paragraphs, headings, list items, definition terms, table rows and ``pre`` blocks, each as its
own line (``pre`` blocks keep their inner line breaks and indentation; table cells are joined with `` | ``).
What is dropped: ``head``, scripts, styles, forms, inline SVG, the ``nav``/``header``/``footer`` elements and
the navigation chrome of the documentation sites we ship (menus, search boxes, tables of contents,
prev/next bars), recognised by their CSS classes. Whitespace inside a line collapses to one space.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Elements whose whole content is not prose.
SKIP_TAGS = _names(
    "head script style noscript template nav header footer form select button textarea svg math iframe object"
)
# Navigation chrome by CSS class: SQLite's menus/tagline/search box/table of contents, DocBook's (PostgreSQL)
# prev/next bars and tables of contents, and the usual names other generators use.
SKIP_CLASSES = _names(
    "menu mainmenu submenu searchmenu tagline fancy_toc toc navheader navfooter breadcrumb "
    "breadcrumbs navigation sidebar-nav skip-link"
)
# Elements that start and end a line of their own.
BLOCK_TAGS = _names(
    "p div h1 h2 h3 h4 h5 h6 li dt dd dl ul ol tr table thead tbody tfoot caption blockquote section "
    "article main aside figure figcaption address center hr br title body html"
)
CELL_TAGS = frozenset({"td", "th"})
# HTML lets these close implicitly (no end tag), so a class match on them could swallow the rest of the page.
IMPLICIT_END_TAGS = frozenset({"li", "p", "td", "th", "tr", "dt", "dd", "option", "thead", "tbody", "tfoot"})
VOID_TAGS = _names("area base br col embed hr img input link meta param source track wbr")
CELL_SEP = " | "
_SPACES = re.compile(r"\s+")


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self._line: list[str] = []  # text pieces of the line being built
        self._pre: list[str] | None = None  # raw text of the open <pre> block, if any
        self._pre_depth = 0
        self._skip_tag: str | None = None  # tag of the element being skipped and its nesting depth
        self._skip_depth = 0
        self._row_cells = 0  # cells already seen in the current table row

    # -- skipping -----------------------------------------------------------------------------------------
    def _starts_skip(self, tag: str, attrs: list[tuple[str, str | None]]) -> bool:
        if tag in SKIP_TAGS:
            return True
        if tag in IMPLICIT_END_TAGS or tag in VOID_TAGS:
            return False
        for name, value in attrs:
            if name == "class" and value and SKIP_CLASSES.intersection(value.split()):
                return True
        return False

    # -- line building ------------------------------------------------------------------------------------
    def _flush(self) -> None:
        line = _SPACES.sub(" ", "".join(self._line)).strip()
        if line:
            self.lines.append(line)
        self._line = []

    def _flush_pre(self) -> None:
        assert self._pre is not None
        rows = [row.rstrip() for row in "".join(self._pre).expandtabs(8).split("\n")]
        while rows and not rows[0]:
            rows.pop(0)
        while rows and not rows[-1]:
            rows.pop()
        if rows:
            self.lines.append("\n".join(rows))
        self._pre = None

    # -- parser callbacks ---------------------------------------------------------------------------------
    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip_tag is not None:
            if tag == self._skip_tag and tag not in VOID_TAGS:
                self._skip_depth += 1
            return
        if self._starts_skip(tag, attrs):
            if tag not in VOID_TAGS:
                self._skip_tag, self._skip_depth = tag, 1
            return
        if self._pre is not None:
            if tag == "pre":
                self._pre_depth += 1
            elif tag == "br":
                self._pre.append("\n")
            return
        if tag == "pre":
            self._flush()
            self._pre, self._pre_depth = [], 1
        elif tag == "tr":
            self._flush()
            self._row_cells = 0
        elif tag in CELL_TAGS:
            if self._row_cells and "".join(self._line).strip():
                self._line.append(CELL_SEP)
            self._row_cells += 1
        elif tag in BLOCK_TAGS:
            self._flush()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID_TAGS:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth -= 1
                if self._skip_depth == 0:
                    self._skip_tag = None
            return
        if self._pre is not None:
            if tag == "pre":
                self._pre_depth -= 1
                if self._pre_depth == 0:
                    self._flush_pre()
            return
        if tag in BLOCK_TAGS or tag == "tr":
            self._flush()

    def handle_data(self, data: str) -> None:
        if self._skip_tag is not None:
            return
        if self._pre is not None:
            self._pre.append(data)
        else:
            self._line.append(data)

    def finish(self) -> str:
        self.close()
        if self._pre is not None:  # an unclosed <pre> runs to the end of the page
            self._flush_pre()
        self._flush()
        return "\n".join(self.lines)


def html_to_text(html: str | bytes) -> str:
    """The readable text of one HTML page, one block per line (bytes are decoded as UTF-8)."""
    if isinstance(html, bytes):
        html = html.decode("utf-8", errors="replace")
    parser = _TextExtractor()
    parser.feed(html)
    return parser.finish()
