"""fuselet's main job, on an embedded default: a small transformers Llama built from a config (no
download), fused with `fuselet.torch.transformers.fuse`, trained a few AdamW steps beside the stock
model from the same weights and batches. Prints the losses side by side, the median step time and
the peak memory of each (each model trains in a child process of its own: its peak resident set
above what the process held before the first step), then the conda package of fuselet that fits
this environment.

    python scripts/demo.py [--steps 6] [--layers 2] [--hidden 256] [--vocab 16384] [--tokens 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(args, fused: bool) -> dict:
    """One model's run (in a child process): losses, step times, peak memory over the steps."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        vocab_size=args.vocab,
        max_position_embeddings=args.tokens,
    )
    config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(config)
    if fused:
        import fuselet.torch as ft

        model = ft.transformers.fuse(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (2, args.tokens // 2), generator=g) for _ in range(args.steps)]
    before = peak_rss_mib()
    losses, times = [], []
    for input_ids in batches:
        start = time.perf_counter()
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return {"losses": losses, "times": times, "peak_mib": peak_rss_mib() - before}


def conda_package() -> list[str]:
    """The fuselet conda packages that fit the frameworks of this environment, by build string
    (recipe/recipe.yaml: <flavor>_torch<XY>, <flavor>_ffi<NN>)."""
    lines = []
    try:
        import torch

        flavor = f"cuda{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        minor = "".join(torch.__version__.split("+")[0].split(".")[:2])
        lines.append(f'conda install -c <channel> "fuselet-torch=*={flavor}_torch{minor}_*"   # torch {torch.__version__}')
    except ImportError:
        lines.append("(no torch here: fuselet-torch brings the pytorch it was built for)")
    try:
        from fuselet import _guard

        running = _guard.running_jaxlib()
        ffi = "".join(map(str, running["ffi_api"]))
        lines.append(
            f'conda install -c <channel> "fuselet-jax=*=*_ffi{ffi}_*"           # jaxlib {running["jaxlib_version"]}, XLA FFI '
            + ".".join(map(str, running["ffi_api"]))
        )
    except ImportError:
        pass
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--tokens", type=int, default=1024, help="tokens per batch (2 sequences)")
    p.add_argument("--child", choices=("stock", "fused"), help=argparse.SUPPRESS)
    args = p.parse_args()
    for name in ("steps", "layers", "hidden", "vocab", "tokens"):
        if getattr(args, name) < 1 or (name == "hidden" and args.hidden % 64):
            rule = "a positive integer" + (" divisible by 64" if name == "hidden" else "")
            p.error(f"--{name}: expected {rule}, got {getattr(args, name)}")
    if args.child:
        print(json.dumps(train(args, args.child == "fused")))
        return

    import fuselet

    print(
        f"fuselet {fuselet.__version__}: a transformers Llama ({args.layers} layers, hidden {args.hidden}, "
        f"vocab {args.vocab}), {args.steps} AdamW steps of {args.tokens} tokens, stock and fused"
    )
    results = {}
    for name in ("stock", "fused"):
        argv = [sys.executable, __file__, "--child", name] + [
            f"--{k}={getattr(args, k)}" for k in ("steps", "layers", "hidden", "vocab", "tokens")
        ]
        out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if out.returncode != 0:
            sys.exit(f"the {name} model failed:\n{out.stderr[-3000:]}")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    stock, fused = results["stock"], results["fused"]
    print(f"\n{'step':>4}  {'stock loss':>10}  {'fused loss':>10}  {'|diff|':>8}")
    for i, (a, b) in enumerate(zip(stock["losses"], fused["losses"]), 1):
        print(f"{i:>4}  {a:>10.5f}  {b:>10.5f}  {abs(a - b):>8.1e}")
    # the first step allocates the optimizer state: time the rest
    t_stock, t_fused = (statistics.median(r["times"][1:] or r["times"]) * 1e3 for r in (stock, fused))
    print(f"\n{'':<22}{'stock':>10}{'fused':>10}{'fused/stock':>13}")
    print(f"{'step time (median)':<22}{t_stock:>8.0f}ms{t_fused:>8.0f}ms{t_fused / t_stock:>13.2f}")
    print(
        f"{'peak memory (RSS)':<22}{stock['peak_mib']:>7.0f}MiB{fused['peak_mib']:>7.0f}MiB"
        f"{fused['peak_mib'] / max(stock['peak_mib'], 1e-9):>13.2f}"
    )
    worst = max(abs(a - b) for a, b in zip(stock["losses"], fused["losses"]))
    print(
        f"\nlosses agree to {worst:.1e} over {args.steps} steps (float32; the fused loss never makes the [tokens, vocab] logits)"
    )
    print("\nThe conda package of fuselet for this environment:")
    for line in conda_package():
        print("  " + line)
    if worst > 1e-3:
        sys.exit(f"the fused model's losses differ from the stock model's by {worst:.1e}")


if __name__ == "__main__":
    main()
