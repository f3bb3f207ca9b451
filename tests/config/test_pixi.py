"""pixi.toml, checked statically (pixi itself need not be installed): the pixi 0.77 schema,
environments and solve groups, tasks and their Makefile twins, the pixi-build package."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pixi.toml needs Python >= 3.11 (tomllib) or tomli")

from tests.config.conftest import ROOT, shared_file

# Commands a task may start with besides a script of the tree.
KNOWN_TOOLS = {"python", "pytest", "bash", "cmake", "ctest", "ruff", "rattler-build", "fuselet-build"}
# The tasks the front doors promise (README, docs/development.md: `pixi run test` / `make test`, ...).
REQUIRED_TASKS = {"build", "test", "bench", "lint", "docs", "packages", "matrix"}


@pytest.fixture(scope="module")
def pixi():
    with open(ROOT / "pixi.toml", "rb") as f:
        return tomllib.load(f)


def _validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(shared_file("schemas/pixi.schema.json").read_text())
    return jsonschema.validators.validator_for(schema)(schema)


def _schema_errors(validator, manifest) -> list[str]:
    return [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in validator.iter_errors(manifest)]


def test_pixi_toml_validates_against_the_pixi_schema(pixi):
    assert _schema_errors(_validator(), pixi) == []


def test_the_schema_check_has_teeth(pixi):
    """A misspelt key is caught: the validation above is not vacuous."""
    validator = _validator()
    bad = copy.deepcopy(pixi)
    bad["feature"]["test"]["dependncies"] = {"pytest": "*"}
    assert _schema_errors(validator, bad)


def test_no_deprecated_system_requirements(pixi):
    """CUDA is declared on named workspace platforms (pixi >= 0.71), not [system-requirements]."""
    assert "system-requirements" not in pixi
    assert not [name for name, f in pixi["feature"].items() if "system-requirements" in f]


# --- environments and solve groups ----------------------------------------------------------------


def _environments(pixi) -> dict[str, dict]:
    envs = {}
    for name, env in pixi["environments"].items():
        envs[name] = {"features": env} if isinstance(env, list) else env
    return envs


def _features_of(pixi, env: dict) -> list[dict]:
    """The feature tables an environment is made of, the default feature first."""
    default = {k: pixi[k] for k in ("dependencies", "constraints", "tasks", "activation") if k in pixi}
    chosen = [pixi["feature"][f] for f in env.get("features", [])]
    return chosen if env.get("no-default-feature") else [default, *chosen]


def _platform_names(pixi) -> dict[str, str]:
    """Workspace platform name -> conda subdir (bare subdirs name themselves)."""
    out = {}
    for p in pixi["workspace"]["platforms"]:
        if isinstance(p, str):
            out[p] = p
        else:
            out[p.get("name", p.get("platform"))] = p.get("platform", p.get("name"))
    return out


def _env_platforms(pixi, env: dict) -> set[str]:
    """pixi's rule: the intersection of the features' platforms; no `platforms` = the workspace's."""
    platforms = set(_platform_names(pixi))
    for feature in _features_of(pixi, env):
        if "platforms" in feature:
            platforms &= set(feature["platforms"])
    return platforms


def test_every_environment_uses_features_that_exist(pixi):
    features = set(pixi["feature"])
    for name, env in _environments(pixi).items():
        missing = set(env.get("features", [])) - features
        assert not missing, f"environment {name!r} uses undefined features {sorted(missing)}"


def test_the_environments_a_developer_works_in(pixi):
    envs = _environments(pixi)
    assert {"default", "torch", "jax", "cuda12", "cuda13", "lint", "packaging", "dist"} <= set(envs)
    assert {"build", "test", "lint", "torch", "jax"} <= set(envs["default"]["features"])


def test_feature_platforms_are_workspace_platforms(pixi):
    names = _platform_names(pixi)
    for name, feature in pixi["feature"].items():
        unknown = set(feature.get("platforms", [])) - set(names)
        assert not unknown, f"feature {name!r} names platforms {sorted(unknown)} that [workspace] does not declare"


def test_every_environment_has_a_platform(pixi):
    for name, env in _environments(pixi).items():
        assert _env_platforms(pixi, env), f"environment {name!r}: its features' platforms do not intersect"


def _specs(feature: dict) -> dict[str, str]:
    return {
        pkg: json.dumps(spec, sort_keys=True)
        for table in ("dependencies", "constraints")
        for pkg, spec in feature.get(table, {}).items()
    }


