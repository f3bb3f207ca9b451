"""The recipe and the variant matrices: schema, render counts (additive build cost),
build strings and pins, from rattler-build's own render."""

from __future__ import annotations

import collections
import itertools
import json
import re

import pytest
import yaml

from tests.config.conftest import ROOT, shared_file
from tests.version import source_version

VERSION = source_version()


def test_recipe_validates_against_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(shared_file("schemas/recipe.schema.json").read_text())
    recipe = yaml.safe_load((ROOT / "recipe/recipe.yaml").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.validators.validator_for(schema)(schema).iter_errors(recipe)]
    assert errors == []


def test_recipe_names_the_schema_for_editors():
    assert (ROOT / "recipe/recipe.yaml").read_text().startswith("# yaml-language-server: $schema=")


def _variants(name):
    return yaml.safe_load((ROOT / "variants" / name).read_text())


def _by_name(jobs):
    out = {}
    for j in jobs:
        out.setdefault(j.name, []).append(j)
    return out


def test_offline_matrix_is_additive(offline_jobs):
    v = _variants("offline.yaml")
    cuda, torch, jaxlib = (len(v[k]) for k in ("cuda_compiler_version", "pytorch", "jaxlib"))
    jobs = _by_name(offline_jobs)
    # cuda and pytorch are zipped here (cpu + 2.13, cuda 13.0 + 2.14): one exact-ABI torch per cuda
    # flavor, and one stable-ABI torch per cuda flavor.
    assert sorted((j.variant["cuda_compiler_version"], j.variant["torch_abi"]) for j in jobs["fuselet-torch"]) == sorted(
        itertools.product(map(str, v["cuda_compiler_version"]), ("exact", "stable"))
    )
    assert len(jobs["fuselet-jax"]) == cuda * jaxlib  # not x pytorch
    assert len(jobs["libfuselet"]) == cuda  # the core: once per CUDA variant, not per python/framework
    assert len(jobs["fuselet"]) == 1  # noarch
    assert torch == 2


def test_conda_forge_matrix_counts(conda_forge_jobs):
    """One exact-ABI fuselet-torch per CUDA flavor x pytorch minor, one stable-ABI fuselet-torch per
    CUDA flavor (6 -> 9 with the stable builds) and one fuselet-jax per CUDA flavor x XLA FFI
    level: none varies with python (their libraries link no Python) nor with the other
    framework."""
    v = _variants("conda-forge.yaml")
    cudas = [str(c) for c in v["cuda_compiler_version"]]
    jobs = _by_name(conda_forge_jobs)
    # conda-forge has every pytorch of the file in every CUDA flavor (conda-forge-snapshot.yaml)
    expected_torch = {(c, p, "exact") for c, p in itertools.product(cudas, v["pytorch"])}
    expected_torch |= {(c, v["pytorch_stable_host"][0], "stable") for c in cudas}  # per flavor, not per pytorch
    got_torch = [
        (j.variant["cuda_compiler_version"], j.variant["pytorch"], j.variant["torch_abi"]) for j in jobs["fuselet-torch"]
    ]
    assert sorted(got_torch) == sorted(expected_torch)
    jaxlib_cuda = str(v["jaxlib_cuda"][0]).split(",")  # CUDA versions with a CUDA jaxlib on conda-forge
    expected_jax = {(c, j) for c, j in itertools.product(cudas, v["jaxlib"]) if c == "None" or c in jaxlib_cuda}
    got_jax = [(j.variant["cuda_compiler_version"], j.variant["jaxlib"]) for j in jobs["fuselet-jax"]]
    assert sorted(got_jax) == sorted(expected_jax)
    assert len(jobs["libfuselet"]) == len(cudas)
    assert (len(jobs["fuselet-torch"]), len(jobs["fuselet-jax"])) == (9, 4)  # the matrix table of docs/install.md
    for name, other in (("fuselet-torch", "jaxlib"), ("fuselet-jax", "pytorch")):
        for j in jobs[name]:
            assert other not in j.variant and "python" not in j.variant, (j.key, j.variant)
            assert "_py" not in j.build_string, j.build_string


