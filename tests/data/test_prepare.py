"""prepare stage: HTML extraction, the folder source and its validation, determinism, Debian packages."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zaya_pipeline.config import load_config
from zaya_pipeline.data.html_text import html_to_text, strip_template_lines
from zaya_pipeline.data.prepare import prepare
from zaya_pipeline.errors import ConfigError, DataError

PROSE = "This is a document with enough words in it to count as a real document for the corpus. " * 4


def make_cfg(tmp_path: Path, *overrides: str):
    return load_config([f"paths.raw={tmp_path}/raw", f"paths.reports={tmp_path}/reports", *overrides])


def folder_cfg(tmp_path: Path, input_dir: Path, *overrides: str):
    return make_cfg(tmp_path, "data.corpus.source=folder", f"data.corpus.input_dir={input_dir}", *overrides)


def read_records(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl(path: Path, rows: list, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# -- HTML → text ------------------------------------------------------------------------------------------
# (which extractor, and why: benchmarks/html_extraction.py on eight Debian documentation packages)

PAGE = """<!DOCTYPE html><html><head><title>Page title</title><style>p { color: red }</style>
<script>var x = "<p>not text</p>";</script></head>
<body>
<header>Site header</header>
<nav><ul><li>Home</li><li>Docs</li></ul></nav>
<div class="menu mainmenu"><ul><li><a href="/">Home</a><li>About</ul><div>nested menu div</div></div>
<div class="navheader"><table><tr><th colspan="3">The Title</th></tr><tr>
<td><a accesskey="p" href="prev.html">Prev</a></td><th>Chapter 2</th>
<td><a accesskey="n" href="next.html">Next</a></td></tr></table></div>
<h1>The   Title<a class="headerlink" href="#the-title">¶</a></h1>
<p>First    paragraph
   spans lines &amp; has an entity.</p>
<p>Second paragraph with <b>bold</b> and <a href="#">a link</a>.</p>
<ul><li>item one<li>item two</ul>
<h2><span class="permalink"><a href="#f">&#9670;&nbsp;</a></span>f()</h2>
<pre>
def f(x):
    return x  &lt;tab&gt;
</pre>
<table><tr><th>Name</th><th>Value</th></tr><tr><td>a</td><td>1</td></tr></table>
<div class="sphinxsidebar" role="navigation"><h3>Previous topic</h3><p>Table of contents entry</p></div>
<p>After the chrome.<br>New line after br.</p>
<form><input type="text" value="search"><select><option>Search docs</option></select></form>
<footer>Copyright footer</footer>
</body></html>"""


def test_html_keeps_blocks_as_lines_and_drops_chrome():
    """Banner, footer, menus, the keyboard navigation bar, a navigation sidebar, forms and the permalink
    marks go; paragraphs are separated by a blank line, pre keeps its indentation, cells are tab-separated."""
    assert html_to_text(PAGE).split("\n") == [
        "The Title",
        "",
        "First paragraph spans lines & has an entity.",
        "",
        "Second paragraph with bold and a link.",
        "",
        "  item one",  # Resiliparse indents list items
        "  item two",
        "",
        "f()",
        "",
        "def f(x):",
        "    return x  <tab>",
        "Name\t\tValue",
        "a\t\t1",
        "",
        "After the chrome.",
        "New line after br.",
    ]


def test_html_accesskey_link_in_running_text_costs_only_the_link():
    prose = "A long paragraph about the next chapter, well over the size of a navigation bar. " * 6
    text = html_to_text(f'<p>{prose}<a accesskey="n" href="n.html">Next</a> and more.</p>')
    assert text.startswith("A long paragraph") and "and more." in text and "Next" not in text


def test_html_heading_links_with_letters_stay():
    text = html_to_text('<h2><a href="#sec">Section title</a> ¶</h2><p>Body of the section, long enough.</p>')
    assert text.split("\n")[0] == "Section title"


def test_html_content_lists_right_under_body_are_kept():
    """Resiliparse alone drops a list fewer than 4 levels below body as a menu: SQLite's pages lose prose."""
    item = "Some people view RELEASE as the equivalent of COMMIT for a SAVEPOINT, and that is acceptable."
    text = html_to_text(f"<p>There are several ways of thinking about it:</p><ul><li><p>{item}</p></ul>")
    assert item in text


