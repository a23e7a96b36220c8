"""End to end: the debug pipeline through `dvc repro` in a temporary copy of the repo.

Checks that every stage runs for real and chains, that each stage reads only the params it lists and writes
only the outputs it declares, that touching a module changes exactly the stages that import it, that a
second `dvc repro` runs nothing, that changing one param re-runs only the stages downstream of it, and that
`dvc exp run -S` composes through Hydra.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.project import BIN, copy_project, run
from support.transformers_side import load_with_transformers, zaya_generate
from support.wiring import covered, dvc_stages, expected_deps, param_problems

pytestmark = pytest.mark.slow

STAGE_ORDER = ("prepare", "curate", "tokenizer", "tokenize", "train", "eval-data", "evaluate", "register")
# Written by tools, not by a stage's own logic: git and DVC's own state, and the MLflow store (mlflow.db and
# mlartifacts/, which every run writes to by design: it is the tracking server, not a pipeline output).
NOT_STAGE_FILES = (".git/", ".dvc/", "dvc.lock", "mlflow.db", "mlartifacts/")


def stages_run(log: str) -> set[str]:
    return {line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage '")}


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (less the tools' state) with its modification time and size."""
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(NOT_STAGE_FILES) and "__pycache__" not in rel:
            stat = path.stat()
            out[rel] = (stat.st_mtime_ns, stat.st_size)
    return out


def declared_outputs(stage: dict) -> list[str]:
    return [
        next(iter(i)) if isinstance(i, dict) else i
        for k in ("outs", "metrics", "plots")
        for i in stage.get(k, [])
    ]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A fresh git repo holding exactly the project's committed-or-committable files, on the debug config."""
    return copy_project(tmp_path_factory.mktemp("e2e") / "repo", "experiment=debug")


@pytest.fixture(scope="module")
def reproduced(workspace, tmp_path_factory) -> dict:
    """`dvc repro` one stage at a time, in the DAG's order: per stage, DVC's log, the files it wrote (new or
    changed) and the config keys it read ($ZAYA_CONFIG_READS, config_reads.py)."""
    reads_dir = tmp_path_factory.mktemp("reads")
    result = {}
    for stage in STAGE_ORDER:
        before = snapshot(workspace)
        log = run(
            [str(BIN / "dvc"), "repro", "--single-item", stage],
            workspace,
            env={"ZAYA_CONFIG_READS": str(reads_dir)},
        )
        after = snapshot(workspace)
        written = {f for f, sig in after.items() if before.get(f) != sig}
        reads = json.loads((reads_dir / f"{stage}.json").read_text())
        result[stage] = {"log": log, "written": written, "reads": reads}
    return result


def test_repro_runs_every_stage_and_registers_a_model(workspace, reproduced):
    assert {s for r in reproduced.values() for s in stages_run(r["log"])} == set(STAGE_ORDER)
    reports = workspace / "reports"
    curate = json.loads((reports / "curate.json").read_text())
    assert curate["output_docs"] > 0
    metrics = json.loads((reports / "metrics.json").read_text())
    assert metrics["val_loss"] < 0.9 * metrics["unigram_val_nats_per_token"], "the model did not beat unigram"
    assert metrics["bits_per_byte"] > 0
    registry = json.loads((reports / "registry.json").read_text())
    assert registry["model_uri"].startswith("models:/")
    assert (workspace / "mlflow.db").is_file()
    for plot in ("train.csv", "val.csv", "expert_load.csv", "schedule.csv"):
        assert (reports / "plots" / plot).stat().st_size > 0
    assert set(metrics["tasks"]) == {"arc_easy", "arc_challenge", "hellaswag", "piqa", "sciq", "winogrande"}
    assert registry["champion"] == registry["version"] and registry["promoted"]
    # The champion loads from the registry in a fresh process and generates from a prompt.
    name = registry["model_name"]
    cmd = [str(BIN / "zaya"), "generate", "--model", f"models:/{name}@champion", "The database"]
    out = run(cmd, workspace)
    assert out.strip()