def test_conda_forge_matrix_follows_the_global_pins():
    pins = yaml.safe_load(re.sub(r"#.*", "", shared_file("anchors/conda-forge-pinning.yaml").read_text()))
    ours = _variants("conda-forge.yaml")
    assert {str(p).split(".*")[0] for p in pins["python"] if "3.14" not in str(p)} == set(ours["python"])
    assert str(pins["pytorch"][0]) in ours["pytorch"]
    assert set(map(str, pins["cuda_compiler_version"])) <= set(map(str, ours["cuda_compiler_version"]))


def test_build_strings_say_what_is_inside(offline_jobs):
    strings = {j.name: [] for j in offline_jobs}
    for j in offline_jobs:
        strings[j.name].append(j.build_string)
    # no python part: one framework package serves every python
    assert any(re.fullmatch(r"cpu_torch213_h[0-9a-f]{7}_0", s) for s in strings["fuselet-torch"])
    assert any(re.fullmatch(r"cuda130_torch214_h[0-9a-f]{7}_0", s) for s in strings["fuselet-torch"])
    assert {s.split("_h")[0] for s in strings["fuselet-torch"] if "stable" in s} == {"cpu_stable", "cuda130_stable"}
    assert all(re.fullmatch(r"(cpu|cuda130)_ffi0(2_h[0-9a-f]{7}_200|3_h[0-9a-f]{7}_300)", s) for s in strings["fuselet-jax"])
    assert {s.split("_h")[0] for s in strings["fuselet-jax"]} == {"cpu_ffi02", "cpu_ffi03", "cuda130_ffi02", "cuda130_ffi03"}
    assert {s.split("_h")[0] for s in strings["libfuselet"]} == {"cpu", "cuda130"}


def test_framework_packages_pin_the_core_of_their_own_flavor(offline_jobs):
    cores = {j.variant["cuda_compiler_version"]: j.build_string for j in offline_jobs if j.name == "libfuselet"}
    for j in offline_jobs:
        if j.name in ("fuselet-torch", "fuselet-jax"):
            assert j.variant["libfuselet"] == f"{VERSION} {cores[j.variant['cuda_compiler_version']]}"


@pytest.mark.parametrize("variants", ["offline.yaml", "conda-forge.yaml"])
def test_plain_rattler_build_renders_the_recipe(variants):
    """No experimental feature: with rattler-build's defaults (as its CLI and conda-forge's CI run
    it), the recipe renders every variant, with the one version."""
    from rattler_build import RenderConfig, Stage0Recipe, VariantConfig

    stage0 = Stage0Recipe.from_file(str(ROOT / "recipe/recipe.yaml"))
    rendered = stage0.render(VariantConfig.from_files([str(ROOT / "variants" / variants)]), RenderConfig())
    assert rendered and {str(r.recipe.package.version) for r in rendered} == {VERSION}


def test_every_package_has_the_version_of_the_recipe(offline_jobs, conda_forge_jobs):
    """The recipe's context.version is the one version (CMake, pyproject.toml and fuselet.__version__
    read that line): no build file repeats it."""
    assert {j.version for j in offline_jobs + conda_forge_jobs} == {VERSION}
    for path in (
        "CMakeLists.txt",
        "pyproject.toml",
        "python/fuselet/__init__.py",
        "backend/fuselet_backend.py",
        "cmake/FuseletPython.cmake",
        "csrc/core/CMakeLists.txt",
        "pixi.toml",
    ):
        assert VERSION not in (ROOT / path).read_text(), f"{path} repeats the version instead of reading the recipe's"
    assert not (ROOT / "VERSION").exists(), "a second version file"


