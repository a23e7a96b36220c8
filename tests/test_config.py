"""The config schema, conf/ groups, params.yaml and dvc.yaml agree with each other."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from zaya_pipeline.config import GROUPS, PRECISIONS, ZayaConfig, load_config, load_params
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.params_file import compose_params_yaml


def test_params_yaml_is_the_composed_default(repo_root):
    on_disk = (repo_root / "params.yaml").read_text()
    assert on_disk == compose_params_yaml(conf_dir=repo_root / "conf"), (
        "params.yaml is out of sync with conf/: run `make params` (never edit params.yaml by hand)"
    )


def test_every_group_has_a_debug_member(repo_root):
    for group in GROUPS:
        assert (repo_root / "conf" / group / "debug.yaml").is_file() or group == "paths", group


def test_conf_defaults_equal_dataclass_defaults(repo_root):
    """conf/ fills the schema; code defaults must not silently disagree with the YAML defaults."""
    composed = dataclasses.asdict(load_config(conf_dir=repo_root / "conf"))
    assert composed == dataclasses.asdict(ZayaConfig())


def test_debug_experiment_switches_every_group(repo_root):
    cfg = load_config(["experiment=debug"], conf_dir=repo_root / "conf")
    assert cfg.model.name == "debug"
    assert cfg.train.max_steps < load_config(conf_dir=repo_root / "conf").train.max_steps
    assert cfg.registry.model_name.endswith("debug")


def test_unknown_key_names_the_key(repo_root):
    with pytest.raises(ConfigError, match="train.nonexistent_knob"):
        load_config(["train.nonexistent_knob=1"], conf_dir=repo_root / "conf")


def test_unknown_group_member_lists_the_options(repo_root):
    with pytest.raises(ConfigError, match="model/nonexistent"):
        load_config(["model=nonexistent"], conf_dir=repo_root / "conf")


def test_wrong_type_names_the_key(repo_root):
    with pytest.raises(ConfigError, match="train.max_steps"):
        load_config(["train.max_steps=many"], conf_dir=repo_root / "conf")


def test_precisions_are_the_ones_lightning_accepts():
    from typing import get_args

    from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    assert set(PRECISIONS) == set(get_args(_PRECISION_INPUT_STR) + get_args(_PRECISION_INPUT_STR_ALIAS))


def test_a_bad_value_or_a_mistyped_key_in_a_params_file_is_named_at_load(tmp_path, repo_root):
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["train"]["precision"] = "fp99"
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"train\.precision: unknown value 'fp99'; choose one of 32-true"):
        load_params(bad)
    params["train"]["precision"], params["train"]["seq_lne"] = "32-true", 64
    bad.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"key 'train\.seq_lne': did you mean 'train\.seq_len'"):
        load_params(bad)


def test_params_file_unknown_key_and_override(tmp_path, repo_root):
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["model"]["moe"]["num_expertz"] = 8
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match="model.moe.num_expertz"):
        load_params(bad)
    good = tmp_path / "good.yaml"
    good.write_text((repo_root / "params.yaml").read_text())
    assert load_params(good, ["model.moe.num_experts=16"]).model.moe.num_experts == 16
    with pytest.raises(ConfigError, match="does not exist"):
        load_params(tmp_path / "missing.yaml")


def _dvc_stages(repo_root):
    return yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]


def _entries(stage, key):
    for item in stage.get(key, []):
        yield next(iter(item)) if isinstance(item, dict) else item


def test_dvc_stage_outputs_are_the_default_paths(repo_root):
    paths = ZayaConfig().paths
    outs = {
        o
        for s in _dvc_stages(repo_root).values()
        for k in ("outs", "metrics", "plots")
        for o in _entries(s, k)
    }
    for path in (paths.raw, paths.curated, paths.removed, paths.tokenizer, paths.tokens, paths.train):
        assert path in outs, f"{path} (conf/paths/default.yaml) is not a dvc.yaml output"
    assert all(o.startswith(tuple(dataclasses.asdict(paths).values())) for o in outs)


def _rendered(dep: str, params: dict) -> str:
    """A dvc.yaml entry with its ``${a.b}`` templates filled from params.yaml, as DVC fills them."""

    def value(match: re.Match) -> str:
        node = params
        for part in match.group(1).split("."):
            node = node[part]
        return str(node)

    return re.sub(r"\$\{([^}]+)\}", value, dep)


def test_dvc_stage_params_and_deps_exist(repo_root):
    cfg = dataclasses.asdict(ZayaConfig())
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    prepare_deps = [_rendered(d, params) for d in _dvc_stages(repo_root)["prepare"]["deps"]]
    assert cfg["data"]["corpus"]["dvc_dep"] in prepare_deps, "the user's corpus is a dependency of prepare"
    for name, stage in _dvc_stages(repo_root).items():
        assert stage["cmd"] == f"zaya {name} --params params.yaml"
        for key in stage.get("params", []):
            node = cfg
            for part in key.split("."):
                assert part in node, f"stage {name}: param {key} is not in the schema"
                node = node[part]
        for dep in (_rendered(d, params) for d in stage.get("deps", [])):
            produced = any(
                dep in set(_entries(s, "outs")) | set(_entries(s, "metrics")) | set(_entries(s, "plots"))
                for s in _dvc_stages(repo_root).values()
            )
            assert produced or (repo_root / dep).exists(), f"stage {name}: dep {dep} does not exist"
