"""The GitHub Actions workflows, checked statically: the GitHub workflow schema (check-jsonschema),
and the CI fan-out of packages.yml: one build job per variant of `fuselet-build matrix --json`,
each building exactly its own variant, in waves that respect the recipe's own dependencies."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.config.conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
REUSABLE = "./.github/workflows/build-variant.yml"
FAN_OUT = {"build-core": "core", "build-python": "python", "build": "bindings"}  # job -> matrix output


def _load(name: str) -> dict:
    wf = yaml.safe_load((WORKFLOWS / name).read_text())
    if True in wf:  # YAML 1.1 reads the key `on` as a boolean
        wf["on"] = wf.pop(True)
    return wf


@pytest.fixture(scope="module")
def packages():
    return _load("packages.yml")


@pytest.fixture(scope="module")
def build_variant():
    return _load("build-variant.yml")


def _step(job: dict, name_start: str) -> dict:
    (step,) = [s for s in job["steps"] if s.get("name", "").startswith(name_start)]
    return step


def _needs(job: dict) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else needs


@pytest.mark.parametrize("name", sorted(p.name for p in WORKFLOWS.glob("*.yml")))
def test_workflow_validates_against_the_github_workflow_schema(name):
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is not installed (pip install -r requirements/dev.txt)")
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(WORKFLOWS / name)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- packages.yml: the fan-out ----------------------------------------------------------------------


def test_matrix_job_renders_the_jobs_and_exposes_them(packages):
    job = packages["jobs"]["matrix"]
    run = _step(job, "Render the build jobs")["run"]
    assert 'python -m fuselet_build matrix --json --variants "$VARIANTS"' in run
    assert packages["env"]["VARIANTS"].endswith("'variants/conda-forge.yaml' }}")
    for output in (*FAN_OUT.values(), "variants"):
        assert job["outputs"][output] == f"${{{{ steps.jobs.outputs.{output} }}}}"
        assert f'echo "{output}=' in run, f"the render step does not write the output {output!r}"


@pytest.mark.parametrize("job_name", sorted(FAN_OUT))
def test_build_jobs_fan_out_over_the_matrix_job_output(packages, job_name):
    job, output = packages["jobs"][job_name], FAN_OUT[job_name]
    assert "matrix" in _needs(job)
    assert job["strategy"]["matrix"] == {"include": f"${{{{ fromJSON(needs.matrix.outputs.{output}) }}}}"}
    assert job["strategy"]["fail-fast"] is False, "one failing variant must not cancel the others"
    assert job["uses"] == REUSABLE
    assert job["with"]["id"] == "${{ matrix.id }}"
    assert job["with"]["subdir"] == "${{ matrix.subdir }}"
    assert job["with"]["variants"] == "${{ needs.matrix.outputs.variants }}"
    assert job["with"]["download-built"] is (output != "core")


def test_waves_run_in_order_and_the_channel_waits_for_all(packages):
    jobs = packages["jobs"]
    assert "build-core" in _needs(jobs["build-python"])
    assert "build-python" in _needs(jobs["build"])
    assert set(FAN_OUT) <= set(_needs(jobs["channel"]))


def _waves(packages) -> dict[str, set[str]]:
    env = _step(packages["jobs"]["matrix"], "Render the build jobs")["env"]
    return {"core": set(env["CORE_PACKAGES"].split()), "python": set(env["PYTHON_PACKAGES"].split())}


def _mentioned_outputs(entries, outputs: set[str]) -> set[str]:
    """Outputs of the recipe named by a requirement list (if/then/else flattened)."""
    found = set()
    for entry in entries or []:
        if isinstance(entry, dict):
            found |= _mentioned_outputs(entry.get("then"), outputs) | _mentioned_outputs(entry.get("else"), outputs)
            continue
        pin = re.search(r"pin_subpackage\(\s*['\"]([^'\"]+)", entry)
        name = pin.group(1) if pin else entry.split()[0]
        if name in outputs:
            found.add(name)
    return found


def test_waves_follow_the_recipe_dependencies(packages):
    """A job only builds its own variant, so what its package needs from the recipe's other outputs
    (host pins, test-time run requirements) must come from an earlier wave."""
    recipe = yaml.safe_load((ROOT / "recipe/recipe.yaml").read_text())
    outputs = {o["package"]["name"]: o for o in recipe["outputs"] if "package" in o}
    waves = _waves(packages)
    assert waves["core"] | waves["python"] <= set(outputs)
    level = {name: 0 if name in waves["core"] else 1 if name in waves["python"] else 2 for name in outputs}
    for name, out in outputs.items():
        req = out.get("requirements", {})
        needs = set().union(*(_mentioned_outputs(req.get(k), set(outputs)) for k in ("build", "host", "run"))) - {name}
        for dep in needs:
            assert level[dep] < level[name], f"{name} (wave {level[name]}) needs {dep} (wave {level[dep]})"
    assert 2 in level.values(), "no bindings wave: every framework package would be left out"


def test_channel_job_collects_indexes_and_verifies(packages):
    job = packages["jobs"]["channel"]
    download = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact")]
    assert download and download[0]["with"] == {"pattern": "pkg-*", "merge-multiple": True, "path": "channel"}
    runs = " ".join(s.get("run", "") for s in job["steps"])
    assert "python -m fuselet_build index channel" in runs
    assert "python -m fuselet_build verify" in runs


# --- build-variant.yml: one variant per job -------------------------------------------------------


def _build_command(build_variant) -> tuple[str, dict]:
    step = _step(build_variant["jobs"]["build"], "Build ${{ inputs.id }}")
    return step["run"], step["env"]


def test_each_build_job_builds_exactly_its_selected_variant(build_variant):
    run, env = _build_command(build_variant)
    argv = shlex.split(run)
    assert argv[:4] == ["python", "-m", "fuselet_build", "build"]
    assert argv.count("--select") == 1, "a build job must build one variant, selected by its id"
    assert argv[argv.index("--select") + 1] == "$ID" and env["ID"] == "${{ inputs.id }}"
    assert argv[argv.index("--channel") + 1] == "conda-forge"
    assert argv[argv.index("--variants") + 1] == "$VARIANTS" and env["VARIANTS"] == "${{ inputs.variants }}"
    assert "--force" not in argv


def test_the_build_command_parses_with_the_real_cli(build_variant):
    cli = pytest.importorskip("fuselet_build.cli")
    run, _ = _build_command(build_variant)
    argv = shlex.split(run.replace("$ID", "libfuselet-0.1.0-cpu_h0_0").replace("$VARIANTS", "variants/conda-forge.yaml"))
    args = cli.parser().parse_args(argv[3:])
    assert args.select == ["libfuselet-0.1.0-cpu_h0_0"] and args.channel == "conda-forge"
    assert args.variants == ["variants/conda-forge.yaml"]


def test_every_job_id_selects_exactly_one_variant(conda_forge_jobs):
    """`--select` keeps the packages whose id CONTAINS the text (fuselet_build.build), so no id
    of the public matrix may be part of another (libfuselet-... contains fuselet-...)."""
    ids = [j.key for j in conda_forge_jobs]
    assert len(ids) <= 256, "GitHub runs at most 256 jobs per matrix"
    for i in ids:
        assert [k for k in ids if i in k] == [i]


def test_the_uploaded_artifact_is_the_one_built_package(build_variant):
    steps = build_variant["jobs"]["build"]["steps"]
    stage = _step(build_variant["jobs"]["build"], "Stage ${{ inputs.id }}")
    assert stage["run"] == 'mkdir -p "upload/$SUBDIR" && cp "output/$SUBDIR/$ID.conda" "upload/$SUBDIR/"'
    assert stage["env"] == {"ID": "${{ inputs.id }}", "SUBDIR": "${{ inputs.subdir }}"}
    (upload,) = [s for s in steps if s.get("name", "").startswith("Upload ${{")]
    assert upload["with"]["name"] == "pkg-${{ inputs.id }}" and upload["with"]["path"] == "upload/"
    download = [s for s in steps if str(s.get("uses", "")).startswith("actions/download-artifact")]
    assert download[0]["with"]["pattern"] == "pkg-*" and download[0]["with"]["path"] == "output"


def test_cuda_variants_get_a_driver_for_their_tests(build_variant):
    _, env = _build_command(build_variant)
    assert env["CONDA_OVERRIDE_CUDA"] == "${{ inputs.cuda != 'None' && inputs.cuda || '' }}"


def test_packaging_jobs_install_the_tool_project():
    """Every job that runs fuselet_build installs it from its own project (tools/fuselet-build,
    whose pyproject.toml pins rattler-build and rattler), not from the library's tree."""
    for name in ("packages.yml", "build-variant.yml"):
        workflow = _load(name)
        tool = workflow["env"]["PACKAGING_TOOL"]
        assert (ROOT / tool / "pyproject.toml").is_file() and "PYTHONPATH" not in workflow["env"], name
        for job_name, job in workflow["jobs"].items():
            runs = [s.get("run", "") for s in job.get("steps", [])]
            if any("fuselet_build" in r for r in runs):
                assert "python -m pip install $PACKAGING_TOOL" in runs, f"{name}: job {job_name}"