def test_rendered_run_requirements_pin_abi(matrix_mod):
    rendered = matrix_mod.render(ROOT / "recipe/recipe.yaml", [ROOT / "variants/offline.yaml"])
    for r in rendered:
        job = matrix_mod.job_of(r)
        run = [str(s) for s in r.recipe.requirements.run]
        if job.name == "fuselet-torch":
            flavor = "cpu" if job.variant["cuda_compiler_version"] == "None" else "cuda130"
            assert f"pytorch * {flavor}*" in run, run
            pin = "{'pin_compatible': {'name': 'pytorch', 'lower_bound': 'x.x.x', 'upper_bound': 'x.x'}}"
            if job.variant["torch_abi"] == "stable":
                # every torch of its flavor from the stable ABI's target on, no upper bound
                assert "pytorch >=2.12" in run and pin not in run, run
            else:
                # the torch minor range: >= the release compiled against, < the next minor
                assert pin in run, run
        if job.name == "fuselet-jax":
            assert f"jaxlib >={job.variant['jaxlib']},<{job.variant['jaxlib_below']}" in run, run
        if job.variant.get("cuda_compiler_version") == "13.0" and job.name != "fuselet":
            assert "__cuda" in run and any(s.startswith("cuda-version >=13.0,<14") for s in run), run


def test_the_stable_abi_build_is_the_one_taken_last(matrix_mod):
    """The stable-ABI fuselet-torch fits every torch of its flavor, also those an exact-ABI build
    fits: it is down-prioritized (a track feature) so that the solver takes the exact build where
    one fits; it is built for the oldest torch CMake's stable build targets, and the configure
    line passes both ABI and target."""
    for variants in ("offline.yaml", "conda-forge.yaml"):
        for r in matrix_mod.render(ROOT / "recipe/recipe.yaml", [ROOT / "variants" / variants]):
            job = matrix_mod.job_of(r)
            if job.name == "fuselet-torch":
                build = r.recipe.to_dict()["build"]
                stable = job.variant["torch_abi"] == "stable"
                assert build["variant"]["down_prioritize_variant"] == (1 if stable else 0), job.key
                assert ("_stable_h" in job.build_string) == stable, job.key
    cmake = (ROOT / "CMakeLists.txt").read_text()
    target = re.search(r'set\(FUSELET_TORCH_TARGET "([0-9.]+)"', cmake).group(1)
    assert f'torch_target: "{target}"' in _recipe_text()
    assert "-DFUSELET_TORCH_ABI=${{ torch_abi }} -DFUSELET_TORCH_TARGET=${{ torch_target }}" in _recipe_text()


def test_release_candidates_are_pinned_exactly(matrix_mod):
    """variants/prerelease.yaml over conda-forge.yaml: pytorch rc builds, exact pins, an `rc`
    build-string tag; the jax packages stay on released jaxlibs (conda-forge has no jax rc)."""
    rendered = matrix_mod.render(
        ROOT / "recipe/recipe.yaml", [ROOT / "variants/conda-forge.yaml", ROOT / "variants/prerelease.yaml"]
    )
    seen = set()
    for r in rendered:
        job = matrix_mod.job_of(r)
        run = [str(s) for s in r.recipe.requirements.run]
        if job.name == "fuselet-torch":
            assert "_torch214rc_h" in job.build_string, job.build_string
            assert "{'pin_compatible': {'name': 'pytorch', 'exact': True}}" in run, run
            seen.add(job.name)
        if job.name == "fuselet-jax":
            assert "rc" not in job.build_string and "dev" not in job.build_string
            seen.add(job.name)
    assert seen == {"fuselet-torch", "fuselet-jax"}


def test_the_prerelease_story_names_the_channels_that_carry_prereleases():
    text = (ROOT / "variants/prerelease.yaml").read_text()
    assert "conda-forge/label/pytorch_rc" in text and "FUSELET_TORCH_VERSION=" in text
    assert "download.pytorch.org/whl/nightly" in text
    assert not (ROOT / "variants/nightly.yaml").exists()
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        assert "nightly.yaml" not in page.read_text(), page


# --- what conda-forge needs of the recipe ---------------------------------------------------------


def _recipe_text():
    return (ROOT / "recipe/recipe.yaml").read_text()


