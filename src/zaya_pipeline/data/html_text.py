"""HTML page → plain text: Resiliparse's main-content extractor, plus rules taken from HTML's semantics.

Chosen by measurement over eight Debian documentation packages from eight generators (SQLite's scripts,
DocBook, two Sphinx themes, Doxygen, Javadoc, Texinfo, gtk-doc) against trafilatura, inscriptis and the
class-list parser this module held before: ``benchmarks/html_extraction.py``, figures in docs/data.md.

Resiliparse (``extract_plain_text(main_content=True)``) keeps the page's main content and drops what its rules
take for boilerplate: ``nav``, ``aside``, footers, link clusters, elements whose class, id or ARIA role names
a menu, navigation, sidebar, header, footer or breadcrumb, and ``¶`` anchors (this is how Sphinx's
``related``, ``sphinxsidebar`` and ``footer`` blocks go). Blocks are lines, paragraphs are separated by a
blank line, ``pre`` blocks keep their line breaks and indentation, table cells are separated by tabs. List
bullets are left out: a ``•`` is a word without letters to the Gopher filters.

What we add, before it runs:

* **page banners and footers** go: a ``header`` or ``footer`` element outside any ``article``, ``aside``,
  ``main``, ``nav`` or ``section``, which HTML makes the page's banner and content-info landmarks (an
  article's own header, with its title, stays). Resiliparse keeps a bare ``header``.
* **keyboard navigation bars** go: the nearest table, list, paragraph or ``div`` around a link with an
  ``accesskey`` (the prev / next / up / home links of DocBook's and Texinfo's header and footer bars), when
  that block holds at most ``NAV_MAX_CHARS`` characters of text (in a longer block, only the link goes).
* **permalink marks** go: a link inside a heading (h1-h6) to a place on the same page (``href="#…"``) whose
  text has no letter or digit (Doxygen's ``◆``).
* **body depth**: the body's content is moved three ``div`` levels down. Resiliparse drops every list fewer
  than four levels below ``body``, taking it for a site menu; documentation generators put content lists
  right there (SQLite's pages, Texinfo's), and menus are still recognised by the rules above. On SQLite's
  pages this keeps 94% of the prose instead of 90%, with no more chrome.

Across pages, ``strip_template_lines`` removes the lines that open or close at least half of a set of pages
(a site's tagline or project name above every page: SQLite's "Small. Fast. Reliable. / Choose any three.",
Doxygen's project name); the Debian source applies it per package.

The selectors stay narrow for speed as well: Resiliparse 2.0.1 takes time quadratic in a node list's length
to iterate it (16 s for the 2,456 same-page links of SQLite's C API reference). Deterministic: rule-based, no
model; the same bytes give the same text.
"""

from __future__ import annotations

import re
from collections import Counter

NAV_MAX_CHARS = 400  # the text of a navigation bar: DocBook's, with two rows of page titles, has ~200
BODY_DEPTH = 3  # div levels the body's content is moved down (Resiliparse treats lists above 4 as menus)
TEMPLATE_PAGE_SHARE = 0.5  # a line that opens or closes this share of the pages is the site's template
EDGE_LINES = 3  # template layers peeled from each end of a page (a tagline is two lines, a project name one)
_ALNUM = re.compile(r"\w")
_PERMALINKS = ", ".join(f'h{i} a[href^="#"]' for i in range(1, 7))
_BLANK_RUNS = re.compile(r"\n{3,}")


def _strip_navigation(body) -> None:
    """Remove page banners and footers, keyboard navigation bars and symbol-only permalinks below ``body``."""
    doomed = [
        el
        for el in body.query_selector_all("header, footer")
        if el.closest("article, aside, main, nav, section") is None
    ]
    for link in body.query_selector_all("a[accesskey]"):
        block = link.closest("table, ul, ol, p, div, nav")
        doomed.append(block if block is not None and len(block.text) <= NAV_MAX_CHARS else link)
    for link in body.query_selector_all(_PERMALINKS):
        if not _ALNUM.search(link.text):
            doomed.append(link)
    # a removed element takes its descendants along: remove each outermost one once
    chosen: list = []
    for node in doomed:
        if not any(c.contains(node) for c in chosen):
            chosen = [c for c in chosen if not node.contains(c)] + [node]
    for node in chosen:
        node.decompose()


def _deepen(tree) -> None:
    """Move the body's content ``BODY_DEPTH`` div levels down."""
    body = tree.body
    outer = inner = tree.create_element("div")
    for _ in range(BODY_DEPTH - 1):
        inner = inner.append_child(tree.create_element("div"))
    node = body.first_child
    while node is not None:  # not body.child_nodes: iterating a node list is quadratic (above)
        following = node.next_sibling
        inner.append_child(node)
        node = following
    body.append_child(outer)


def html_to_text(html: str | bytes) -> str:
    """The readable text of one HTML page (bytes are decoded as UTF-8, bad bytes replaced)."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    if isinstance(html, bytes):
        html = html.decode("utf-8", errors="replace")
    tree = HTMLTree.parse(html)
    if tree.body is not None:
        _strip_navigation(tree.body)
        _deepen(tree)
    text = extract_plain_text(tree, main_content=True, preserve_formatting=True, list_bullets=False)
    text = "\n".join(line.rstrip() for line in text.split("\n"))  # a blank line is then "": one regex
    return _BLANK_RUNS.sub("\n\n", text).strip("\n")


def _key(line: str) -> str:
    return " ".join(line.split())


def strip_template_lines(texts: list[str], min_share: float = TEMPLATE_PAGE_SHARE) -> list[str]:
    """``texts`` less the template lines at their edges, peeled a layer at a time from each end: a line that
    is the first (or last) non-empty line of at least ``min_share`` of the non-empty texts, and of 3 or more,
    goes from every text it opens (closes); then the next layer, up to ``EDGE_LINES`` deep. Lines inside a
    text stay, however often they repeat (a reference's "Parameters" headings are content)."""
    split = [t.split("\n") for t in texts]
    floor = max(3, min_share * sum(1 for t in texts if t.strip()))
    bounds = [[0, len(lines)] for lines in split]
    for side in (0, 1):  # 0: from the top, 1: from the bottom
        for _ in range(EDGE_LINES):
            edge = [_edge(lines, b, side) for lines, b in zip(split, bounds, strict=True)]
            counts = Counter(key for _, key in edge if key)
            layer = {key for key, n in counts.items() if n >= floor}
            if not layer:
                break
            for b, (index, key) in zip(bounds, edge, strict=True):
                if key in layer:
                    b[side] = index + 1 if side == 0 else index
    return ["\n".join(lines[b[0] : b[1]]).strip("\n") for lines, b in zip(split, bounds, strict=True)]


def _edge(lines: list[str], bounds: list[int], side: int) -> tuple[int, str]:
    """(index, key) of the first (side 0) or last (side 1) non-empty line in ``bounds``; key "" if none."""
    order = range(bounds[0], bounds[1]) if side == 0 else range(bounds[1] - 1, bounds[0] - 1, -1)
    for i in order:
        if lines[i].strip():
            return i, _key(lines[i])
    return -1, ""
