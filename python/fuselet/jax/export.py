"""jax.export of functions that call fuselet.jax ops.

fuselet's FFI targets (`fuselet_<op>`) are custom calls with no JAX compatibility guarantee, so
jax.export refuses to serialize them unless told to; `disabled_checks()` is that permission:

    exported = jax.export.export(jax.jit(f), disabled_checks=fuselet.jax.export.disabled_checks())(*args)
    blob = exported.serialize()
    # in any process that has imported fuselet.jax (which registers every target):
    jax.export.deserialize(blob).call(*args)

The artifact calls fuselet's handlers by name with the attributes of this fuselet's FFI ABI:
call it with the fuselet it was exported with.

Symbolic dims (jax.export.symbolic_shape) work for the row (leading) dims of every op;
fused_linear_cross_entropy then needs an explicit chunk_size that divides its token count.
The norm gradients size their CUDA workspace at trace time: export CUDA artifacts where JAX
sees a GPU. A jit over a mesh of several devices cannot be exported (jax.export raises
"serialization of host_callbacks is not yet implemented": fuselet's sharding rules are
custom_partitioning callbacks of the exporting process); a shard_map over every mesh axis
can, since inside it the FFI calls run as they are.
"""

from __future__ import annotations

import jax

from fuselet.jax._load import TARGETS

__all__ = ["TARGETS", "disabled_checks"]


def disabled_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The `disabled_checks` jax.export.export needs for fuselet ops: one
    jax.export.DisabledSafetyCheck.custom_call(name) per FFI target of fuselet (see TARGETS)."""
    return [jax.export.DisabledSafetyCheck.custom_call(name) for name in TARGETS]
