"""``zaya export``: a Hugging Face model folder from a registered model or a ``model.pt``.

A model transformers' own ``Zaya`` expresses (CCA attention, the ZAYA1 router with its skip expert, top-1:
``model.hf_format.unsupported``) is written in transformers' ``zaya`` format, which stock transformers
(>= 5.25) loads as its own ``ZayaForCausalLM``, no remote code::

    config.json                  model_type "zaya" (model/hf_format.py), and ``zaya_pipeline``: provenance
    model.safetensors            the weights under transformers' names (shards + index above 5 GB)
    tokenizer.json               the tokenizer, with a post-processor that puts the document start first
                                 (EOS, then BOS if any: what every training document follows, and what
                                 ``zaya generate`` prepends)
    tokenizer_config.json, special_tokens_map.json
                                 PreTrainedTokenizerFast with eos / pad, and bos (= EOS without one)
    generation_config.json       eos / pad / bos ids
    README.md                    the model card (lineage, metrics) when exported from a registered version

Any other variant (GQA attention, the linear router, top-2, no skip expert: our ablation arms) falls back to
model_type ``zaya_moe``: the same files plus remote code (``configuration_zaya.py``, ``modeling_zaya.py``)
that imports ``zaya_pipeline``, loaded with ``trust_remote_code=True`` (docs/adr/0005, 0010).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from dataclasses import asdict
from importlib.metadata import version as dist_version
from pathlib import Path

from zaya_pipeline.config import PathsConfig, RegistryConfig
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.registry.registered import parse_model_uri, registered_files
from zaya_pipeline.utils import atomic_dir, get_logger, read_json

log = get_logger("export")

HELP = "write a Hugging Face model folder (transformers' zaya format, or remote code) from a model"
FALLBACK_MODEL_TYPE = "zaya_moe"
REMOTE_CODE = Path(__file__).with_name("hf_remote")
AUTO_MAP = {
    "AutoConfig": "configuration_zaya.ZayaConfig",
    "AutoModelForCausalLM": "modeling_zaya.ZayaForCausalLM",
}
PROVENANCE = "zaya_pipeline"  # config.json key: {version, source, format} of what zaya export wrote

USAGE = """
## Loading with transformers

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("<this folder>"{remote})
tok = AutoTokenizer.from_pretrained("<this folder>"{remote})
ids = tok("The database", return_tensors="pt").input_ids  # EOS first, as in training
out = model.generate(ids, max_new_tokens=20, do_sample=False)
print(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
```

{note}
"""
ZAYA_NOTE = (
    "This folder is in transformers' own `zaya` format (transformers >= 5.25, `ZayaForCausalLM`): no remote "
    "code. vLLM's `zaya` model (Zyphra's vLLM fork) reads the same format; that path is untested here."
)
REMOTE_NOTE = (
    "This variant ({why}) is not transformers' `zaya`: the folder carries remote code that imports "
    "`zaya_pipeline` (`pip install zaya_pipeline`). Batches must be unpadded."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zaya export", description=HELP)
    p.add_argument(
        "--model",
        required=True,
        help="a registered model (models:/<name>@<alias>, models:/<name>/<version>) or a model.pt file",
    )
    default_tokenizer = PathsConfig().tokenizer
    p.add_argument(
        "--tokenizer", default="", help=f"tokenizer folder for a model.pt (default: {default_tokenizer})"
    )
    p.add_argument(
        "--out", required=True, help="the folder to write (replaced if it holds only an earlier export)"
    )
    p.add_argument("--tracking-uri", default="", help="store (default: $MLFLOW_TRACKING_URI or ./mlflow.db)")
    return p


# What an export writes; a folder holding anything else (a .git of a Hub repository, notes) is not replaced.
EXPORT_FILES = re.compile(
    r"config\.json|generation_config\.json|tokenizer(_config)?\.json|special_tokens_map\.json|README\.md"
    r"|(configuration|modeling)_zaya\.py|model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json"
)


def _is_export(folder: Path) -> bool:
    try:
        config = read_json(folder / "config.json")
        return PROVENANCE in config or config.get("model_type") == FALLBACK_MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def check_out(out: Path) -> None:
    """``out`` may be missing, empty or an earlier export holding only what an export writes; anything else
    is refused with one line (replacing it would lose files zaya export did not write)."""
    if not out.exists():
        return
    if not out.is_dir() or (any(out.iterdir()) and not _is_export(out)):
        raise ConfigError(f"--out {out}: exists and is not an earlier zaya export; choose another folder")
    foreign = sorted(p.name for p in out.iterdir() if not EXPORT_FILES.fullmatch(p.name) or not p.is_file())
    if foreign:
        raise ConfigError(
            f"--out {out}: an earlier export, but it also holds {', '.join(foreign[:5])}, which zaya export "
            "did not write and would delete: export to another folder and copy the files over"
        )


def _local_files(model_pt: str, tokenizer_dir: str) -> dict[str, Path]:
    tok = Path(tokenizer_dir or PathsConfig().tokenizer)
    files = {
        "model": Path(model_pt),
        "tokenizer": tok / "tokenizer.json",
        "tokenizer_meta": tok / "meta.json",
    }
    for key, path in files.items():
        if not path.is_file():
            flag = "--model" if key == "model" else "--tokenizer"
            raise DataError(f"{flag}: {path} is missing")
    return files


def _tokenizer_files(files: dict[str, Path], out: Path, max_len: int) -> dict:
    """tokenizer.json (its post-processor puts the document start first: EOS, then BOS when the tokenizer
    has one), tokenizer_config.json, special_tokens_map.json; returns the special ids for config.json."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    meta = read_json(files["tokenizer_meta"])
    eos, pad, bos = meta.get("eos_token") or "<|endoftext|>", meta.get("pad_token"), meta.get("bos_token")
    tok = Tokenizer.from_file(str(files["tokenizer"]))
    eos_id = tok.token_to_id(eos)
    if eos_id is None or eos_id != int(meta["eos_id"]):
        raise DataError(
            f"{files['tokenizer_meta']}: eos_token {eos!r} is not id {meta['eos_id']} of its tokenizer"
        )
    bos_id = tok.token_to_id(bos) if bos else None
    start = f"{eos} {bos}" if bos_id is not None else eos
    specials = [(eos, eos_id)] + ([(bos, bos_id)] if bos_id is not None else [])
    tok.post_processor = TemplateProcessing(
        single=f"{start} $A", pair=f"{start} $A {start} $B:1", special_tokens=specials
    )
    tok.save(str(out / "tokenizer.json"))
    special = {"bos_token": bos if bos_id is not None else eos, "eos_token": eos}
    special |= {"pad_token": pad} if pad else {}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        **special,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
    pad_id = tok.token_to_id(pad) if pad else None
    return {
        "bos_token_id": bos_id if bos_id is not None else eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id if pad_id is not None else eos_id,
    }


def write_export(files: dict[str, Path], out: Path, source: str) -> Path:
    """The Hugging Face folder for ``files`` (model, tokenizer, tokenizer_meta, optional card) at ``out``,
    built under a temporary name and swapped in whole."""
    from zaya_pipeline.model.hf_format import unsupported
    from zaya_pipeline.model.saved_model import non_finite, read_model_file

    check_out(out)
    cfg, state = read_model_file(files["model"])
    if bad := non_finite(state):
        raise DataError(f"{files['model']} holds NaN or Inf weights (e.g. {bad[0]}): nothing to export")
    why = unsupported(cfg)
    provenance = {"version": dist_version("zaya_pipeline"), "source": source}
    with atomic_dir(out) as tmp:
        ids = _tokenizer_files(files, tmp, cfg.max_seq_len)
        if why is None:
            _write_zaya(tmp, cfg, state, ids, provenance)
            usage = USAGE.format(remote="", note=ZAYA_NOTE)
        else:
            _write_remote_code(tmp, cfg, state, ids, provenance)
            usage = USAGE.format(remote=", trust_remote_code=True", note=REMOTE_NOTE.format(why=why))
        (tmp / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n", encoding="utf-8")
        card = files.get("card")
        text = (
            card.read_text(encoding="utf-8")
            if card and card.is_file()
            else f"# zaya MoE model\n\nFrom {source}.\n"
        )
        (tmp / "README.md").write_text(text + usage, encoding="utf-8")
    log.info("exported %s to %s (%s)", source, out, "transformers' zaya format" if why is None else why)
    return out


def _write_zaya(tmp: Path, cfg, state: dict, ids: dict, provenance: dict) -> None:
    """transformers' own format: its config keys and tensor names (model/hf_format.py)."""
    from zaya_pipeline.model.hf_format import hf_config, to_hf_state, write_weights

    write_weights(tmp, to_hf_state(state, cfg))
    config = {**hf_config(cfg, ids), PROVENANCE: {**provenance, "format": "zaya"}}
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _write_remote_code(tmp: Path, cfg, state: dict, ids: dict, provenance: dict) -> None:
    """The fallback: our own config and names, with the remote code that builds ZayaLM (hf_remote/)."""
    from safetensors.torch import save_file

    state = {f"model.{k}": v.contiguous() for k, v in state.items()}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "model_type": FALLBACK_MODEL_TYPE,
        "architectures": ["ZayaForCausalLM"],
        "auto_map": AUTO_MAP,
        "zaya": asdict(cfg),
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "tie_word_embeddings": False,
        "dtype": "float32",
        PROVENANCE: {**provenance, "format": FALLBACK_MODEL_TYPE},
        **ids,
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in ("configuration_zaya.py", "modeling_zaya.py"):
        shutil.copyfile(REMOTE_CODE / name, tmp / name)


def export(argv: list[str]) -> Path:
    """``zaya export``: parse ``argv``, fetch the model and write the folder; returns it."""
    from zaya_pipeline.tracking import tracking_uri

    args = parser().parse_args(argv)
    out = Path(args.out)
    check_out(out)  # before any download
    if "://" in args.model or args.model.startswith("models:/"):
        parse_model_uri(args.model)  # a models:/ URI, or one line
        uri = tracking_uri(RegistryConfig(tracking_uri=args.tracking_uri))
        files = registered_files(args.model, uri)
    else:
        files = _local_files(args.model, args.tokenizer)
    return write_export(files, out, args.model)
