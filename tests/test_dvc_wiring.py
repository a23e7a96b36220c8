"""dvc.yaml's deps are computed from the code, and the code's layers only point down.

Each stage's ``deps`` must list exactly the project files its command imports (tests/support/wiring.py), less
the plumbing named in pyproject.toml ``[tool.zaya.dvc]``. The keys each stage reads, the files it writes and
the touch-a-module promise are checked on a real run in tests/test_e2e.py.
"""

from __future__ import annotations

import copy

import pytest

from support.wiring import (
    REPO,
    all_modules,
    covered,
    declared_source_deps,
    direct_imports,
    dvc_stages,
    early_check_keys,
    expected_deps,
    import_closure,
    import_cycles,
    import_graph,
    param_problems,
    wiring_rules,
)

# Lowest first: a module may import its own layer and the layers below it, never one above.
LAYERS: list[set[str]] = [
    {"", "errors", "utils", "config", "config_keys", "config_reads", "progress", "profiling", "tracking"},
    {"hf_config"},
    {"kernels"},
    {"ops"},
    {"model"},
    {"data"},
    {"distributed"},
    {"train"},
    {"eval"},
    {"registry"},
    {"cli", "sweep", "summary", "params_file", "kernel_report"},
]


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    return next(i for i, names in enumerate(LAYERS) if top in names)


def deps_problems(stages: dict) -> list[str]:
    problems = []
    for name, stage in stages.items():
        want, have = expected_deps(name), declared_source_deps(stage)
        problems += [
            f"{name}: imports {f} but dvc.yaml does not list it under deps" for f in sorted(want - have)
        ]
        problems += [
            f"{name}: lists {f} under deps but its command never imports it" for f in sorted(have - want)
        ]
    return problems


def test_every_stage_lists_exactly_the_modules_it_imports():
    problems = deps_problems(dvc_stages())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stage", ["prepare", "train", "evaluate", "register"])
def test_removing_a_dep_is_caught(stage):
    stages = copy.deepcopy(dvc_stages())
    deps = stages[stage]["deps"]
    dropped = next(d for d in reversed(deps) if d.startswith("src/"))
    deps.remove(dropped)
    problems = deps_problems(stages)
    assert problems and all(p.startswith(f"{stage}: imports {dropped}") for p in problems), problems


def test_closure_follows_local_imports_and_by_name_references():
    source = (
        "def f():\n    from zaya_pipeline.model.moe import MoE\n\n"
        "X = 'zaya_pipeline.data.filters:LengthFilter'\n"
    )
    found = direct_imports("zaya_pipeline.cli", source)
    assert {"zaya_pipeline.model.moe", "zaya_pipeline.model", "zaya_pipeline.data.filters"} <= found
    # the MLflow pyfunc entry is handed to MLflow by path, never imported: it is still register's dependency
    assert "zaya_pipeline.registry.pyfunc_entry" in import_closure("zaya_pipeline.registry.register")


def test_an_early_check_key_is_listed_by_the_stage_that_uses_it():
    """A key a stage reads only to fail early (curate: val_fraction, the batch) is left out of its params;
    the stage the key shapes must list it, or changing it would re-run nothing."""
    stages = dvc_stages()
    assert early_check_keys("curate"), "curate's early checks are declared in pyproject.toml"
    for stage in stages:
        for key in early_check_keys(stage):
            users = [s for s, st in stages.items() if s != stage and covered(key, st.get("params", []))]
            assert users, f"{stage} reads {key} for an early check, but no other stage lists it under params"


def test_an_early_check_key_is_excused_only_for_its_stage():
    read = ["data.curate.steps", "train.seq_len"]
    assert param_problems("curate", ["data.curate"], read) == []
    assert param_problems("tokenizer", ["data.curate"], read) == [
        "tokenizer: reads train.seq_len but dvc.yaml does not list it under params"
    ]


def test_plumbing_files_exist():
    for path in wiring_rules()["plumbing"]:
        assert (REPO / path).is_file(), f"pyproject.toml [tool.zaya.dvc] plumbing: {path} does not exist"


def test_no_import_cycles():
    assert import_cycles() == []


def test_an_import_cycle_is_found():
    graph = dict(import_graph())
    graph["zaya_pipeline.tracking"] = graph["zaya_pipeline.tracking"] | {"zaya_pipeline.sweep"}
    assert ["zaya_pipeline.sweep", "zaya_pipeline.tracking"] in import_cycles(graph)


def test_layers_only_point_down():
    upward = [
        f"{m} imports {d}"
        for m, deps in import_graph().items()
        for d in deps
        if not m.startswith(d + ".") and layer(d) > layer(m)
    ]
    assert not upward, "\n".join(sorted(upward))


def test_every_module_has_a_layer():
    for m in all_modules():
        layer(m)
