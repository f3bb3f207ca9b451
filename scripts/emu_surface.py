"""The CUDA the kernels may use: what fuselet's CUDA emulator implements (csrc/emu).

    python scripts/emu_surface.py [FILE...]    (scripts/lint.sh's `emu` check)

Scans the CUDA sources of the core (csrc/core/src/cuda/*.cu, *.cuh; or the FILEs given) for a
construct the emulator does not implement, and fails naming the file, the line and the
construct: using one in a kernel means adding it to the emulator first, with a test of its own
(tests/emu/test_simt.cc). Comments and strings are not read.
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNELS = ROOT / "csrc" / "core" / "src" / "cuda"
# The one file that may spell out CUDA's own launch and shared-memory syntax: the launch helper
# and the shared-memory macros that the emulator replaces.
HELPERS = {"common.cuh"}

# (pattern, what it is): the CUDA the emulator does not implement.
NOT_EMULATED = [
    (r"\batomic[A-Z]\w*\s*\(", "atomics"),
    (r"\b__syncwarp\b", "__syncwarp"),
    (r"\b__(ballot|any|all|activemask|match_any|match_all|reduce_\w+)(_sync)?\b", "warp votes and matches"),
    (r"\b__shfl(_up|_down)?(_sync)?\b|\b__shfl\b", "shuffles other than __shfl_xor_sync"),
    (r"\b__syncthreads_(count|and|or)\b", "barriers with a predicate"),
    (r"\bcooperative_groups\b|\bcg::|\bthis_grid\b|\bthis_thread_block\b", "cooperative groups"),
    (r"\bcp\.async\b|\b__pipeline_\w+|\bmemcpy_async\b|\bcuda::barrier\b|\bcuda::pipeline\b", "asynchronous copies"),
    (r"\basm\s*(volatile\s*)?\(|\b__asm__\b", "inline PTX"),
    (r"\b__ld(g|cg|ca|cs|lu|cv)\b|\b__st(wb|cg|cs|wt)\b", "cache-hinted loads and stores"),
    (r"\b__threadfence(_block|_system)?\b", "memory fences"),
    (r"\b(clock|clock64|__nanosleep|__globaltimer)\s*\(", "clocks and sleeps"),
    (r"\b__constant__\b|\b__managed__\b|\btex\w*\s*<|\bsurf\w*\s*<|\bcudaTextureObject_t\b", "constant, managed, texture memory"),
    (r"\bgrid\.sync\b|\bcudaLaunchCooperativeKernel\b|\bcudaLaunchKernel\b", "launches other than launch_kernel"),
]
# Outside common.cuh: the raw syntax its helpers wrap.
RAW = [
    (r"<<<", "a raw <<<...>>> launch (use launch_kernel)"),
    (r"\b__shared__\b", "a raw __shared__ declaration (use FUSELET_SHARED / FUSELET_DYNAMIC_SHARED)"),
]


def code_lines(text: str) -> list[str]:
    """The lines of `text` with comments and string literals blanked (line numbers kept)."""
    out = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.S)
    out = re.sub(r"//[^\n]*", "", out)
    out = re.sub(r'"(\\.|[^"\\\n])*"', '""', out)
    return out.split("\n")


def scan(path: pathlib.Path) -> list[str]:
    """'FILE:LINE: construct (the line)' for each construct the emulator lacks."""
    rules = NOT_EMULATED + ([] if path.name in HELPERS else RAW)
    found = []
    source = path.read_text().split("\n")
    for number, line in enumerate(code_lines(path.read_text()), 1):
        for pattern, what in rules:
            if re.search(pattern, line):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(
                    f"{where}:{number}: {what}, which fuselet's CUDA emulator does not implement: {source[number - 1].strip()}"
                )
    return found


def main(argv: list[str]) -> int:
    files = [pathlib.Path(a).resolve() for a in argv] or sorted([*KERNELS.glob("*.cu"), *KERNELS.glob("*.cuh")])
    found = [hit for f in files for hit in scan(f)]
    for hit in found:
        print(hit, file=sys.stderr)
    if found:
        print(
            "emu: add the construct to the emulator (csrc/emu, with a test in tests/emu/test_simt.cc) and to "
            "scripts/emu_surface.py's list of what it implements, or write the kernel without it",
            file=sys.stderr,
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
