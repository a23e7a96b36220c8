"""``zaya import``: a model folder in transformers' ``zaya`` format (ZAYA1's released weights, or any
``ZayaForCausalLM.save_pretrained``) -> our ``model.pt`` and a tokenizer folder the pipeline uses.

    zaya import --from /models/ZAYA1-base --out artifacts/init/model.pt
    # writes artifacts/init/model.pt and artifacts/init/tokenizer/ (tokenizer.json + meta.json)

The folder's config.json gives the architecture (``model.hf_format.model_config_from_hf``: what we cannot
represent is refused with one line naming the key), its safetensors files the weights (one file or shards
with an index; pickled ``*.bin`` weights are refused, nothing is unpickled), its tokenizer files the
tokenizer, padded to the model's vocabulary, with the special tokens its tokenizer_config.json names.
Everything is read and checked before anything is written; both outputs are written atomically.

Then train from the weights with ``train.init_from=<model.pt>`` and ``tokenizer.path=<tokenizer folder>``
(README, "Start from ZAYA1").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.utils import atomic_dir, get_logger, write_json

log = get_logger("import")

HELP = "read a transformers `zaya` model folder (ZAYA1 weights) into a model.pt and a tokenizer folder"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zaya import", description=HELP)
    p.add_argument("--from", dest="source", required=True, help="the model folder (config.json, safetensors)")
    p.add_argument("--out", required=True, help="the model.pt to write (replaced if it exists)")
    p.add_argument(
        "--tokenizer-out", default="", help="tokenizer folder to write (default: tokenizer/ by --out)"
    )
    p.add_argument("--no-tokenizer", action="store_true", help="import the weights only")
    return p


def import_folder(folder: Path, out: Path, tokenizer_out: Path | None) -> dict:
    """Write ``out`` (model.pt) and, with ``tokenizer_out``, the tokenizer folder; returns a summary."""
    from zaya_pipeline.data.tokenizer import tokenizer_from_hf
    from zaya_pipeline.model.hf_format import load_folder
    from zaya_pipeline.model.saved_model import save_model
    from zaya_pipeline.model.sizing import num_params

    if out.is_dir():
        raise ConfigError(f"--out {out}: is a folder; give the model.pt file to write")
    if not folder.is_dir():
        raise DataError(f"--from {folder}: not a folder")
    cfg, state, config = load_folder(folder)
    tok = meta = None
    if tokenizer_out is not None:
        if not (folder / "tokenizer.json").is_file():
            raise DataError(f"--from {folder}: no tokenizer.json (--no-tokenizer imports the weights only)")
        tok, meta = tokenizer_from_hf(folder, config, cfg.vocab_size)
    save_model(out, None, cfg, state=state)
    if tok is not None:
        with atomic_dir(tokenizer_out) as tmp:
            tok.save(str(tmp / "tokenizer.json"))
            write_json(tmp / "meta.json", {**meta, "source": str(folder)})
    log.info("imported %s: %s parameters -> %s", folder, f"{num_params(cfg):,}", out)
    return {"model": str(out), "tokenizer": tokenizer_out and str(tokenizer_out), "params": num_params(cfg)}


def import_command(argv: list[str]) -> dict:
    """``zaya import``: parse ``argv`` and import."""
    args = parser().parse_args(argv)
    out = Path(args.out)
    tokenizer_out = None if args.no_tokenizer else Path(args.tokenizer_out or out.parent / "tokenizer")
    return import_folder(Path(args.source), out, tokenizer_out)