def test_html_article_header_stays_page_banner_goes():
    body = "<p>" + "Article body words. " * 20 + "</p>"
    text = html_to_text(f"<header>Site banner</header><article><header><h1>Art</h1></header>{body}</article>")
    assert text.startswith("Art\n") and "Site banner" not in text


def test_html_accepts_bytes_and_is_deterministic():
    data = PAGE.encode("utf-8")
    assert html_to_text(data) == html_to_text(data) == html_to_text(PAGE)


def test_template_lines_at_the_edges_of_most_pages_go():
    """Peeled a layer at a time from each end; a line repeated inside the pages stays."""
    page = "Small. Fast.\nChoose any three.\n\nTitle {i}\nParameters\nbody {i}\nParameters\nend {i}\n\nFooter"
    pages = [page.format(i=i) for i in range(4)] + [
        "Small. Fast.\nOnly the tagline here",
        "",
        "Other\nFooter",
    ]
    assert strip_template_lines(pages) == [
        *(f"Title {i}\nParameters\nbody {i}\nParameters\nend {i}" for i in range(4)),
        "Only the tagline here",
        "",
        "Other",
    ]
    # a line at the edge of fewer than half of the pages (or of fewer than 3) is content
    few = ["A\nx", "A\ny", "B\nz", "C\nw", "D\nv"]
    assert strip_template_lines(few) == few


# -- folder source ----------------------------------------------------------------------------------------


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    write_jsonl(
        root / "a.jsonl",
        [
            {"id": "a1", "text": PROSE + "a1", "url": "u1"},
            {"id": "a2", "text": "   "},
            {"id": "a3", "text": PROSE + "a3", "metadata": {"lang": "en"}},
        ],
    )
    write_jsonl(root / "sub" / "b.jsonl.gz", [{"id": "b1", "text": PROSE + "b1"}], gz=True)
    pq.write_table(pa.table({"id": ["p1", "p2"], "text": [PROSE + "p1", PROSE + "p2"]}), root / "c.parquet")
    (root / "notes.md").write_text("not a data file")
    return root


def test_folder_source_reads_jsonl_gz_and_parquet(tmp_path, corpus_dir):
    summary = prepare(folder_cfg(tmp_path, corpus_dir))
    raw = tmp_path / "raw"
    assert sorted(p.name for p in raw.iterdir()) == [
        "a.jsonl.gz",
        "c.jsonl.gz",
        "manifest.json",
        "rejects",
        "sub__b.jsonl.gz",
    ]
    a = read_records(raw / "a.jsonl.gz")
    assert [r["id"] for r in a] == ["a1", "a3"]  # the whitespace-only document is skipped, and counted
    assert a[0] == {
        "id": "a1",
        "text": PROSE + "a1",
        "metadata": {"source": "a.jsonl", "line": 1, "url": "u1"},
    }
    assert a[1]["metadata"] == {"source": "a.jsonl", "line": 3, "lang": "en"}
    assert [r["id"] for r in read_records(raw / "sub__b.jsonl.gz")] == ["b1"]
    assert [r["text"] for r in read_records(raw / "c.jsonl.gz")] == [PROSE + "p1", PROSE + "p2"]

    manifest = json.loads((raw / "manifest.json").read_text())
    assert manifest["source"] == "folder" and manifest["docs"] == 5 == summary["docs"]
    by_name = {s["name"]: s for s in manifest["sources"]}
    assert by_name["c"]["sha256"] == hashlib.sha256((corpus_dir / "c.parquet").read_bytes()).hexdigest()
    assert by_name["a"]["docs"] == 2 and by_name["a"]["chars"] == 2 * len(PROSE) + 4
    metrics = json.loads((tmp_path / "reports" / "prepare.json").read_text())
    assert metrics["docs"] == 5 and metrics["sources"]["sub__b"] == {"docs": 1, "chars": len(PROSE) + 2}
    assert metrics["rejected"] == manifest["rejected"] == {"whitespace_only": 1}
    assert (
        metrics["rejected_examples"][0]["file"] == "a.jsonl" and metrics["rejected_examples"][0]["line"] == 2
    )


