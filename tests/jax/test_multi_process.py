"""fuselet.jax in a JAX program of 2 processes (jax.distributed on 127.0.0.1, gloo CPU
collectives, 2 CPU devices each): tests/jax/multi_process_child.py runs a jitted training
step of fuselet ops with its batch rows sharded over the 4 devices of both processes. Its
forward and gradients are the one-process result, each process holds only its own rows, and
the compiled step has no collective but the all-reduces of the mean loss and of the
replicated parameters' gradients (the rows never cross processes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import import_layer

jax = pytest.importorskip("jax", reason="jax is not installed in this environment")
import_layer("jax")
from tests.jax.multi_process_child import B, inputs, step  # noqa: E402

pytestmark = pytest.mark.processes  # the make test tier (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 2
TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(out: Path) -> list[dict]:
    """Starts the PROCESSES children, waits for all (killing every one still running when one
    fails or TIMEOUT_S passes) and returns what each wrote."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    port, procs, logs = free_port(), [], []
    try:
        for i in range(PROCESSES):
            logs.append(open(out / f"{i}.log", "w"))  # noqa: SIM115 (closed below)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.jax.multi_process_child", str(i), str(PROCESSES), str(port), str(out)],
                    cwd=ROOT,
                    env=env,
                    stdout=logs[-1],
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + TIMEOUT_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in logs:
            f.close()
    codes = [p.returncode for p in procs]
    assert codes == [0] * PROCESSES, "\n".join(
        f"process {i} (exit {c}):\n{(out / f'{i}.log').read_text()[-3000:]}" for i, c in enumerate(codes)
    )
    results = []
    for i in range(PROCESSES):
        with np.load(out / f"{i}.npz") as npz:
            results.append({k: npz[k] for k in npz.files})
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_processes(tmp_path_factory.mktemp("multi_process"))


@pytest.fixture(scope="module")
def expected() -> dict:
    """The step in this one process, on one device."""
    (loss, y), grads = jax.jit(step)(*inputs())
    return {"loss": loss, "y": y, **{f"d{i}": g for i, g in enumerate(grads)}}


@pytest.mark.parametrize("process", range(PROCESSES))
def test_forward_and_grad_are_the_one_process_result(results, expected, process):
    r = results[process]
    for name, e in expected.items():
        # The same kernels on the same rows; the loss and parameter gradients are summed over
        # 4 row shards instead of one pass: float32 rounding at most.
        np.testing.assert_allclose(r[name], np.asarray(e), rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("process", range(PROCESSES))
def test_each_process_holds_its_rows(results, expected, process):
    r = results[process]
    start, stop = (int(v) for v in r["rows"])
    assert (start, stop) == (process * B // PROCESSES, (process + 1) * B // PROCESSES)
    np.testing.assert_allclose(r["y_local"], np.asarray(expected["y"])[start:stop], rtol=1e-5, atol=1e-5)
    assert r["y_sharded_like_x"] and r["dx_sharded_like_x"]


def test_rows_never_cross_processes(results):
    """Only all-reduces: the mean loss (one stacked sum) and the gradients of w and wv."""
    for r in results:
        counts = {k.split("/", 1)[1]: int(v) for k, v in r.items() if k.startswith("hlo/")}
        assert {c: n for c, n in counts.items() if n and c != "all-reduce"} == {}, counts
        assert 1 <= counts["all-reduce"] <= 2, counts
