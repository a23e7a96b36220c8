"""The other side of an export: stock transformers on an exported folder in a fresh process that never imports
zaya_pipeline, and `zaya generate` on the registered version it came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.project import BIN, run

HF_SIDE = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok(sys.argv[2], return_tensors="pt").input_ids
with torch.no_grad():
    logits = model(ids).logits[0].tolist()
    gen = model.generate(ids, max_new_tokens=int(sys.argv[3]), do_sample=False)[0, ids.shape[1]:].tolist()
eos = tok.eos_token_id
gen = gen[: gen.index(eos)] if eos in gen else gen
print(json.dumps({"class": type(model).__name__, "ids": ids[0].tolist(), "logits": logits,
                  "text": tok.decode(gen, skip_special_tokens=True)}))
"""


def load_with_transformers(folder: Path, prompt: str, new_tokens: int = 6) -> dict:
    """``AutoModelForCausalLM`` / ``AutoTokenizer`` on ``folder`` (no remote code): the class it built
    (``class``), the prompt's token ids (``ids``), their logits and the greedy continuation (``text``)."""
    cmd = [sys.executable, "-c", HF_SIDE, str(folder), prompt, str(new_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def zaya_generate(repo: Path, model_uri: str, prompt: str, new_tokens: int = 6) -> str:
    """`zaya generate`'s greedy text for ``prompt`` from ``model_uri`` in ``repo``'s MLflow store (all of it:
    a continuation may hold newlines)."""
    cmd = [str(BIN / "zaya"), "generate", "--model", model_uri, "--max-new-tokens", str(new_tokens), prompt]
    out = run(cmd, repo, stdout_only=True)
    return out[:-1] if out.endswith("\n") else out