def test_folder_source_numbers_lines_without_id_key_and_caps_docs(tmp_path, corpus_dir):
    prepare(folder_cfg(tmp_path, corpus_dir, "data.corpus.id_key=", "data.corpus.max_docs_per_source=1"))
    assert [r["id"] for r in read_records(tmp_path / "raw" / "a.jsonl.gz")] == ["a.jsonl:1"]
    assert [r["id"] for r in read_records(tmp_path / "raw" / "c.jsonl.gz")] == ["c.parquet:1"]


def test_two_runs_write_identical_bytes(tmp_path, corpus_dir):
    prepare(folder_cfg(tmp_path / "one", corpus_dir))
    prepare(folder_cfg(tmp_path / "two", corpus_dir))
    one, two = tmp_path / "one" / "raw", tmp_path / "two" / "raw"
    names = sorted(p.relative_to(one).as_posix() for p in one.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(two).as_posix() for p in two.rglob("*") if p.is_file())
    assert "rejects/rejects.jsonl.zst" in names
    for name in names:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name


def missing_folder(root: Path) -> Path:
    return root / "does-not-exist"


def no_data_files(root: Path) -> Path:
    (root / "notes.md").write_text("hi")
    return root


def only_empty_documents(root: Path) -> Path:
    return write_jsonl(root / "e.jsonl", [{"id": 1, "text": ""}, {"id": 2, "text": " \n"}]).parent


def only_bad_lines(root: Path) -> Path:
    return write_jsonl(root / "m.jsonl", ['{"id": 2, "text": ', {"id": 3, "body": PROSE}]).parent