def test_render_step_runs_and_splits_the_matrix_into_waves(packages, tmp_path, conda_forge_jobs):
    """Run the matrix job's render step as CI does (bash + jq), with a fake $GITHUB_OUTPUT."""
    if not shutil.which("jq"):
        pytest.skip("jq is not installed (it is on GitHub's runners)")
    step = _step(packages["jobs"]["matrix"], "Render the build jobs")
    out, summary = tmp_path / "github_output", tmp_path / "summary.md"
    # a path given to fuselet-build is relative to the working directory: CI's is the checkout
    variants = str(ROOT / "variants/conda-forge.yaml")
    env = {
        **os.environ,
        **step["env"],
        "VARIANTS": variants,
        "PYTHONPATH": str(ROOT / "python"),
        "FUSELET_ROOT": str(ROOT),
        "GITHUB_OUTPUT": str(out),
        "GITHUB_STEP_SUMMARY": str(summary),
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
    }
    proc = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", step["run"]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    waves = {k: json.loads(outputs[k]) for k in FAN_OUT.values()}
    ids = [j["id"] for jobs in waves.values() for j in jobs]
    assert sorted(ids) == sorted(j.key for j in conda_forge_jobs), "the waves must cover every job exactly once"
    assert {j["name"] for j in waves["core"]} == {"libfuselet"} and {j["name"] for j in waves["python"]} == {"fuselet"}
    for jobs in waves.values():
        assert jobs, "an empty wave makes GitHub reject its matrix"
        assert all({"id", "subdir", "abi"} <= set(j) and "variant" not in j for j in jobs)
    assert outputs["variants"] == variants
    assert summary.read_text().count("\n") == len(ids) + 2


