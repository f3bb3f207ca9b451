"""The per-call cost of the torch layer's stable-ABI build against its exact-ABI build, in the
same run: small tensors, where the call (dispatch, argument checks, output allocation) is most of
the time. A stable kernel is boxed (its arguments cross the C shim as StableIValues) and
allocates through torch_call_dispatcher; an exact kernel is called unboxed with ATen.

Each build runs in its own child processes (both register the `fuselet` op namespace): the exact
one installed in this Python, the stable one from --stable-site (default build/stable-abi/site,
made by scripts/stable-abi-test.sh). torch eager's own op is timed in the same children as the
floor of a call. Prints µs per call, median (min-max) over --processes children, and the
stable / exact ratio.

    python benchmarks/bench_stable_abi.py [--processes 5] [--stable-site DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parents[1]
CASES = ["rms_norm", "layer_norm", "swiglu", "softmax", "rope", "cross_entropy"]


def _calls(torch, ft):
    """{case: (fuselet call, torch eager call, the tensors that get gradients)}."""
    x = torch.randn(4, 64, requires_grad=True)
    w = torch.ones(64, requires_grad=True)
    b = torch.zeros(64, requires_grad=True)
    g = torch.randn(4, 128, requires_grad=True)
    q = torch.randn(1, 4, 2, 16, requires_grad=True)
    cos, sin = torch.randn(4, 16), torch.randn(4, 16)
    t = torch.randint(0, 64, (4,))
    F = torch.nn.functional

    def rotate(q):
        a, c = q[..., :8], q[..., 8:]
        return q * cos[:, None] + torch.cat([-c, a], -1) * sin[:, None]

    return {
        "rms_norm": (lambda: ft.rms_norm(x, w), lambda: F.rms_norm(x, (64,), w, 1e-6), (x, w)),
        "layer_norm": (lambda: ft.layer_norm(x, w, b), lambda: F.layer_norm(x, (64,), w, b), (x, w, b)),
        "swiglu": (lambda: ft.swiglu(g), lambda: F.silu(g[:, :64]) * g[:, 64:], (g,)),
        "softmax": (lambda: ft.softmax(x), lambda: torch.softmax(x, -1), (x,)),
        "rope": (lambda: ft.rope(q, cos, sin), lambda: rotate(q), (q,)),
        "cross_entropy": (lambda: ft.cross_entropy(x, t), lambda: F.cross_entropy(x, t), (x,)),
    }


def _per_call(fn, calls: int, batches: int = 7) -> float:
    """Median seconds per call of fn over `batches` timed batches of `calls` calls."""
    for _ in range(calls // 10):
        fn()
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def child(calls: int) -> None:
    import fuselet.torch as ft
    import torch

    torch.set_num_threads(1)
    out = {"abi": ft.BUILD_INFO["abi"], "torch": torch.__version__}
    for case, (fused, eager, params) in _calls(torch, ft).items():

        def fwd_bwd(f):
            def run():
                y = f()
                (y[0] if isinstance(y, tuple) else y).sum().backward()

            return run

        with torch.no_grad():
            out[f"{case}/fwd/fuselet"] = _per_call(fused, calls)
            out[f"{case}/fwd/eager"] = _per_call(eager, calls)
        out[f"{case}/fwd+bwd/fuselet"] = _per_call(fwd_bwd(fused), calls // 4)
        out[f"{case}/fwd+bwd/eager"] = _per_call(fwd_bwd(eager), calls // 4)
        for p in params:
            p.grad = None
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=5, help="child processes per build (default 5)")
    p.add_argument("--calls", type=int, default=2000, help="calls per timed forward batch (default 2000)")
    p.add_argument("--stable-site", type=Path, default=ROOT / "build" / "stable-abi" / "site")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.calls)
    if not (args.stable_site / "fuselet" / "torch" / "_build_info.json").exists():
        sys.exit(f"{args.stable_site}: no stable-ABI build there; make one with scripts/stable-abi-test.sh")
    envs = {"exact": dict(os.environ), "stable": {**os.environ, "PYTHONPATH": str(args.stable_site)}}
    runs = {abi: [] for abi in envs}
    for _ in range(args.processes):  # interleaved, so that a slow spell hits both builds
        for abi, env in envs.items():
            run = common.run_child(__file__, ["--child", "--calls", str(args.calls)], env=env)
            assert run["abi"] == abi, (abi, run["abi"])
            runs[abi].append(run)
    torch_version = runs["exact"][0]["torch"]
    print(f"torch layer per-call cost, exact vs stable ABI (torch {torch_version}, CPU, 1 thread, small tensors)")
    print(f"µs per call, median (min-max) over {args.processes} processes per build; ratio: stable / exact\n")
    header = f"{'op':<14} {'pass':<8} {'exact':>20} {'stable':>20} {'ratio':>6} {'torch eager':>20}"
    print(header)
    print("-" * len(header))
    ratios = []
    for case in CASES:
        for kind in ("fwd", "fwd+bwd"):
            key = f"{case}/{kind}"
            exact = [r[key + "/fuselet"] for r in runs["exact"]]
            stable = [r[key + "/fuselet"] for r in runs["stable"]]
            eager = [r[key + "/eager"] for r in runs["exact"] + runs["stable"]]
            ratio = statistics.median(stable) / statistics.median(exact)
            ratios.append(ratio)
            print(
                f"{case:<14} {kind:<8} {common.spread(exact, 1e6):>20} {common.spread(stable, 1e6):>20} "
                f"{ratio:>6.2f} {common.spread(eager, 1e6):>20}"
            )
    print(f"\nstable / exact, median over the rows: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
