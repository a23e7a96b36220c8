"""``zaya generate --model models:/<name>@champion "prompt" ...``: load a registered model and generate."""

from __future__ import annotations

import argparse

from zaya_pipeline.config import RegistryConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.registry.pyfunc import DEFAULT_PARAMS
from zaya_pipeline.tracking import TrackingError, tracking_uri, using_tracking_uri

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
    """Parse ``argv``, load the model from the registry and return one continuation per prompt."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    args = parser().parse_args(argv)
    if not args.model.startswith(("models:/", "runs:/")) and "://" not in args.model:
        raise ConfigError(f"--model {args.model!r} is not a model URI (models:/<name>@champion)")
    uri = tracking_uri(RegistryConfig(tracking_uri=args.tracking_uri))
    params = {key: getattr(args, key) for key in DEFAULT_PARAMS}
    try:
        with using_tracking_uri(uri):
            model = mlflow.pyfunc.load_model(args.model)
    except MlflowException as exc:
        raise TrackingError(f"cannot load {args.model} from {uri}: {exc.message}") from None
    return model.predict(list(args.prompts), params=params)