def test_every_solve_group_is_consistent(pixi):
    """Environments solved together agree: same platforms, same channels, and one spec per package
    (a package asked for differently by two features of one group, e.g. pytorch cpu* and cuda*,
    would make the group unsolvable or silently pick one flavor for all)."""
    groups: dict[str, list[str]] = {}
    for name, env in _environments(pixi).items():
        if "solve-group" in env:
            groups.setdefault(env["solve-group"], []).append(name)
    assert groups, "no solve groups: the CPU environments should share one"
    envs = _environments(pixi)
    for group, members in groups.items():
        platforms = {name: frozenset(_env_platforms(pixi, envs[name])) for name in members}
        assert len(set(platforms.values())) == 1, f"solve group {group!r}: platforms differ {platforms}"
        for name in members:
            extra = [c for f in _features_of(pixi, envs[name]) for c in f.get("channels", [])]
            assert not extra, f"solve group {group!r}: environment {name!r} adds channels {extra}"
        seen: dict[str, set[str]] = {}
        for name in members:
            for feature in _features_of(pixi, envs[name]):
                for pkg, spec in _specs(feature).items():
                    seen.setdefault(pkg, set()).add(spec)
        clashes = {pkg: sorted(specs) for pkg, specs in seen.items() if len(specs) > 1}
        assert not clashes, f"solve group {group!r}: packages specified differently {clashes}"


def test_cuda_features_agree_with_their_platform_and_the_variants(pixi):
    """cuda-version X.Y, a pytorch build cudaXY*, a platform declaring driver X, and X.Y in the
    CUDA variants of the public matrix."""
    variants = yaml.safe_load((ROOT / "variants/conda-forge.yaml").read_text())
    cuda_variants = {str(v) for v in variants["cuda_compiler_version"]} - {"None"}
    declared = {p["name"]: p for p in pixi["workspace"]["platforms"] if isinstance(p, dict)}
    cuda_features = {n: f for n, f in pixi["feature"].items() if "cuda-version" in f.get("dependencies", {})}
    assert set(cuda_features) == {"cuda12", "cuda13"}
    for name, feature in cuda_features.items():
        deps = feature["dependencies"]
        version = re.fullmatch(r"(\d+)\.(\d+)\.\*", deps["cuda-version"])
        assert version, f"{name}: cuda-version {deps['cuda-version']!r} is not X.Y.*"
        major, minor = version.groups()
        assert f"{major}.{minor}" in cuda_variants, f"{name}: CUDA {major}.{minor} is not in variants/conda-forge.yaml"
        assert name == f"cuda{major}"
        assert deps["pytorch"]["build"] == f"cuda{major}{minor}*"
        assert "cuda-nvcc" in deps
        (platform,) = feature["platforms"]
        assert str(declared[platform]["cuda"]) == major, f"{name}: platform {platform} declares CUDA {declared[platform]['cuda']}"
        assert feature["activation"]["env"]["FUSELET_CUDA"] == "ON"


def test_cpu_frameworks_are_cpu_builds(pixi):
    assert pixi["feature"]["torch"]["dependencies"]["pytorch"]["build"] == "cpu*"
    assert pixi["feature"]["jax"]["dependencies"]["jaxlib"]["build"] == "cpu*"


def _tool_paths():
    return pytest.importorskip(
        "fuselet_build.paths", reason="fuselet-build is not installed here (pip install -e tools/fuselet-build)"
    )


def test_the_offline_feature_points_at_the_seeded_channel(pixi):
    """The offline channel `fuselet-build seed` writes and the output channel of its builds."""
    paths = _tool_paths()
    channels = [c["channel"] if isinstance(c, dict) else c for c in pixi["feature"]["offline"]["channels"]]
    assert f"./{paths.OFFLINE_CHANNEL}" in channels and f"./{paths.OUTPUT}" in channels


# --- tasks ----------------------------------------------------------------------------------------


def _tasks(pixi) -> dict[str, dict]:
    """Every task of the manifest (default feature, features, targets), as inline tables."""
    tables = [pixi.get("tasks", {})]
    tables += [f.get("tasks", {}) for f in pixi.get("feature", {}).values()]
    tables += [t.get("tasks", {}) for t in pixi.get("target", {}).values()]
    tables += [t.get("tasks", {}) for f in pixi.get("feature", {}).values() for t in f.get("target", {}).values()]
    out = {}
    for table in tables:
        for name, task in table.items():
            out[name] = {"cmd": task} if isinstance(task, str) else ({"depends-on": task} if isinstance(task, list) else task)
    return out


def _makefile_recipes() -> dict[str, str]:
    """Makefile target -> its recipe (the one command line under it)."""
    recipes, target = {}, None
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([a-z][a-z-]*):", line)
        if m:
            target = m.group(1)
            continue
        if line.startswith("\t") and target and line.strip():
            assert target not in recipes, f"Makefile target {target!r} has more than one command"
            recipes[target] = line.strip()
    return recipes


def _normalize(cmd: str) -> str:
    # `$(ARGS)` is make's way to pass arguments on; pixi appends the arguments of `pixi run`.
    return " ".join(cmd.replace("$(ARGS)", "").split())


def test_the_promised_tasks_exist(pixi):
    assert REQUIRED_TASKS <= set(_tasks(pixi))
    assert REQUIRED_TASKS <= set(_makefile_recipes())


def test_every_task_has_a_description(pixi):
    for name, task in _tasks(pixi).items():
        assert task.get("description", "").strip(), f"task {name!r} has no description"


