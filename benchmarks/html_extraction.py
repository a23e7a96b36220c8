"""HTML → text on real documentation: which extractor keeps the prose and leaves the site chrome behind.

Pages: the HTML pages of Debian documentation packages made by different generators (``apt-get download``
through ``data/debian.py``, the way the default corpus is fetched) that have text: at least ``MIN_CHARS``
characters in a full render of the page (this leaves out redirect stubs, e.g. 2,200 of octave-doc's 2,891
pages). A package with more than ``--max-pages`` such pages is sampled evenly over its sorted paths. Every
extractor sees the same pages.

| package | generator |
|---|---|
| sqlite3-doc | SQLite's own Tcl scripts |
| postgresql-doc-15 | DocBook XSL |
| python3.11-doc | Sphinx (python-docs-theme) |
| linux-doc-6.1 | Sphinx (alabaster) |
| libsdl2-doc | Doxygen 1.9 |
| libcommons-lang3-java-doc | Javadoc (JDK 17) |
| octave-doc | Texinfo 6.8 |
| libglib2.0-doc | gtk-doc (DocBook XSL) |

Extractors (``EXTRACTORS``): ``builtin`` (the stdlib ``html.parser`` extractor with a hand-kept list of chrome
CSS classes that ``data/html_text.py`` held until this benchmark; loaded from git at ``BUILTIN_COMMIT``, so
the comparison stays reproducible after it was replaced), ``trafilatura`` (as datatrove's extractor calls it:
``favor_precision``, ``deduplicate``, no comments; 1.11, the version datatrove 0.10.1 allows),
``resiliparse`` (``extract_plain_text(main_content=True, preserve_formatting=True)``), ``inscriptis``
(``get_text``: a layout-preserving renderer, no boilerplate removal), and ``zaya``: what ``zaya prepare``
does with a package now, ``data/html_text.py``'s ``html_to_text`` (Resiliparse plus our rules) on every
page, then ``strip_template_lines`` over the package's pages (its time included).

Measures, per package × extractor (lines: the extracted text split at newlines, whitespace collapsed, empty
lines left out; words: ``\\w+`` runs, lower-cased):

* ``docs``: pages whose text has at least ``MIN_CHARS`` (200) characters, the ``data.corpus.min_chars``
  default: the pages ``prepare`` turns into documents.
* ``chars``: characters of text, summed over the pages.
* ``chrome_share``: leftover chrome, the share of the characters that are chrome: template lines, those
  that occur on at least ``CHROME_PAGE_SHARE`` (50%) of the package's pages (navigation bars, footers,
  copyright lines, taglines: a page template's text is on nearly every page), plus permalink marks
  (``MARKS``: Sphinx's ``¶``, Doxygen's ``◆``, ``🔗``) anywhere. Counted on each extractor's own output.
  Not counted as template lines: a single word ("void", "Parameters:") and the text of a heading element
  (h1-h6, dt, th, caption) on any of the package's pages: API references repeat section headings
  ("Detailed Description", "Types and Values") on most pages, and those are content. (So a sidebar's
  headings, "Previous topic", do not count either; its links and the footer do.) ``chrome_lines`` is the
  share of the lines that are template lines; ``marks`` counts the marks.
* ``repeated_share``: the same with lines on at least ``REPEATED_PAGE_SHARE`` (10%) of the pages, and at
  least 3: this also counts the section headings a generator repeats ("Description", "Parameters",
  "See also"), which are content, so it is an upper bound on the chrome. ``top_repeated_lines`` lists the
  most frequent ones, with their page counts, to read what is left.
* ``prose_chars``: characters of the lines with at least 10 words that are not repeated lines (10%): kept
  running text.
* ``prose_recall``: the share of the pages' prose that the extractor keeps. Reference prose: every word
  5-gram of the lines with at least 10 words in a full render of the page's visible text (``html_text``,
  an lxml renderer that is none of the candidates), less the 5-grams that occur on at least
  ``REPEATED_PAGE_SHARE`` of the pages (chrome again); recall = the share of those 5-grams found anywhere
  in the extractor's text (so line breaks and spacing do not count, only which words survive in order).
* ``pages_per_s``: pages extracted per second of process CPU time, one process (``time.process_time``, so
  other load on the machine does not count).

Run (resiliparse is a dependency, trafilatura and inscriptis come with datatrove; the reference render needs
``pip install html-text==0.7.1``; the .deb files are cached where ``zaya prepare`` caches them)::

    python benchmarks/html_extraction.py --out benchmarks/results/html_extraction.json
    python benchmarks/html_extraction.py --packages python3.11-doc --extractors zaya,resiliparse \\
        --max-pages 100
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench_env import REPO, header, version_of

PACKAGES = {
    "sqlite3-doc": "SQLite's Tcl scripts",
    "postgresql-doc-15": "DocBook XSL",
    "python3.11-doc": "Sphinx (python-docs-theme)",
    "linux-doc-6.1": "Sphinx (alabaster)",
    "libsdl2-doc": "Doxygen 1.9",
    "libcommons-lang3-java-doc": "Javadoc (JDK 17)",
    "octave-doc": "Texinfo 6.8",
    "libglib2.0-doc": "gtk-doc (DocBook XSL)",
}
BUILTIN_COMMIT = "8156279"  # the last commit whose data/html_text.py was the class-list extractor
MIN_CHARS = 200
CHROME_PAGE_SHARE = 0.5
REPEATED_PAGE_SHARE = 0.1
REPEATED_MIN_PAGES = 3
PROSE_WORDS = 10
SHINGLE = 5
MARKS = "¶◆🔗"
_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")


# --- extractors ---------------------------------------------------------------------------------------------


def _builtin() -> Callable[[str], str]:
    source = subprocess.run(
        ["git", "show", f"{BUILTIN_COMMIT}:src/zaya_pipeline/data/html_text.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("builtin_html_text")
    exec(compile(source, "builtin_html_text.py", "exec"), module.__dict__)  # noqa: S102 - our own old module
    return module.html_to_text


def _trafilatura() -> Callable[[str], str]:
    from trafilatura import extract

    return lambda html: extract(html, favor_precision=True, include_comments=False, deduplicate=True) or ""


def _resiliparse() -> Callable[[str], str]:
    from resiliparse.extract.html2text import extract_plain_text

    return lambda html: extract_plain_text(html, main_content=True, preserve_formatting=True)


def _inscriptis() -> Callable[[str], str]:
    from inscriptis import get_text

    return get_text


def _zaya() -> Callable[[list[str]], list[str]]:
    """What ``zaya prepare`` does with a package: ``html_to_text`` per page, then ``strip_template_lines``."""
    from zaya_pipeline.data.html_text import html_to_text, strip_template_lines

    return lambda htmls: strip_template_lines([html_to_text(h) for h in htmls])


def per_page(factory: Callable[[], Callable[[str], str]]) -> Callable[[], Callable[[list[str]], list[str]]]:
    def make() -> Callable[[list[str]], list[str]]:
        extract = factory()
        return lambda htmls: [extract(h) for h in htmls]

    return make


EXTRACTORS = {  # name → a factory of a function from a package's pages to their texts
    "builtin": per_page(_builtin),
    "trafilatura": per_page(_trafilatura),
    "resiliparse": per_page(_resiliparse),
    "inscriptis": per_page(_inscriptis),
    "zaya": _zaya,
}


def reference_render(html: str) -> str:
    import html_text

    return html_text.extract_text(html, guess_layout=True)


HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6", "dt", "th", "caption")


def heading_texts(html: str) -> set[str]:
    import lxml.html

    try:
        root = lxml.html.fromstring(html)
    except Exception:  # lxml refuses an empty document
        return set()
    return {_SPACE.sub(" ", el.text_content()).strip() for el in root.iter(*HEADINGS)}


# --- measures -----------------------------------------------------------------------------------------------


def lines_of(text: str) -> list[str]:
    return [ln for ln in (_SPACE.sub(" ", raw).strip() for raw in text.split("\n")) if ln]


def shingles(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def prose_shingles(text: str) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for line in lines_of(text):
        words = _WORD.findall(line.lower())
        if len(words) >= PROSE_WORDS:
            out |= shingles(words)
    return out


def frequent(per_page: list[set], share: float) -> dict:
    """Item → pages, for the items present on at least ``share`` of the pages (and REPEATED_MIN_PAGES)."""
    counts = Counter(item for items in per_page for item in items)
    floor = max(REPEATED_MIN_PAGES, share * len(per_page))
    return {item: n for item, n in counts.items() if n >= floor}


def measure(texts: list[str], reference: list[set], headings: set[str], seconds: float) -> dict:
    """The measures of one extractor over one package's pages (``reference``: prose 5-grams per page,
    ``headings``: the heading texts of every page)."""
    page_lines = [lines_of(t) for t in texts]
    repeated = frequent([set(lines) for lines in page_lines], REPEATED_PAGE_SHARE)
    template = {
        line
        for line, n in repeated.items()
        if n >= CHROME_PAGE_SHARE * len(texts) and line not in headings and len(_WORD.findall(line)) >= 2
    }
    chars = chrome_chars = repeated_chars = prose_chars = n_lines = chrome_lines = marks = 0
    found = total = 0
    for lines, ref, text in zip(page_lines, reference, texts, strict=True):
        for line in lines:
            n_lines += 1
            chars += len(line)
            line_marks = sum(line.count(m) for m in MARKS)
            marks += line_marks
            if line in template:
                chrome_lines += 1
                chrome_chars += len(line)
            else:
                chrome_chars += line_marks
            if line in repeated:
                repeated_chars += len(line)
            elif len(_WORD.findall(line)) >= PROSE_WORDS:
                prose_chars += len(line)
        if ref:
            kept = shingles(_WORD.findall(text.lower()))
            found += len(ref & kept)
            total += len(ref)
    top = sorted(repeated.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
    top_template = sorted(((line, repeated[line]) for line in template), key=lambda kv: (-kv[1], kv[0]))[:8]
    return {
        "pages": len(texts),
        "docs": sum(len(t.strip()) >= MIN_CHARS for t in texts),
        "chars": chars,
        "prose_chars": prose_chars,
        "prose_recall": round(found / total, 4) if total else None,
        "chrome_share": round(chrome_chars / chars, 5) if chars else 0.0,
        "chrome_lines": round(chrome_lines / n_lines, 5) if n_lines else 0.0,
        "marks": marks,
        "repeated_share": round(repeated_chars / chars, 5) if chars else 0.0,
        "pages_per_s": round(len(texts) / seconds, 1) if seconds else None,
        "top_template_lines": [{"line": line[:120], "pages": n} for line, n in top_template],
        "top_repeated_lines": [{"line": line[:120], "pages": n} for line, n in top],
    }


# --- the run ------------------------------------------------------------------------------------------------


def sample(pages: list, n: int) -> list:
    if not n or len(pages) <= n:
        return pages
    step = len(pages) / n
    return [pages[int(i * step)] for i in range(n)]


def run_package(name: str, extractors: dict[str, Callable[[list[str]], list[str]]], max_pages: int) -> dict:
    from zaya_pipeline.data import debian

    (deb,) = debian.fetch_debs([name], "")
    with debian.unpacked_pages(deb) as pages:
        total = len(pages)
        htmls = [p.file.read_bytes().decode("utf-8", errors="replace") for p in pages]
    renders = [reference_render(h) for h in htmls]
    with_text = [i for i, r in enumerate(renders) if len(r.strip()) >= MIN_CHARS]
    chosen = sample(with_text, max_pages)
    htmls = [htmls[i] for i in chosen]
    per_page_ref = [prose_shingles(renders[i]) for i in chosen]
    chrome_ref = frequent(per_page_ref, REPEATED_PAGE_SHARE)
    reference = [ref - chrome_ref.keys() for ref in per_page_ref]
    headings = set().union(*(heading_texts(h) for h in htmls))
    result = {
        "version": deb.version,
        "generator": PACKAGES.get(name, ""),
        "pages_in_package": total,
        "pages_with_text": len(with_text),
    }
    for ex_name, extract in extractors.items():
        start = time.process_time()
        texts = extract(htmls)
        seconds = time.process_time() - start
        result[ex_name] = measure(texts, reference, headings, seconds)
        m = result[ex_name]
        print(
            f"{name:26} {ex_name:12} {m['pages']:5} {m['docs']:5} {m['chars']:>11,} {m['prose_chars']:>11,} "
            f"{m['prose_recall'] or 0:7.3f} {m['chrome_share']:8.4f} {m['marks']:6} "
            f"{m['repeated_share']:8.4f} {m['pages_per_s']:8.1f}",
            flush=True,
        )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packages", default=",".join(PACKAGES))
    ap.add_argument("--extractors", default=",".join(EXTRACTORS))
    ap.add_argument("--max-pages", type=int, default=600, help="pages per package, evenly sampled (0 = all)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    extractors = {name: EXTRACTORS[name]() for name in args.extractors.split(",")}
    print(
        f"{'package':26} {'extractor':12} {'pages':>5} {'docs':>5} {'chars':>11} {'prose_chars':>11} "
        f"{'recall':>7} {'chrome':>8} {'marks':>6} {'repeated':>8} {'pages/s':>8}"
    )
    out = {
        **header("html_extraction"),
        "versions": {
            p: version_of(p) for p in ("trafilatura", "resiliparse", "inscriptis", "html-text", "lxml")
        },
        "settings": {
            "max_pages": args.max_pages,
            "min_chars": MIN_CHARS,
            "chrome_page_share": CHROME_PAGE_SHARE,
            "repeated_page_share": REPEATED_PAGE_SHARE,
            "repeated_min_pages": REPEATED_MIN_PAGES,
            "prose_words": PROSE_WORDS,
            "shingle": SHINGLE,
            "marks": MARKS,
            "builtin_commit": BUILTIN_COMMIT,
        },
        "packages": {},
    }
    for name in args.packages.split(","):
        out["packages"][name] = run_package(name, extractors, args.max_pages)
        if args.out:  # after every package: a long run that fails later keeps what it measured
            Path(args.out).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
