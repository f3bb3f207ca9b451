"""What nvcc compiled each CUDA kernel to, against how the tests launch it.

    python scripts/cuda_resources.py BUILD_LOG [--launches FILE] [--out FILE]

BUILD_LOG: the output of a CUDA build with nvcc's --resource-usage (scripts/cuda-build.sh): for
each kernel and architecture, its registers per thread, static shared memory, stack and spills.
--launches: the emulator's record of the launches of the core's CUDA tests
(FUSELET_EMU_LAUNCHES, scripts/emu-test.sh): each kernel's most threads per block and dynamic
shared memory. Writes the table (markdown) to --out (default: stdout) and fails when a launch
needs more than the compiled kernel allows on its architecture: registers x threads above the
65536 registers of a block, static + dynamic shared memory above the opt-in limit, more than
1024 threads; and, given the launches, when a compiled kernel instance is never launched by the
tests (an instantiation no test runs). A spill is flagged in the table.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import subprocess
import sys

REGISTERS_PER_BLOCK = 65536
SHARED_OPTIN = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90": 227 * 1024, "sm_100": 227 * 1024}

ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '(\S+)' for '(sm_\d+a?)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?")


def demangle(names: list[str]) -> dict[str, str]:
    """mangled -> the kernel's name as the emulator records it (no return type, no parameters)."""
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    result = {}
    for mangled, text in zip(names, out.splitlines()):
        text = text.removeprefix("void ")
        depth = 0
        for i, c in enumerate(text):
            depth += c == "<"
            depth -= c == ">"
            if c == "(" and depth == 0 and i > 0 and text[i - 1] != ":":
                text = text[:i]
                break
        result[mangled] = text
    return result


def parse_log(text: str) -> list[dict]:
    """One record per kernel and architecture: mangled, arch, registers, smem, stack, spills."""
    kernels, current = {}, None
    for line in text.splitlines():
        if m := ENTRY.search(line):
            current = kernels.setdefault((m.group(1), m.group(2)), {"mangled": m.group(1), "arch": m.group(2)})
        elif current is not None and (m := FRAME.search(line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current is not None and (m := USED.search(line)) and "registers" in line:
            current.update(registers=int(m.group(1)), smem=int(m.group(2) or 0))
    return [k for k in kernels.values() if "registers" in k]


def parse_launches(path: pathlib.Path | None) -> dict[str, tuple[int, int, int]]:
    """name -> (most threads, most dynamic shared memory, launches), over every test process."""
    launches: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    if path is None or not path.exists():
        return {}
    for line in path.read_text().splitlines():
        threads, smem, count, name = line.split(" ", 3)
        rec = launches[name]
        rec[0], rec[1], rec[2] = max(rec[0], int(threads)), max(rec[1], int(smem)), rec[2] + int(count)
    return {k: tuple(v) for k, v in launches.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=pathlib.Path)
    parser.add_argument("--launches", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    kernels = parse_log(args.log.read_text(errors="replace"))
    if not kernels:
        print(f"cuda-resources: no ptxas resource lines in {args.log} (built without --resource-usage?)", file=sys.stderr)
        return 1
    names = demangle(sorted({k["mangled"] for k in kernels}))
    launches = parse_launches(args.launches)
    rows, problems, spills, unlaunched = [], [], [], set()
    for k in sorted(kernels, key=lambda k: (names[k["mangled"]], k["arch"])):
        name = names[k["mangled"]]
        threads, dyn, count = launches.get(name, (0, 0, 0))
        notes = []
        if k.get("spill_stores") or k.get("spill_loads"):
            notes.append("SPILLS")
            spills.append(f"{name} ({k['arch']})")
        if launches and count == 0:
            unlaunched.add(name)
            notes.append("not launched by the tests")
        if count:
            limit = SHARED_OPTIN.get(k["arch"].rstrip("a"), 227 * 1024)
            if k["registers"] * threads > REGISTERS_PER_BLOCK:
                problems.append(f"{name} ({k['arch']}): {threads} threads x {k['registers']} registers > {REGISTERS_PER_BLOCK}")
            if k["smem"] + dyn > limit:
                problems.append(f"{name} ({k['arch']}): {k['smem']} + {dyn} bytes of shared memory > {limit}")
            if threads > 1024:
                problems.append(f"{name}: {threads} threads per block")
            if problems and problems[-1].startswith(name):
                notes.append("TOO MANY RESOURCES")
        rows.append(
            f"| `{name.replace('fuselet::(anonymous namespace)::', '')}` | {k['arch']} | {k['registers']} | {k['smem']} | "
            f"{k.get('stack', 0)} | {k.get('spill_stores', 0)} / {k.get('spill_loads', 0)} | "
            f"{threads or '-'} | {dyn if count else '-'} | {', '.join(notes) or 'ok'} |"
        )
    head = [
        "# CUDA kernels: what nvcc compiled them to, and the tests' largest launch of each",
        "",
        "Written by `scripts/cuda_resources.py` (make test's CUDA compile check, `make cuda-build`): "
        "registers per thread, static shared memory, stack frame and spills as ptxas reports them "
        "(`nvcc --resource-usage`), beside the most threads per block and dynamic shared memory "
        "any launch of the core's CUDA tests asks for (recorded by the emulator, `make emu-test`).",
        "",
        f"{len(kernels)} kernel instances; {len(spills)} with spills; "
        f"{len(problems)} launches beyond what the compiled kernel allows; "
        f"{len(unlaunched)} kernels the tests never launch." + ("" if launches else " (no launch record given)"),
        "",
        "| kernel | arch | registers | static smem (B) | stack (B) | spill stores / loads (B) | max threads "
        "| max dynamic smem (B) | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    text = "\n".join(head + rows) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(
            f"cuda-resources: {len(kernels)} kernel instances, {len(spills)} with spills, {len(problems)} launches "
            f"beyond their kernel's resources, {len(unlaunched)} never launched: {args.out}"
        )
    else:
        print(text, end="")
    for p in problems:
        print(f"cuda-resources: {p}", file=sys.stderr)
    for s in spills:
        print(f"cuda-resources: spills: {s}", file=sys.stderr)
    for name in sorted(unlaunched):
        print(f"cuda-resources: never launched by the core's CUDA tests: {name}", file=sys.stderr)
    return 1 if problems or unlaunched else 0


if __name__ == "__main__":
    sys.exit(main())