# case → (make the input folder, fragments the error message must contain)
BAD_INPUTS = {
    "missing folder": (missing_folder, ["data.corpus.input_dir=", "no such folder"]),
    "no data files": (no_data_files, ["data.corpus.input_dir=", "no *.jsonl"]),
    "only empty documents": (only_empty_documents, ["data.corpus.input_dir=", "every document is empty"]),
    "only bad lines": (
        only_bad_lines,
        ["data.corpus.input_dir=", "malformed_json: 1, missing_text: 1", "m.jsonl:1 malformed_json"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_folder_input_fails_clearly_and_leaves_the_previous_output(tmp_path, case):
    make_input, fragments = BAD_INPUTS[case]
    root = tmp_path / "in"
    root.mkdir()
    input_dir = make_input(root)
    stale = tmp_path / "raw"
    stale.mkdir()
    (stale / "old.jsonl.gz").write_bytes(b"from an earlier run")
    with pytest.raises(DataError) as err:
        prepare(folder_cfg(tmp_path, input_dir))
    for fragment in fragments:
        assert fragment in str(err.value)
    if "input_dir=" in fragments[0]:
        assert str(input_dir) in str(err.value)
    # the issue-24 rule: a failed run loses nothing (it used to delete paths.raw before reading the input)
    assert (stale / "old.jsonl.gz").read_bytes() == b"from an earlier run"
    assert not (tmp_path / "reports" / "prepare.json").exists()
    assert not list(tmp_path.glob(".raw.tmp-*")), "no half-built output left behind"


def test_unknown_source_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="data.corpus.source"):
        prepare(make_cfg(tmp_path, "data.corpus.source=web"))


def test_cli_exits_non_zero_with_the_message(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "zaya_pipeline.cli",
        "prepare",
        "data.corpus.source=folder",
        f"data.corpus.input_dir={tmp_path}/nope",
        f"paths.raw={tmp_path}/raw",
        f"paths.reports={tmp_path}/r",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "data.corpus.input_dir" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "raw").exists()


# -- Debian source ----------------------------------------------------------------------------------------


def test_debian_source_without_apt_tools_says_how_to_use_a_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no apt-get, no dpkg-deb
    with pytest.raises(DataError) as err:
        prepare(make_cfg(tmp_path, f"data.corpus.cache_dir={tmp_path}/debs"))
    msg = str(err.value)
    assert "sqlite3-doc" in msg and "postgresql-doc-15" in msg and "apt-get is not installed" in msg
    assert "data.corpus.source=folder data.corpus.input_dir=" in msg
    assert not (tmp_path / "raw").exists()


needs_apt = pytest.mark.skipif(
    shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None,
    reason="needs apt-get and dpkg-deb (Debian/Ubuntu)",
)


@needs_apt
def test_debian_source_downloads_and_extracts_pages(tmp_path):
    """Real `apt-get download` into the default cache (reused by later runs), a few pages only."""
    cfg = make_cfg(tmp_path, "data.corpus.debian_packages=[sqlite3-doc]", "data.corpus.max_docs_per_source=3")
    prepare(cfg)
    records = read_records(tmp_path / "raw" / "sqlite3-doc.jsonl.gz")
    manifest = json.loads((tmp_path / "raw" / "manifest.json").read_text())
    (source,) = manifest["sources"]
    debs = sorted(
        (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zaya_pipeline" / "debs").glob(
            "sqlite3-doc_*.deb"
        )
    )
    deb = debs[-1]
    version = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True
    ).stdout.strip()
    assert source["version"] == version and source["docs"] == 3 == len(records)
    assert source["sha256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
    ids = [r["id"] for r in records]
    assert ids == sorted(ids) and all(i.startswith("sqlite3-doc/") and i.endswith(".html") for i in ids)
    for r in records:
        assert len(r["text"]) >= cfg.data.corpus.min_chars
        assert r["metadata"]["license"] == "public domain" and r["metadata"]["version"] == version
        assert r["metadata"]["path"].startswith("/usr/share/doc/") and "<" not in r["text"][:200]


@needs_apt
def test_debian_source_unknown_package_is_one_clear_error(tmp_path):
    cfg = make_cfg(
        tmp_path,
        "data.corpus.debian_packages=[zaya-no-such-package-doc]",
        f"data.corpus.cache_dir={tmp_path}/debs",
    )
    with pytest.raises(DataError) as err:
        prepare(cfg)
    msg = str(err.value)
    assert "zaya-no-such-package-doc" in msg and "data.corpus.source=folder" in msg
    assert not (tmp_path / "raw").exists()


@needs_apt
def test_debian_source_works_on_a_machine_that_never_ran_apt_get_update(tmp_path, monkeypatch):
    """Point apt at empty lists (as on a fresh container): prepare fetches private lists into its cache."""
    lists, apt_cache = tmp_path / "empty-lists", tmp_path / "empty-cache"
    (lists / "partial").mkdir(parents=True)
    (apt_cache / "archives" / "partial").mkdir(parents=True)
    conf = tmp_path / "apt.conf"
    conf.write_text(f'Dir::State::Lists "{lists}/";\nDir::Cache "{apt_cache}/";\n')
    monkeypatch.setenv("APT_CONFIG", str(conf))
    cache = tmp_path / "debs"
    prepare(
        make_cfg(
            tmp_path,
            "data.corpus.debian_packages=[sqlite3-doc]",
            "data.corpus.max_docs_per_source=1",
            f"data.corpus.cache_dir={cache}",
        )
    )
    assert len(read_records(tmp_path / "raw" / "sqlite3-doc.jsonl.gz")) == 1
    assert list(cache.glob("sqlite3-doc_*.deb")) and list((cache / "apt" / "lists").glob("*Packages*"))
    assert not [p for p in lists.iterdir() if p.name != "partial"], "the system lists were not touched"