def test_the_champion_is_transformers_zaya_and_generates_what_zaya_generate_does(
    workspace, reproduced, tmp_path
):
    """The default architecture is ZAYA1's: the debug pipeline's champion exports to transformers' own
    format, stock transformers builds its own ZayaForCausalLM from it, and greedy text agrees with ours."""
    registry = json.loads((workspace / "reports" / "registry.json").read_text())
    uri = f"models:/{registry['model_name']}@champion"
    out = tmp_path / "hf"
    run([str(BIN / "zaya"), "export", "--model", uri, "--out", str(out)], workspace)
    assert json.loads((out / "config.json").read_text())["model_type"] == "zaya"
    theirs = load_with_transformers(out, "The database", new_tokens=8)
    assert theirs["class"] == "ZayaForCausalLM"
    assert theirs["text"].strip(), "the champion generated nothing: the comparison would be empty"
    assert zaya_generate(workspace, uri, "The database", new_tokens=8) == theirs["text"]


def test_each_stage_lists_exactly_the_params_it_reads(reproduced):
    problems = [
        p
        for stage, r in reproduced.items()
        for p in param_problems(stage, dvc_stages()[stage].get("params", []), r["reads"])
    ]
    assert not problems, "\n".join(problems)


def test_a_read_key_missing_from_params_is_caught(reproduced):
    declared = dvc_stages()["register"]["params"]
    read = reproduced["register"]["reads"]
    narrowed = [d for d in declared if not covered(read[-1], [d])] + ["registry.model_name"]
    assert any("does not list it under params" in p for p in param_problems("register", narrowed, read))


def test_each_stage_writes_only_its_declared_outputs(reproduced):
    stages = dvc_stages()
    owner = {o: s for s, st in stages.items() for o in declared_outputs(st)}
    problems = []
    for stage, r in reproduced.items():
        for f in sorted(r["written"]):
            mine = [o for o in declared_outputs(stages[stage]) if f == o or f.startswith(o + "/")]
            theirs = [owner[o] for o in owner if (f == o or f.startswith(o + "/")) and owner[o] != stage]
            if not mine:
                problems.append(f"{stage} wrote {f}, which is not among its outs/metrics/plots")
            if theirs:
                problems.append(f"{stage} wrote {f}, an output of {theirs[0]}")
    assert not problems, "\n".join(problems)


def test_touching_a_module_changes_exactly_the_stages_that_import_it(workspace, reproduced):
    """`dvc status` after editing one module (one per stage) names exactly the stages whose import closure
    holds it (less plumbing): none of the others, and a plumbing file (config.py) none."""
    deps = {s: expected_deps(s) for s in STAGE_ORDER}
    touched = [
        "data/html_text.py",
        "data/chain.py",
        "data/tokenizer.py",
        "data/tokenize.py",
        "distributed/parallelize.py",
        "eval/task_data.py",
        "eval/metrics.py",
        "registry/model_card.py",
        "data/loader.py",
        "config.py",
    ]
    for rel in touched:
        path = workspace / "src" / "zaya_pipeline" / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n# touched\n")
        try:
            status = json.loads(
                run([str(BIN / "dvc"), "status", "--json"], workspace).strip().splitlines()[-1] or "{}"
            )
        finally:
            path.write_bytes(original)
        want = {s for s in STAGE_ORDER if f"src/zaya_pipeline/{rel}" in deps[s]}
        if rel != "config.py":
            assert want, f"no stage imports {rel}"
        assert set(status) == want, (
            f"touching {rel}: dvc status says {sorted(status)}, its importers are {sorted(want)}"
        )


def test_summary_says_where_the_results_are(workspace):
    out = run([str(BIN / "zaya"), "summary", "--params", "params.yaml"], workspace)
    steps = json.loads((workspace / "reports" / "train.json").read_text())["steps"]
    assert f"training: {steps} steps" in out
    for where in ("metrics.json", "plots", "model.pt", "registry: models:/", "mlflow:"):
        assert where in out, out


def test_second_repro_runs_nothing(workspace):
    log = run([str(BIN / "dvc"), "repro"], workspace)
    assert stages_run(log) == set(), log


def test_registering_the_same_weights_again_creates_no_version(workspace):
    # (after the no-op repro: rewriting registry.json by hand makes DVC see a changed output)
    before = json.loads((workspace / "reports" / "registry.json").read_text())
    run([str(BIN / "zaya"), "register", "--params", "params.yaml"], workspace)
    after = json.loads((workspace / "reports" / "registry.json").read_text())
    assert after["reused"] and after["version"] == before["version"]


