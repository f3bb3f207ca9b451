"""One of the processes of tests/jax/test_multi_process.py: `python -m tests.jax.multi_process_child
PROCESS_ID NUM_PROCESSES PORT OUT`, with XLA_FLAGS=--xla_force_host_platform_device_count=2.

fuselet.jax is imported first, then jax.distributed.initialize joins the coordinator on
127.0.0.1:PORT (process 0 serves it, bound to loopback) with gloo CPU collectives; as
initialize refuses to run once a JAX backend exists, this also checks that importing
fuselet.jax (which registers its FFI targets) initializes none. A jitted
training step of fuselet ops (add_rms_norm, rms_norm, rope, causal softmax, swiglu,
cross_entropy) runs with its batch rows sharded over every device of every process (each
process gives only its own rows: jax.make_array_from_process_local_data). Each process
writes OUT/<PROCESS_ID>.npz: the outputs gathered whole (multihost_utils.process_allgather),
its own rows of the row-sharded output y, and the collectives of the compiled step.

The test imports `inputs` and `step` from here for the one-process result.
"""

from __future__ import annotations

import functools
import re
import sys

import fuselet.jax as fj
import jax
import jax.numpy as jnp
import numpy as np

B, S, N, D, V = 8, 4, 2, 8, 16
H = N * D
ROW_ARGS = (0, 1, 5)  # x, residual, target: sharded over the batch rows; the others replicated
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def model(x, residual, w, cos, sin, target, wv):
    """(mean cross-entropy, the rms_norm output) of a small pre-norm step."""
    h, r = fj.add_rms_norm(x, residual, w)
    y = fj.rms_norm(h + r, w)
    q = fj.rope(y.reshape(*y.shape[:-1], N, D), cos, sin).reshape(y.shape)
    p = fj.softmax(jnp.einsum("bsh,bth->bst", q, y)[:, None], scale=0.25, causal=True)[:, 0]
    a = jnp.einsum("bst,bth->bsh", p, y)
    g = fj.swiglu(jnp.concatenate([a, q], -1))
    return fj.cross_entropy(g @ wv, target, z_loss=1e-3), y


def step(*args):
    """((loss, y), (dx, dresidual, dw, dwv))."""
    return jax.value_and_grad(model, argnums=(0, 1, 2, 6), has_aux=True)(*args)


def inputs() -> tuple[np.ndarray, ...]:
    """The global inputs (every process makes the same ones and keeps its rows)."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return (
        f(B, S, H),
        f(B, S, H),
        1 + 0.1 * f(H),
        f(S, D // 2),
        f(S, D // 2),
        rng.integers(0, V, (B, S)).astype(np.int32),
        f(H, V),
    )


def local_rows(sharding, shape) -> slice:
    """The rows (leading dim) of a [B, ...] array that this process's devices hold: one
    contiguous block for a mesh whose devices are ordered by process."""
    starts = sorted({idx[0].indices(shape[0])[:2] for idx in sharding.addressable_devices_indices_map(shape).values()})
    assert all(a[1] == b[0] for a, b in zip(starts, starts[1:])), f"rows of this process not contiguous: {starts}"
    return slice(starts[0][0], starts[-1][1])


def collectives(hlo: str) -> dict:
    return {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in COLLECTIVES}


def gloo_on_loopback() -> None:
    """JAX creates its gloo collectives with the address of this host's name (no setting of its
    own): pin them to 127.0.0.1 so that the test listens on loopback only, whatever the name
    resolves to."""
    from jax._src import xla_bridge

    make = xla_bridge._jax.make_gloo_tcp_collectives
    xla_bridge._jax.make_gloo_tcp_collectives = functools.partial(make, hostname="127.0.0.1")


def main(process_id: int, num_processes: int, port: int, out: str) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    gloo_on_loopback()
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        coordinator_bind_address=f"127.0.0.1:{port}",
        initialization_timeout=60,
        heartbeat_timeout_seconds=30,
        shutdown_timeout_seconds=30,
    )
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    assert jax.process_count() == num_processes and jax.device_count() == 2 * num_processes, jax.devices()
    # Auto axes: in Explicit mode (make_mesh's default) fuselet's FFI results are typed unsharded,
    # so the jnp ops after them gather their rows.
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    mine = local_rows(rows, (B,))
    args = tuple(
        jax.make_array_from_process_local_data(rows, a[mine], a.shape)
        if i in ROW_ARGS
        else jax.make_array_from_process_local_data(replicated, a, a.shape)
        for i, a in enumerate(inputs())
    )
    assert not args[0].is_fully_addressable and args[0].addressable_shards[0].data.shape == (B // jax.device_count(), S, H)

    jstep = jax.jit(step)
    (loss, y), grads = jstep(*args)
    gather = functools.partial(multihost_utils.process_allgather, tiled=True)
    result = {
        "loss": gather(loss),
        "y": gather(y),
        **{f"d{i}": gather(g) for i, g in enumerate(grads)},
        "rows": np.array([mine.start, mine.stop]),
        "y_local": np.concatenate([np.asarray(s.data) for s in sorted(y.addressable_shards, key=lambda s: s.index[0].start)]),
        "y_sharded_like_x": np.array(y.sharding.is_equivalent_to(args[0].sharding, y.ndim)),
        "dx_sharded_like_x": np.array(grads[0].sharding.is_equivalent_to(args[0].sharding, y.ndim)),
    }
    hlo = jstep.lower(*args).compile().as_text()
    result.update({f"hlo/{c}": np.array(n) for c, n in collectives(hlo).items()})
    np.savez(f"{out}/{process_id}.npz", **result)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
