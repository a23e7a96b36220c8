"""A registered version's files, read without running anything the store holds.

``zaya generate`` and ``zaya export`` take a ``models:/<name>@<alias>`` or ``models:/<name>/<version>`` URI.
They never call ``mlflow.pyfunc.load_model``, which executes what the version names (a cloudpickled
``python_model`` or a code file): anyone who can write to the registry could run code on every machine that
loads a version. Instead they download the version's files and accept only one of ours:

* its ``MLmodel`` is a pyfunc "from code" through ``pyfunc_entry.py`` (what ``register`` logs), not a pickle;
* it carries ``model.pt``, ``tokenizer.json`` and ``meta.json``, and the version's ``weights_sha256`` tag
  (set by ``register``) equals the sha256 of the downloaded ``model.pt``;

then build the model with the *installed* ``zaya_pipeline`` from those files (``model.pt`` with
``weights_only=True``, JSON, a tokenizer file). The package copy logged beside the version is never imported
here. ``mlflow models serve`` and ``mlflow.pyfunc.load_model`` do run that logged code: serve only versions
of a store you trust (docs/reliability.md, "Trust").
"""

from __future__ import annotations

from pathlib import Path

from zaya_pipeline.errors import ConfigError, DataError, first_line
from zaya_pipeline.registry.lineage import WEIGHTS_TAG
from zaya_pipeline.utils import file_sha256

CODE_LOADER = "mlflow.pyfunc.loaders.code_model"
ENTRY_NAME = "pyfunc_entry.py"
FILES = {"model": "model.pt", "tokenizer": "tokenizer.json", "tokenizer_meta": "meta.json"}
OPTIONAL = {"card": "MODEL_CARD.md"}


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """(name, version, alias) of ``models:/<name>/<version>`` or ``models:/<name>@<alias>``."""
    if not uri.startswith("models:/"):
        raise ConfigError(f"--model {uri!r}: expected models:/<name>@<alias> or models:/<name>/<version>")
    rest = uri.removeprefix("models:/").strip("/")
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, None, alias
    name, _, version = rest.partition("/")
    if not name or not version.isdigit():
        raise ConfigError(f"--model {uri!r}: expected models:/<name>@<alias> or models:/<name>/<version>")
    return name, version, None


def _version(client, uri: str):
    from mlflow.exceptions import MlflowException

    name, number, alias = parse_model_uri(uri)
    try:
        if alias is not None:
            return client.get_model_version_by_alias(name, alias)
        return client.get_model_version(name, number)
    except MlflowException as exc:
        raise DataError(f"cannot load {uri}: {first_line(exc)}") from None


def check_flavor(mlmodel: Path, uri: str) -> None:
    """The version's pyfunc must be ours: loaded from code through ``pyfunc_entry.py``, no pickled model."""
    import yaml

    if not mlmodel.is_file():
        raise DataError(f"{uri} is not a zaya registered model: it has no MLmodel file")
    try:
        pyfunc = (yaml.safe_load(mlmodel.read_text()) or {}).get("flavors", {}).get("python_function", {})
    except (yaml.YAMLError, AttributeError, UnicodeDecodeError):
        raise DataError(f"{uri} is not a zaya registered model: its MLmodel is not readable YAML") from None
    loader, entry = pyfunc.get("loader_module"), str(pyfunc.get("model_code_path", ""))
    if loader != CODE_LOADER or Path(entry).name != ENTRY_NAME or "python_model" in pyfunc:
        what = "a pickled python_model" if "python_model" in pyfunc else f"loader {loader!r}"
        raise DataError(f"{uri} is not a zaya registered model ({what}): refused, nothing of it was loaded")


def registered_files(uri: str, tracking_uri: str) -> dict[str, Path]:
    """The files of the version ``uri`` (``model``, ``tokenizer``, ``tokenizer_meta``, optional ``card``),
    downloaded and checked to be ours (module docstring); nothing downloaded is executed."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from zaya_pipeline.tracking import TrackingError, using_tracking_uri

    try:
        with using_tracking_uri(tracking_uri):
            version = _version(MlflowClient(tracking_uri), uri)
            root = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source))
    except MlflowException as exc:
        raise TrackingError(f"cannot load {uri} from {tracking_uri}: {exc.message}") from None
    check_flavor(root / "MLmodel", uri)
    files = {key: root / "artifacts" / name for key, name in (FILES | OPTIONAL).items()}
    missing = [str(files[key]) for key in FILES if not files[key].is_file()]
    if missing:
        raise DataError(f"{uri} is not a zaya registered model: it lacks {', '.join(missing)}")
    tagged = version.tags.get(WEIGHTS_TAG)
    if tagged is None or tagged != file_sha256(files["model"]):
        why = "has no weights_sha256 tag" if tagged is None else "has a model.pt whose sha256 is not its tag"
        raise DataError(f"{uri} {why}: not a version `zaya register` made, or altered since; refused")
    return files