def test_changing_one_param_reruns_only_downstream(workspace):
    run([str(BIN / "zaya"), "params", "experiment=debug", "train.max_steps=30"], workspace)
    log = run([str(BIN / "dvc"), "repro"], workspace)
    assert stages_run(log) == {"train", "evaluate", "register"}, log
    assert json.loads((workspace / "reports" / "train.json").read_text())["steps"] == 30


def test_dvc_exp_run_composes_hydra_overrides(workspace):
    run(["git", "add", "-A"], workspace)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "lock"], workspace)
    run(
        [str(BIN / "dvc"), "exp", "run", "-S", "experiment=debug", "-S", "model.moe.num_experts=8"]
        + ["-S", "train.max_steps=30"],  # what is checked is the composition, not the model: a short run
        workspace,
    )
    assert "num_experts: 8" in (workspace / "params.yaml").read_text()
    import torch

    saved = torch.load(workspace / "artifacts" / "train" / "model.pt", map_location="cpu", weights_only=False)
    assert saved["model_config"]["moe"]["num_experts"] == 8


def test_a_queued_dvc_exp_sweep_lands_in_mlflow_and_dvc_exp_show(workspace):
    """Two learning rates queued with `dvc exp run --queue -S` and run with `--run-all` (each in a temporary
    copy of the repo): both appear in `dvc exp show` with their metrics, in `dvc plots diff`, and as MLflow
    runs tagged with their DVC experiment names, children of one parent run for the baseline commit, in the
    repo's own store (DVC_ROOT, not the temp copies)."""
    from mlflow import MlflowClient

    run(["git", "add", "-A"], workspace)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "baseline"], workspace)
    dvc = str(BIN / "dvc")
    sweep = ["-S", "experiment=debug", "-S", "train.optim.lr=0.003,0.02", "-S", "train.max_steps=30"]
    run([dvc, "exp", "run", "--queue", *sweep], workspace)
    run([dvc, "exp", "run", "--run-all"], workspace, timeout=1800)

    client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    exp = client.get_experiment_by_name("zaya_pipeline_debug")
    runs = client.search_runs([exp.experiment_id], "tags.`dvc.exp_name` != ''", max_results=100)
    by_lr = {r.data.params["train.optim.lr"]: r.data.tags["dvc.exp_name"] for r in runs}
    assert {"0.003", "0.02"} <= set(by_lr), by_lr
    names = [by_lr["0.003"], by_lr["0.02"]]
    swept = [r for r in runs if r.data.params["train.optim.lr"] in ("0.003", "0.02")]
    parents = {r.data.tags.get("mlflow.parentRunId") for r in swept}
    assert len(parents) == 1 and None not in parents, parents  # one group per baseline commit
    parent = client.get_run(parents.pop())
    head = run(["git", "rev-parse", "HEAD"], workspace).strip()
    assert parent.data.tags["zaya.sweep"] == "parent" and parent.info.run_name == f"dvc exp {head[:7]}"

    shown = json.loads(run([dvc, "exp", "show", "--json"], workspace).strip().splitlines()[-1])
    exps = {}
    for baseline in shown:
        for e in baseline.get("experiments") or []:
            for rev in e["revs"]:
                if rev.get("name") in names:
                    exps[rev["name"]] = rev["data"]
    assert set(exps) == set(names), list(exps)
    for name, lr in zip(names, (0.003, 0.02), strict=True):
        params = exps[name]["params"]["params.yaml"]["data"]
        assert params["train"]["optim"]["lr"] == lr
        assert exps[name]["metrics"]["reports/metrics.json"]["data"]["val_loss"] > 0

    diff = json.loads(run([dvc, "plots", "diff", *names, "--json"], workspace).strip().splitlines()[-1])
    (train_plot,) = diff["data"]["reports/plots/train.csv"]
    assert train_plot["revisions"] == names
    points = train_plot["content"]["data"]["values"]
    assert {p["rev"] for p in points} == set(names) and all(float(p["loss"]) > 0 for p in points)
