"""Each step of the curation chain on its own, built from config the way the chain builds it (no executor)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from datatrove.data import Document
from english_corpus import prose, random_words

from zaya_pipeline.data.chain import ChainStep, build_step
from zaya_pipeline.data.datatrove_parts import EnglishTokenizer
from zaya_pipeline.data.filters import CountEdits, TextNormalizer
from zaya_pipeline.errors import ConfigError

GERMAN = (
    "Die Datenbank speichert alle Einträge in einer Tabelle, die nach dem Namen sortiert ist. Wenn ein "
    "Benutzer eine neue Zeile einfügt, prüft das System zuerst, ob der Schlüssel schon vorhanden ist. "
    "Danach wird der Index aktualisiert und die Änderung in das Protokoll geschrieben, damit sie nach "
    "einem Absturz wiederhergestellt werden kann. Die Dokumentation beschreibt jeden Schritt genau."
)


def build(type_: str, tmp_path: Path, **params):
    return build_step(ChainStep(type_, type_, 10, params), tmp_path / "removed", EnglishTokenizer())


def verdict(step, text: str, **metadata) -> tuple[bool, str]:
    result = step.filter(Document(text=text, id="d", metadata=metadata))
    return (result, "") if isinstance(result, bool) else result


def formatted(step: CountEdits, *texts: str) -> list[str]:
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    return [d.text for d in step.run(iter(docs))]


def test_normalize_tidies_text_and_keeps_indentation(tmp_path):
    step = build("normalize", tmp_path)
    assert isinstance(step, CountEdits) and isinstance(step.formatter, TextNormalizer)
    text = (
        "Cafe\u0301 menu\u200b:\r\n"  # combining accent (NFC composes it), zero-width space, CRLF
        "price\u00a0list   with\t\tgaps   \n"  # NBSP, runs of spaces and tabs, trailing spaces
        "\n\n\n\n"
        "    if x:\n        return  x\n"  # indentation kept, inner double space collapsed
    )
    (out,) = formatted(step, text)
    assert out == "Café menu:\nprice list with gaps\n\n    if x:\n        return x"
    assert formatted(step, out) == [out], "normalizing twice changes nothing"
    stats = step.stats.stats
    assert stats["total"].total == 2 and stats["edited"].total == 1
    assert stats["chars_removed"].total == len(text) - len(out)
    keep_all = build("normalize", tmp_path, form="", collapse_spaces=False, max_blank_lines=-1)
    assert formatted(keep_all, "a  b\n\n\n\nc\u0301") == ["a  b\n\n\n\nc\u0301"]


def test_pii_replaces_emails_and_public_ips_only(tmp_path):
    step = build("pii", tmp_path, email_replacement=["someone@example.com"])
    (out,) = formatted(step, "Write to jane.roe@mail.company.org or ping 8.8.8.8; the router is 192.168.1.1.")
    assert out == "Write to someone@example.com or ping 22.214.171.124; the router is 192.168.1.1."


def test_url_filter_uses_local_lists_and_keeps_documents_without_url(tmp_path):
    blocklist = tmp_path / "blocked.txt"
    blocklist.write_text("# our own list\nspamdomain.com\nhttps://good.org/bad-page\n")
    step = build("url", tmp_path, blocklist_file=str(blocklist))
    assert verdict(step, "text") == (True, "")
    assert verdict(step, "text", url="https://docs.python.org/3/library/json.html") == (True, "")
    assert verdict(step, "text", url="https://www.spamdomain.com/x") == (False, "domain")
    assert verdict(step, "text", url="https://good.org/bad-page") == (False, "url")
    import datatrove

    words = Path(datatrove.__file__).parent / "assets" / "banned_words.txt"
    banned = next(w.strip() for w in words.read_text().splitlines() if w.strip() and not w.startswith("#"))
    assert verdict(step, "text", url=f"https://example.com/{banned}/page") == (False, "hard_blacklisted")
    strict = build("url", tmp_path, use_integrated_lists=False, drop_missing_url=True)
    assert verdict(strict, "text") == (False, "no_url")


def test_length_filter_reasons(tmp_path):
    step = build("length", tmp_path, min_chars=20, max_chars=200, min_words=5, max_words=30)
    assert verdict(step, "short") == (False, "too_few_chars")
    assert verdict(step, "x" * 201) == (False, "too_many_chars")
    assert verdict(step, "a-very-long-single-word") == (False, "too_few_words")
    assert verdict(step, " ".join(["w"] * 40)) == (False, "too_many_words")
    assert verdict(step, "six words in this short line") == (True, "")


def test_language_filter_runs_offline_on_the_local_model(tmp_path):
    step = build("language", tmp_path, languages=["en"], language_threshold=0.5)
    doc = Document(text=prose(random.Random(1)), id="en")
    assert step.filter(doc) is True
    assert doc.metadata["language"] == "en" and doc.metadata["language_score"] > 0.8
    german = Document(text=GERMAN, id="de")
    assert step.filter(german) == (False, "low_language_score") and german.metadata["language"] == "de"
    with pytest.raises(ConfigError, match="model_path"):
        build("language", tmp_path, model_path=str(tmp_path / "missing.ftz"))


def test_gopher_c4_and_fineweb_filters_from_config(tmp_path):
    rng = random.Random(2)
    good = prose(rng)
    gopher_rep, gopher_q = build("gopher_repetition", tmp_path), build("gopher_quality", tmp_path)
    c4 = build("c4_quality", tmp_path, filter_no_terminal_punct=False, filter_curly_bracket=False)
    fineweb = build("fineweb_quality", tmp_path, line_punct_thr=0.05)
    for step in (gopher_rep, gopher_q, c4, fineweb):
        assert verdict(step, good) == (True, ""), step.name
    assert verdict(gopher_rep, "\n".join(["The same line of the page and more words."] * 20)) == (
        False,
        "dup_line_frac",
    )
    no_stop_words = " ".join(random_words(rng, 120)) + "."
    assert verdict(gopher_q, no_stop_words) == (False, "gopher_enough_stop_words")
    assert verdict(c4, good + "\nLorem ipsum dolor sit amet, and the rest.") == (False, "lorem_ipsum")
    assert verdict(c4, good.replace(".", "")) == (False, "too_few_sentences")
    code = "    {\n" + good  # documentation quotes code: curly brackets are allowed
    assert verdict(c4, code) == (True, "")
    listing = "\n".join(
        f"The {w} of the {v}." for w, v in zip(random_words(rng, 40), random_words(rng, 40), strict=True)
    )
    assert verdict(fineweb, listing) == (False, "short_line_ratio")
    table = "\n".join(" ".join(random_words(rng, 8)) for _ in range(30)) + "\n" + good  # 30 rows, no "."
    assert verdict(fineweb, table) == (True, ""), "0.05 keeps pages of table rows"
    assert verdict(build("fineweb_quality", tmp_path), table) == (False, "line_punct_ratio")
