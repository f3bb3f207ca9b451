"""`fuselet-build matrix`: the packages each output produces, from rattler-build's render."""

from __future__ import annotations

import difflib
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fuselet_build.errors import UserError

# Variant keys that say which ABI a package is built for (shown in tables, used for CI jobs).
ABI_KEYS = ("cuda_compiler_version", "python", "pytorch", "jaxlib", "jaxlib_ffi")
# Keys of conda-forge's global pinning a variant file may carry for recipes that do not use them.
STANDARD_KEYS = {
    "c_compiler",
    "c_compiler_version",
    "cxx_compiler",
    "cxx_compiler_version",
    "c_stdlib",
    "c_stdlib_version",
    "cuda_compiler",
    "cuda_compiler_version",
    "fortran_compiler",
    "fortran_compiler_version",
    "python",
    "python_min",
    "target_platform",
    "zip_keys",
    "pin_run_as_build",
    "channel_sources",
    "channel_targets",
    "docker_image",
    "cdt_name",
}


@dataclass(frozen=True)
class Job:
    """One package to build: what rattler-build rendered for one variant of one output."""

    name: str
    version: str
    build_string: str
    subdir: str
    variant: dict = field(hash=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}-{self.build_string}"

    def abi(self) -> dict:
        return {k: str(self.variant[k]) for k in ABI_KEYS if k in self.variant}

    def to_json(self) -> dict:
        return {**asdict(self), "id": self.key, "abi": self.abi()}


def load_variants(paths: list[Path]):
    from rattler_build import VariantConfig

    for p in paths:
        if not p.is_file():
            raise UserError(f"--variants: no such variant file: {p}")
    try:
        return VariantConfig.from_files([str(p) for p in paths])
    except Exception as exc:  # rattler_build raises its own error types
        raise UserError(f"--variants: cannot read {', '.join(map(str, paths))}: {exc}") from exc


def render(recipe: Path, variant_files: list[Path], target_platform: str = "linux-64") -> list:
    """rattler-build's own render: the RenderedVariant list (duplicates removed)."""
    from rattler_build import RenderConfig, Stage0Recipe
    from rattler_build.tool_config import PlatformConfig

    if not recipe.is_file():
        raise UserError(f"--recipe: no such recipe: {recipe}")
    variants = load_variants(variant_files)
    try:
        stage0 = Stage0Recipe.from_file(str(recipe))
        # rattler-build's defaults (experimental features off), as its CLI and conda-forge render it
        rendered = stage0.render(variants, RenderConfig(platform=PlatformConfig(target_platform=target_platform)))
    except Exception as exc:
        typos = misspelled_keys(recipe.read_text(errors="replace"), list(variants.keys()))
        raise UserError(
            f"cannot render {recipe} with {', '.join(map(str, variant_files))}: {exc}" + "".join(f"\n  {t}" for t in typos)
        ) from exc
    used = set().union(*(dict(r.variant) for r in rendered))
    unused = [k for k in variants.keys() if k not in used and k not in STANDARD_KEYS]
    typos = misspelled_keys(recipe.read_text(errors="replace"), unused)
    if typos:
        raise UserError(f"--variants {', '.join(map(str, variant_files))}: " + "; ".join(typos))
    for key in unused:
        print(
            f"fuselet-build: warning: variant key `{key}` ({', '.join(map(str, variant_files))}) is used by no "
            f"output of {recipe}",
            file=sys.stderr,
        )
    unique, seen = [], set()
    for r in rendered:
        job = job_of(r)
        if job.key not in seen:
            seen.add(job.key)
            unique.append(r)
    return unique


def misspelled_keys(recipe_text: str, keys: list[str]) -> list[str]:
    """`key` is not a name the recipe uses, and one it uses is close: "did you mean" lines."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", recipe_text))
    out = []
    for key in keys:
        if key in words or key in STANDARD_KEYS:
            continue
        close = difflib.get_close_matches(key, sorted(words - set(keys)), n=1, cutoff=0.8)
        if close:
            out.append(f"variant key `{key}` is used nowhere in the recipe: did you mean `{close[0]}`?")
    return out


def job_of(rendered) -> Job:
    recipe = rendered.recipe
    variant = dict(rendered.variant)
    subdir = "noarch" if recipe.build.noarch else variant.get("target_platform", "linux-64")
    return Job(recipe.package.name, str(recipe.package.version), recipe.build.string, subdir, variant)


def jobs(recipe: Path, variant_files: list[Path], target_platform: str = "linux-64") -> list[Job]:
    return [job_of(r) for r in render(recipe, variant_files, target_platform)]


def select(items: list, select_: list[str] | None, key=lambda x: x.key) -> list:
    """The items whose job id contains one of the `select_` texts (all of them if none given)."""
    if not select_:
        return items
    chosen = [i for i in items if any(s in key(i) for s in select_)]
    if not chosen:
        raise UserError(f"--select: {select_} matches none of the rendered packages (see `fuselet-build matrix`)")
    return chosen


def counts(job_list: list[Job]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in job_list:
        out[j.name] = out.get(j.name, 0) + 1
    return out


def print_table(job_list: list[Job], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    # no python column: the framework packages serve every python, fuselet is noarch
    for col in ("package", "build string", "subdir", "cuda", "pytorch", "jaxlib (FFI)"):
        table.add_column(col)
    for j in job_list:
        a = j.abi()
        jax = f"{a['jaxlib']} ({a.get('jaxlib_ffi', '?')})" if "jaxlib" in a else ""
        cuda = a.get("cuda_compiler_version", "")
        table.add_row(j.name, j.build_string, j.subdir, "cpu" if cuda == "None" else cuda, a.get("pytorch", ""), jax)
    console = Console()
    console.width = max(console.width, 150)  # build strings stay whole in CI logs and pipes
    console.print(table)
    console.print("packages per output: " + ", ".join(f"{k} {v}" for k, v in counts(job_list).items()))


def to_json(job_list: list[Job]) -> str:
    return json.dumps([j.to_json() for j in job_list], indent=2, default=str)
