"""The CUDA split packages of the offline channel, made from NVIDIA's wheels.

conda-forge ships the CUDA toolkit as split packages: `cuda-cudart` (libcudart.so.X) and
`cuda-cudart-dev` (headers, libcudart.so, a run_export on cuda-cudart), `cuda-nvrtc` /
`cuda-nvrtc-dev`, `nvtx-c` (NVTX v3 headers). A recipe that links the CUDA runtime needs them
in its host environment, and rattler-build's linkage check looks for libcudart.so.X in them.
The seed makes them from the wheels the CUDA torch already pulls in (nvidia-cuda-runtime,
nvidia-cuda-nvrtc, nvidia-nvtx) with a small multi-output rattler-build recipe (recipes/cuda),
so the run_exports and the symlinks are rattler-build's own.
"""

from __future__ import annotations

import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fuselet_build.buildlog import BuildLog
from fuselet_build.seed import wheels
from fuselet_build.seed.cache import Cache, Options, SeedError, tmpdir_env
from fuselet_build.seed.host import cuda_version_range
from fuselet_build.seed.wheels import WheelPlan

RECIPE = Path(__file__).parent / "recipes" / "cuda" / "recipe.yaml"

# wheel (conda name of the converted wheel) -> the folder of the extracted sources it fills
SOURCES = {"nvidia-cuda-runtime": "cudart", "nvidia-cuda-nvrtc": "nvrtc", "nvidia-nvtx": "nvtx"}
# package -> (source folder, subdir)
PACKAGES = {
    "cuda-cudart": ("cudart", "linux-64"),
    "cuda-cudart-dev": ("cudart", "linux-64"),
    "cuda-nvrtc": ("nvrtc", "linux-64"),
    "cuda-nvrtc-dev": ("nvrtc", "linux-64"),
    "nvtx-c": ("nvtx", "noarch"),
}


@dataclass(frozen=True)
class SplitPackage:
    """One CUDA split package, decided before any work (so the cache can be checked)."""

    name: str
    version: str
    subdir: str
    digest: str
    wheels: tuple[WheelPlan, ...]  # the runtime, nvrtc and nvtx wheels (all outputs share them)

    @property
    def build(self) -> str:
        return f"h{self.digest}_0"

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}-{self.build}.conda"


def plan_split(plans: list[WheelPlan]) -> list[SplitPackage]:
    """The split packages the wheels among `plans` allow ([] without a CUDA runtime wheel)."""
    by_name = {p.name: p for p in plans if p.name in SOURCES}
    if set(by_name) != set(SOURCES):
        return []
    versions = {SOURCES[n]: p.version for n, p in by_name.items()}
    src = tuple(by_name[n] for n in SOURCES)
    digest = wheels.short_hash(wheels.CONVERTER_VERSION, RECIPE.read_text(), [p.info.sha256 for p in src])
    return [SplitPackage(name, versions[folder], subdir, digest, src) for name, (folder, subdir) in PACKAGES.items()]


def extract_sources(split: SplitPackage, dest: Path) -> None:
    """The nvidia/cuXX/{include,lib} folder of each wheel into dest/<cudart|nvrtc|nvtx>."""
    for plan in split.wheels:
        folder = dest / SOURCES[plan.name]
        with zipfile.ZipFile(plan.info.path) as zf:
            # nvidia/<cuda>/{include,lib}/... -> <folder>/{include,lib}/...
            members = [
                (m, parts[2:])
                for m in zf.infolist()
                if not m.is_dir()
                and len(parts := m.filename.split("/")) > 3
                and parts[0] == "nvidia"
                and parts[2] in ("include", "lib")
            ]
            if not members:
                raise SeedError(f"{plan.info.path.name} has no nvidia/<cuda>/include or lib folder")
            for m, rel in members:
                out = folder.joinpath(*rel)
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(m) as s, open(out, "wb") as d:
                    shutil.copyfileobj(s, d, 1 << 20)


def make_split_package(cache: Cache, split: SplitPackage, opts: Options) -> Path:
    """Build one output of recipes/cuda (rattler-build) into the cache."""
    import rattler_build as rb

    work = cache.workdir(split.name)
    try:
        extract_sources(split, work / "src")
        runtime = next(p for p in split.wheels if p.name == "nvidia-cuda-runtime")
        mm, nxt = cuda_version_range(runtime.version)
        versions = {SOURCES[p.name]: p.version for p in split.wheels}
        ctx = {
            "src": str(work / "src"),
            "cudart_version": versions["cudart"],
            "nvrtc_version": versions["nvrtc"],
            "nvtx_version": versions["nvtx"],
            "cuda_mm": mm,
            "cuda_next": nxt,
            "seed_hash": split.digest,
        }
        recipe = rb.Stage0Recipe.from_file(RECIPE)
        rendered = recipe.render(
            rb.VariantConfig(), rb.RenderConfig(platform=rb.PlatformConfig(target_platform="linux-64"), extra_context=ctx)
        )
        (variant,) = [r for r in rendered if r.recipe.package.name == split.name]
        log_path = cache.root / f"{split.name}-build.log"
        try:
            with tmpdir_env(work), BuildLog(log_path) as log:
                result = variant.run_build(
                    tool_config=rb.ToolConfiguration(compression_threads=opts.compression_threads, test_strategy="skip"),
                    output_dir=work / "out",
                    channels=[],
                    progress_callback=log,
                    package_format=f"conda:{opts.compression_level}",
                )
        except Exception as exc:
            raise SeedError(
                f"building {split.name} from {runtime.info.path.name} and its siblings failed: {exc}\n  log: {log_path}"
            ) from exc
        return cache.store(Path(result.packages[0]), split.subdir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