def test_every_cmake_configure_passes_cmake_args():
    """conda-forge's compiler and nvcc activation scripts hand their settings (find-root paths,
    the CUDA toolkit's target folder) to CMake through ${CMAKE_ARGS}."""
    configures = [ln.strip() for ln in _recipe_text().splitlines() if re.search(r"-\s*cmake .*-S ", ln)]
    assert len(configures) == 4, configures
    assert all(ln.startswith("- cmake ${CMAKE_ARGS} ") for ln in configures), configures


def test_no_allowlist_hides_a_cuda_library():
    """A CUDA library a package links must come from a run dependency, never an allowlist."""
    recipe = yaml.safe_load(_recipe_text())
    for out in recipe["outputs"]:
        allow = out.get("build", {}).get("dynamic_linking", {}).get("missing_dso_allowlist", [])
        assert not [a for a in allow if re.search(r"cu|nv", a)], (out.get("package", out.get("staging")), allow)


def _rendered(matrix_mod, *variant_files):
    return [
        (matrix_mod.job_of(r), r.recipe.to_dict())
        for r in matrix_mod.render(ROOT / "recipe/recipe.yaml", [ROOT / "variants" / f for f in variant_files])
    ]


def test_the_cuda_core_links_the_cuda_runtime_of_a_package(matrix_mod):
    """cuda-cudart-dev in the core's host: its run_export makes libfuselet (and whatever inherits
    the core) depend on cuda-cudart, the package with libcudart.so.X."""
    for job, d in _rendered(matrix_mod, "offline.yaml"):
        if job.name != "libfuselet":
            continue
        (core,) = d["staging_caches"]
        host = [str(h) for h in core["requirements"].get("host", [])]
        if job.variant["cuda_compiler_version"] == "None":
            assert not [h for h in host if h.startswith("cuda")], host
        else:
            assert "cuda-cudart-dev" in host and "cuda-version 13.0.*" in host, host


def test_cuda_framework_packages_have_what_torchs_cmake_config_needs(matrix_mod):
    for job, d in _rendered(matrix_mod, "offline.yaml"):
        if job.name == "fuselet-torch" and job.variant["cuda_compiler_version"] != "None":
            host = [str(h) for h in d["requirements"]["host"]]
            assert {"cuda-cudart-dev", "cuda-nvrtc-dev", "nvtx-c", "cuda-version 13.0.*"} <= set(host), host
            assert any("nvcc" in str(b) for b in d["requirements"]["build"]), d["requirements"]["build"]


def test_libfuselet_exports_what_its_soname_promises(matrix_mod):
    """A downstream C++ package built against libfuselet must accept every build of the same
    x.y.z (other flavors, rebuilds); fuselet's own outputs keep exact pins between them."""
    for job, d in _rendered(matrix_mod, "offline.yaml"):
        if job.name == "libfuselet":
            (pin,) = d["requirements"]["run_exports"]["weak"]
            assert pin["pin_subpackage"]["name"] == "libfuselet"
            assert pin["pin_subpackage"].get("upper_bound") == "x.x.x" and not pin["pin_subpackage"].get("exact")
        if job.name in ("fuselet-torch", "fuselet-jax"):
            for kind in ("host", "run"):
                assert {"pin_subpackage": {"name": "libfuselet", "exact": True}} in d["requirements"][kind]


def test_fuselet_jax_pins_the_jaxlib_flavor(matrix_mod):
    """A CPU fuselet-jax registers no CUDA handlers: it must never be installed next to a CUDA
    jaxlib (nor a CUDA one next to a CPU jaxlib)."""
    seen = set()
    for job, d in _rendered(matrix_mod, "offline.yaml"):
        if job.name != "fuselet-jax":
            continue
        flavor = "cpu" if job.variant["cuda_compiler_version"] == "None" else "cuda"
        host, run = ([str(x) for x in d["requirements"][k]] for k in ("host", "run"))
        assert f"jaxlib =={job.variant['jaxlib']} {flavor}*" in host, host
        assert f"jaxlib * {flavor}*" in run, run
        seen.add(flavor)
    assert seen == {"cpu", "cuda"}


