"""Per-device memory of a vocab-parallel LM-head loss in JAX (the head's rows sharded over a mesh
axis "model" of 2 and 4 CPU devices), one training step's loss (jax.value_and_grad to hidden and
the head under jax.jit), from XLA's compiled memory analysis (per device; nothing is run):

  gathered head    the head all-gathered (a sharding constraint to replicated inside jit) and
                   fuselet.jax.fused_linear_cross_entropy over all of it (what fuselet.jax did
                   with a vocab-sharded head before), dweight returned sharded
  sharded head     fuselet.jax.fused_linear_cross_entropy over the head sharded on V: each
                   device its rows [V / devices, H] and one [chunk, V / devices] logits buffer
  sharded logits   the logits hidden @ weight.T sharded on V and optax's formula
                   (jax.nn.log_softmax, the target's entry) partitioned by XLA: JAX's
                   counterpart of torch's loss_parallel()

hidden [N, H] and the target are replicated; dhidden is returned replicated, dweight sharded.
Columns: temp (XLA's working buffers during the step) and peak (arguments + outputs + temp -
aliased), MiB per device. Sizes are counted, not timed.

    python benchmarks/bench_vocab_parallel_jax.py [--tokens N --hidden H --vocab V] [--devices 2,4]
                                                  [--output PATH|none]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import common

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("gathered head", "sharded head", "sharded logits")


def child(args) -> None:
    import fuselet.jax as fj
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n, h, v, devices = args.tokens, args.hidden, args.vocab, args.devices
    mesh = jax.make_mesh((devices,), ("model",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:devices])
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    hidden = jax.ShapeDtypeStruct((n, h), jnp.float32, sharding=s())
    weight = jax.ShapeDtypeStruct((v, h), jnp.float32, sharding=s("model", None))
    target = jax.ShapeDtypeStruct((n,), jnp.int32, sharding=s())

    def gathered(x, w, t):
        return fj.fused_linear_cross_entropy(x, jax.lax.with_sharding_constraint(w, s()), t)

    def sharded(x, w, t):
        return fj.fused_linear_cross_entropy(x, w, t)

    def logits(x, w, t):
        z = jax.lax.with_sharding_constraint(jnp.dot(x, w.T), s(None, "model"))
        logp = jax.nn.log_softmax(z, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, t[:, None], axis=-1))

    out = {}
    for name, fn in zip(METHODS, (gathered, sharded, logits)):
        step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)), out_shardings=(s(), (s(), s("model", None))))
        m = step.lower(hidden, weight, target).compile().memory_analysis()
        peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
        out[name] = {"temp": m.temp_size_in_bytes, "peak": peak}
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--devices", default="2,4")
    p.add_argument(
        "--output", default=None, help="the table's file (default benchmarks/results/bench_vocab_parallel_jax-cpu.txt)"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.devices = int(args.devices)
        return child(args)
    mib = 2**20
    lines = [
        f"vocab-parallel LM-head loss in JAX, one step (value_and_grad): N {args.tokens}, H {args.hidden}, V {args.vocab}, "
        "float32 on CPU devices; MiB per device from XLA's compiled memory analysis (temp: working buffers; "
        "peak: arguments + outputs + temp)",
        f"the whole head is {args.vocab * args.hidden * 4 / mib:.0f} MiB, "
        f"the whole logits {args.tokens * args.vocab * 4 / mib:.0f} MiB",
    ]
    head = f"{'devices':<8}{'head rows/dev':>14}" + "".join(f"{m + ' temp':>22}{'peak':>8}" for m in METHODS)
    head += f"{'sharded/gathered peak':>23}"
    lines += [head, "-" * len(head)]
    for world in (int(w) for w in args.devices.split(",")):
        if args.vocab % world:
            p.error(f"--vocab: expected a multiple of every --devices value, got {args.vocab} and {world}")
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={world}", JAX_PLATFORMS="cpu")
        argv = ["--child", "--tokens", str(args.tokens), "--hidden", str(args.hidden), "--vocab", str(args.vocab)]
        argv += ["--devices", str(world)]
        proc = subprocess.run([sys.executable, __file__, *argv], env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        cells = "".join(f"{r[m]['temp'] / mib:>22.1f}{r[m]['peak'] / mib:>8.1f}" for m in METHODS)
        ratio = r["sharded head"]["peak"] / r["gathered head"]["peak"]
        lines.append(f"{world:<8}{args.vocab // world:>14}{cells}{ratio:>23.1%}")
    note = "sizes counted from the compiled memory analysis, not timed"
    default = RESULTS / "bench_vocab_parallel_jax-cpu.txt"
    common.write_table("\n".join(lines), args.output, default, "bench_vocab_parallel_jax.py", note)


if __name__ == "__main__":
    main()