# --- test.yml ------------------------------------------------------------------------------------


def test_pull_requests_run_make_test():
    wf = _load("test.yml")
    assert "pull_request" in wf["on"]
    job = wf["jobs"]["test"]
    assert job["runs-on"] == "ubuntu-latest"
    assert "make test" in [s.get("run") for s in job["steps"]]


def test_a_failed_variant_does_not_skip_the_later_waves_or_the_channel(packages):
    """GitHub skips a job whose `needs` failed unless its `if` says otherwise: one failing variant
    would leave every binding unbuilt and the channel (and verify's verdict) never made."""
    for name in ("build-python", "build", "channel"):
        cond = str(packages["jobs"][name].get("if", ""))
        assert "!cancelled()" in cond and "needs.matrix.result == 'success'" in cond, (name, cond)


@pytest.mark.parametrize(
    "path",
    [
        "csrc/core/src/norm.cc",
        "python/fuselet/torch/norm.py",
        "CMakeLists.txt",
        "cmake/FuseletPython.cmake",
        "pyproject.toml",
        "recipe/recipe.yaml",
        "variants/conda-forge.yaml",
        "tools/fuselet-build/src/fuselet_build/build.py",
    ],
)
def test_pull_requests_that_change_a_package_build_the_packages(packages, path):
    import fnmatch

    patterns = packages["on"]["pull_request"]["paths"]
    assert (ROOT / path).exists(), path
    assert any(fnmatch.fnmatch(path, p.replace("**", "*")) for p in patterns), (path, patterns)