def test_framework_packages_ignore_conda_forges_python_values(matrix_mod, tmp_path):
    """Rendered with conda-forge's own python values (`3.10.* *_cpython`, ...), the framework
    packages still come once per CUDA x framework, with no python and no python_abi in their
    requirements; only the noarch fuselet names python (its python_min)."""
    pins = yaml.safe_load(re.sub(r"#.*", "", shared_file("anchors/conda-forge-pinning.yaml").read_text()))
    values = [str(p) for p in pins["python"] if "3.14" not in str(p)]
    override = tmp_path / "python.yaml"
    override.write_text(yaml.safe_dump({"python": values}))
    rendered = [
        (matrix_mod.job_of(r), r.recipe.to_dict())
        for r in matrix_mod.render(ROOT / "recipe/recipe.yaml", [ROOT / "variants/conda-forge.yaml", override])
    ]
    frameworks = [(job, d) for job, d in rendered if job.name in ("fuselet-torch", "fuselet-jax")]
    assert sorted(collections.Counter(job.name for job, _ in frameworks).items()) == [("fuselet-jax", 4), ("fuselet-torch", 9)]
    for job, d in frameworks:
        names = {str(r).split(" ")[0] for k in ("host", "run") for r in d["requirements"].get(k, [])}
        assert not names & {"python", "python_abi"}, (job.key, names)
    (noarch,) = [d for job, d in rendered if job.name == "fuselet"]
    assert any(str(r).startswith("python ") for r in noarch["requirements"]["run"])


def test_python_parts_are_tested_as_conda_forge_tests_them():
    """pip_check on (the packages carry dist-info), and the noarch package is tested on
    python_min (CFEP-25)."""
    recipe = yaml.safe_load(_recipe_text())
    for out in recipe["outputs"]:
        for test in out.get("tests", []):
            if "python" in test:
                assert test["python"].get("pip_check", True) is True, out["package"]["name"]
                if out["package"]["name"] == "fuselet":
                    assert test["python"].get("python_version") == "${{ python_min }}.*"


def test_cuda_13_is_built_with_the_compilers_conda_forge_pins():
    """conda-forge-pinning: gcc 15 for CPU builds; the CUDA 12.9 jobs keep gcc 14; the cuda130
    migration builds CUDA 13.0 with gcc 15 and glibc 2.28."""
    v = _variants("conda-forge.yaml")
    zipped = dict(
        zip(
            map(str, v["cuda_compiler_version"]),
            zip(v["c_compiler_version"], v["cxx_compiler_version"], map(str, v["c_stdlib_version"])),
        )
    )
    assert zipped == {"None": (15, 15, "2.17"), "12.9": (14, 14, "2.17"), "13.0": (15, 15, "2.28")}


def test_every_framework_a_variant_pins_exists_on_conda_forge(conda_forge_jobs):
    """variants/conda-forge.yaml may only name what conda-forge ships (conda-forge-snapshot.yaml,
    read in the feedstocks): a jaxlib or flavor it never built makes every job of it unsolvable."""
    snap = _variants("conda-forge-snapshot.yaml")
    pythons = {p.split(".*")[0] for p in snap["python"]["values"]}
    problems = []
    for j in conda_forge_jobs:
        cuda = str(j.variant.get("cuda_compiler_version", "None"))
        flavor = "cpu" if cuda == "None" else "cuda" + cuda.replace(".", "")
        if cuda != "None" and cuda not in snap["cuda"]["versions"]:
            problems.append(f"{j.key}: CUDA {cuda}")
        if "python" in j.variant and str(j.variant["python"]) not in pythons:
            problems.append(f"{j.key}: python {j.variant['python']}")
        if j.name == "fuselet-torch":
            entry = snap["pytorch"]["versions"].get(str(j.variant["pytorch"]))
            if entry is None or flavor not in entry["flavors"]:
                problems.append(f"{j.key}: pytorch {j.variant['pytorch']} {flavor}")
        if j.name == "fuselet-jax":
            jaxlib = str(j.variant["jaxlib"])
            entry = snap["jaxlib"]["versions"].get(jaxlib)
            if entry is None or flavor not in entry["flavors"]:
                problems.append(f"{j.key}: jaxlib {jaxlib} {flavor}")
            elif entry.get("ffi") != str(j.variant["jaxlib_ffi"]):
                problems.append(f"{j.key}: jaxlib {jaxlib} has XLA FFI {entry.get('ffi')}, not {j.variant['jaxlib_ffi']}")
            if jaxlib not in snap["jax"]["versions"]:
                problems.append(f"{j.key}: jax {jaxlib} (the host pins jax ==jaxlib)")
    assert not problems, problems


