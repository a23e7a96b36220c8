"""``zaya generate --model models:/<name>@champion "prompt" ...``: load a registered model and generate."""

from __future__ import annotations

import argparse

from zaya_pipeline.config import RegistryConfig
from zaya_pipeline.registry.pyfunc import DEFAULT_PARAMS
from zaya_pipeline.tracking import tracking_uri

HELP = "generate text with a registered model (e.g. --model models:/zaya-moe@champion)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zaya generate", description=HELP)
    p.add_argument("prompts", nargs="+", help="one or more prompts")
    p.add_argument(
        "--model", required=True, help="an MLflow model URI: models:/<name>@<alias>, models:/<name>/<v>"
    )
    p.add_argument("--tracking-uri", default="", help="store (default: $MLFLOW_TRACKING_URI or ./mlflow.db)")
    for key, default in DEFAULT_PARAMS.items():
        p.add_argument(
            f"--{key.replace('_', '-')}", type=type(default), default=default, help=f"default {default}"
        )
    return p


def generate(argv: list[str]) -> list[str]:
    """Parse ``argv``, read the version's files from the registry (registry/registered.py: nothing of the
    store is executed) and return one continuation per prompt."""
    from types import SimpleNamespace

    from zaya_pipeline.registry.pyfunc import ZayaGenerator
    from zaya_pipeline.registry.registered import parse_model_uri, registered_files

    args = parser().parse_args(argv)
    parse_model_uri(args.model)
    uri = tracking_uri(RegistryConfig(tracking_uri=args.tracking_uri))
    files = registered_files(args.model, uri)
    model = ZayaGenerator()  # the installed class, not the code logged with the version
    model.load_context(SimpleNamespace(artifacts={key: str(path) for key, path in files.items()}))
    params = {key: getattr(args, key) for key in DEFAULT_PARAMS}
    return model.predict(None, list(args.prompts), params=params)
