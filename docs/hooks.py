"""mkdocs hook: the pictures of benchmarks/results/ are served at results/<name>.png, read from
where the benchmarks write them (no copy in docs/)."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def on_files(files, config):
    for picture in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{picture.name}", abs_src_path=str(picture)))
    return files