def test_each_ffi_level_is_built_against_its_oldest_jaxlib_on_conda_forge():
    snap = _variants("conda-forge-snapshot.yaml")
    ours = dict(zip(map(str, _variants("conda-forge.yaml")["jaxlib"]), map(str, _variants("conda-forge.yaml")["jaxlib_ffi"])))
    for jaxlib, ffi in ours.items():
        usable = [v for v, e in snap["jaxlib"]["versions"].items() if e.get("ffi") == ffi and v in snap["jax"]["versions"]]
        oldest = min(usable, key=lambda v: tuple(map(int, v.split("."))))
        assert jaxlib == oldest, f"FFI {ffi}: built against {jaxlib}, the oldest jaxlib+jax on conda-forge is {oldest}"


def test_the_compilers_are_those_of_the_snapshot():
    snap = _variants("conda-forge-snapshot.yaml")["cuda"]["compilers"]
    v = _variants("conda-forge.yaml")
    for cuda, gcc, stdlib in zip(map(str, v["cuda_compiler_version"]), v["c_compiler_version"], map(str, v["c_stdlib_version"])):
        assert (gcc, stdlib) == (snap[cuda]["gcc"], snap[cuda]["c_stdlib_version"]), cuda


def test_build_tools_come_from_the_build_environment():
    """cmake and ninja run on the build machine: in `host` they would have to exist for the host's
    python (a noarch package's host is python_min's) and break cross-compilation."""
    recipe = yaml.safe_load(_recipe_text())

    def names(entries):
        out = []
        for e in entries or []:
            out += names(e.get("then")) + names(e.get("else")) if isinstance(e, dict) else [str(e).split()[0]]
        return out

    for out in recipe["outputs"]:
        host = names(out.get("requirements", {}).get("host"))
        assert not {"cmake", "ninja"} & set(host), (out.get("package", out.get("staging")), host)


def _build_number(job) -> int:
    return int(job.build_string.rsplit("_", 1)[1])


def test_the_build_made_for_a_newer_jaxlib_has_the_higher_build_number(offline_jobs, conda_forge_jobs):
    """Every fuselet-jax of a flavor also accepts the jaxlibs of the newer FFI levels; the solver
    breaks the tie by build number, so it must grow with the jaxlib compiled against (by 100 per
    FFI level), while the outputs that never tie keep the recipe's own number."""
    for jobs in (offline_jobs, conda_forge_jobs):
        flavors = collections.defaultdict(list)
        for j in jobs:
            if j.name == "fuselet-jax":
                flavors[j.variant["cuda_compiler_version"]].append(j)
            else:
                assert _build_number(j) == 0, j.key
        for flavor, builds in flavors.items():
            builds.sort(key=lambda j: tuple(int(p) for p in str(j.variant["jaxlib"]).split(".")))
            numbers = [_build_number(j) for j in builds]
            assert len(builds) > 1 and numbers == sorted(set(numbers)), (flavor, [j.key for j in builds])
            for j in builds:
                major, minor = map(int, str(j.variant["jaxlib_ffi"]).split("."))
                assert _build_number(j) == 1000 * major + 100 * minor, j.key
