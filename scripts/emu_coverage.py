"""Line coverage of the CUDA kernels (csrc/core/src/cuda) under fuselet's CUDA emulator.

    python scripts/emu_coverage.py BUILD_DIR [--out FILE] [--min PERCENT]

Reads the gcov data the emulated build (FUSELET_CUDA_EMU_COVERAGE=ON) left after its tests,
writes a table per file and every line no test ran, each with its reason from
tests/emu/uncovered.txt, to FILE (default: stdout), and fails when the coverage is below
--min (default 95) or when a line that no test ran has no reason written down (or a reason
names a line that now runs: the list stays true).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNELS = ROOT / "csrc" / "core" / "src" / "cuda"
REASONS = ROOT / "tests" / "emu" / "uncovered.txt"


def reasons() -> dict[tuple[str, str], str]:
    """(file name, the line's text) -> why no test runs it, from tests/emu/uncovered.txt."""
    out = {}
    for n, line in enumerate(REASONS.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            name, text, why = (part.strip() for part in line.split(" | "))
        except ValueError:
            sys.exit(f"{REASONS}:{n}: expected 'FILE | THE LINE'S TEXT | REASON', got {line!r}")
        out[(name, text)] = why
    return out


def counts(build: pathlib.Path) -> dict[pathlib.Path, dict[int, int]]:
    """{kernel source: {line: times run}} over every object of the emulated kernels."""
    gcda = sorted(build.resolve().rglob("*.cu.cc.gcda"))
    if not gcda:
        sys.exit(f"emu-coverage: no gcov data under {build} (a build with FUSELET_CUDA_EMU_COVERAGE=ON, after its tests)")
    files: dict[pathlib.Path, dict[int, int]] = {}
    for data in gcda:
        done = subprocess.run(
            ["gcov", "--json-format", "--stdout", "--object-directory", str(data.parent), str(data)],
            capture_output=True,
            text=True,
            cwd=data.parent,
            check=True,
        )
        for doc in done.stdout.splitlines():
            if not doc.strip():
                continue
            for f in json.loads(doc)["files"]:
                path = pathlib.Path(f["file"]).resolve()
                if path.parent != KERNELS:
                    continue
                lines = files.setdefault(path, {})
                for line in f["lines"]:
                    lines[line["line_number"]] = lines.get(line["line_number"], 0) + line["count"]
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--min", type=float, default=95.0)
    args = parser.parse_args()
    why = reasons()
    used = set()
    report = ["| file | lines run | lines | coverage |", "|---|---|---|---|"]
    missing, total, ran = [], 0, 0
    uncovered = []
    for path, lines in sorted(counts(args.build).items()):
        source = path.read_text().splitlines()
        hit = sum(1 for c in lines.values() if c > 0)
        total += len(lines)
        ran += hit
        report.append(f"| {path.name} | {hit} | {len(lines)} | {100 * hit / len(lines):.1f} % |")
        for number in sorted(n for n, c in lines.items() if c == 0):
            text = source[number - 1].strip()
            reason = why.get((path.name, text))
            if reason is None:
                missing.append(f"{path.relative_to(ROOT)}:{number}: {text}")
            else:
                used.add((path.name, text))
            uncovered.append(f"- {path.name}:{number} `{text}`: {reason or 'NO REASON WRITTEN DOWN'}")
    percent = 100 * ran / max(total, 1)
    report.append(f"| all | {ran} | {total} | {percent:.1f} % |")
    report += ["", f"Lines no emulated test runs ({len(uncovered)}):", *uncovered]
    text = "\n".join(report) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text, end="")
    status = 0
    if percent < args.min:
        print(f"emu-coverage: {percent:.1f} % of the kernels' lines ran, below {args.min} %", file=sys.stderr)
        status = 1
    if missing:
        print("emu-coverage: lines no test runs, without a reason in tests/emu/uncovered.txt:", file=sys.stderr)
        print("\n".join(f"  {m}" for m in missing), file=sys.stderr)
        status = 1
    stale = sorted(set(why) - used)
    if stale:
        print("emu-coverage: tests/emu/uncovered.txt names lines that now run (or no longer exist):", file=sys.stderr)
        print("\n".join(f"  {name} | {line}" for name, line in stale), file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