def test_every_task_command_exists(pixi):
    for name, task in _tasks(pixi).items():
        if "cmd" not in task:
            continue
        cmd = task["cmd"] if isinstance(task["cmd"], str) else " ".join(task["cmd"])
        first = shlex.split(cmd)[0]
        if "/" in first:
            path = ROOT / first
            assert path.is_file(), f"task {name!r}: {first} does not exist"
            assert os.access(path, os.X_OK), f"task {name!r}: {first} is not executable"
        else:
            assert first in KNOWN_TOOLS, f"task {name!r} starts with {first!r}: neither a script of the tree nor a known tool"


def test_tasks_and_make_targets_of_one_name_run_the_same_command(pixi):
    """No command written twice: `pixi run X` and `make X` run the same script."""
    recipes = _makefile_recipes()
    shared = set(_tasks(pixi)) & set(recipes)
    assert REQUIRED_TASKS <= shared
    for name in sorted(shared):
        cmd = _tasks(pixi)[name]["cmd"]
        assert _normalize(cmd) == _normalize(recipes[name]), f"pixi task {name!r} runs {cmd!r}, make runs {recipes[name]!r}"


def test_tasks_default_environments_exist(pixi):
    envs = set(_environments(pixi))
    for name, task in _tasks(pixi).items():
        if "default-environment" in task:
            assert task["default-environment"] in envs, f"task {name!r}: no environment {task['default-environment']!r}"


# --- fuselet as a pixi-build source package ---------------------------------------------------------


def _recipe_outputs() -> set[str]:
    recipe = yaml.safe_load((ROOT / "recipe/recipe.yaml").read_text())
    return {o["package"]["name"] for o in recipe["outputs"] if "package" in o}


def test_the_package_is_built_from_the_recipe_by_rattler_build(pixi):
    assert "pixi-build" in pixi["workspace"]["preview"]
    build = pixi["package"]["build"]
    assert build["backend"]["name"] == "pixi-build-rattler-build"
    recipe = build["config"]["recipe"]
    assert (ROOT / recipe).is_file(), f"[package.build.config] recipe = {recipe!r} does not exist"
    assert recipe == _tool_paths().RECIPE


def test_build_variant_files_exist(pixi):
    files = pixi["workspace"]["build-variants-files"]
    assert files
    for f in files:
        assert (ROOT / f).is_file(), f"build-variants-files: {f} does not exist"


def test_source_dependencies_name_outputs_of_the_recipe(pixi):
    """`fuselet-torch = { path = "." }` must be something the recipe at "." produces."""
    outputs = _recipe_outputs()
    found = []
    for name, feature in pixi["feature"].items():
        for pkg, spec in feature.get("dependencies", {}).items():
            if isinstance(spec, dict) and "path" in spec:
                assert spec["path"] == ".", f"feature {name!r}: {pkg} from {spec['path']!r}, the package lives at '.'"
                assert pkg in outputs, f"feature {name!r}: {pkg} is not an output of recipe/recipe.yaml ({sorted(outputs)})"
                found.append(pkg)
    assert {"fuselet-torch", "fuselet-jax"} <= set(found)


def test_every_environment_that_runs_the_tests_has_the_packaging_tool(pixi):
    """`pixi run -e <env> test` runs scripts/test.sh, which seeds, builds and verifies the conda
    packages with fuselet-build: an environment without the packaging feature aborts there."""
    test_sh = (ROOT / "scripts/test.sh").read_text()
    assert "scripts/packages.sh" in test_sh and "tools/fuselet-build/tests" in test_sh
    assert pixi["tasks"]["test"]["cmd"] == "scripts/test.sh"
    for name, env in _environments(pixi).items():
        if "test" in env.get("features", []):
            assert "packaging" in env["features"], f"`pixi run -e {name} test` would abort: no fuselet-build there"


def test_cuda_features_use_the_compilers_and_frameworks_of_the_variants(pixi):
    """The gcc each CUDA is built with on conda-forge (variants/conda-forge.yaml), and every
    pytorch minor of the variants that conda-forge has in that flavor (conda-forge-snapshot.yaml)."""
    variants = yaml.safe_load((ROOT / "variants/conda-forge.yaml").read_text())
    snap = yaml.safe_load((ROOT / "variants/conda-forge-snapshot.yaml").read_text())
    gcc = dict(zip(map(str, variants["cuda_compiler_version"]), variants["cxx_compiler_version"]))
    for name in ("cuda12", "cuda13"):
        feature = pixi["feature"][name]
        cuda = feature["dependencies"]["cuda-version"].removesuffix(".*")
        assert feature["constraints"]["gxx_linux-64"] == f"{gcc[cuda]}.*", name
        flavor = "cuda" + cuda.replace(".", "")
        wanted = [t for t in map(str, variants["pytorch"]) if flavor in snap["pytorch"]["versions"][t]["flavors"]]
        minors = sorted(tuple(map(int, t.split("."))) for t in wanted)
        (lo_major, lo_minor), (hi_major, hi_minor) = minors[0], minors[-1]
        spec = feature["dependencies"]["pytorch"]["version"]
        assert spec == f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}", (name, spec, wanted)
