"""scripts/gpu-test.sh --plan: the GPU check's phases fit a device lease, and the wheels it must
carry to a machine without an index are named and looked for (runs here, without a GPU)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEASE_COMMAND_S = 480  # the GPU check's target: 8 of a command's 10 minutes


def plan(wheels: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FUSELET_GPU_WHEELS": str(wheels)}
    return subprocess.run([str(ROOT / "scripts/gpu-test.sh"), "--plan"], capture_output=True, text=True, env=env, timeout=60)


def carried() -> list[str]:
    lines = (ROOT / "requirements/gpu.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_phases_fit_the_lease_and_end_with_the_total(tmp_path):
    out = plan(tmp_path)
    lines = out.stdout.strip().splitlines()
    phases = [re.fullmatch(r"([a-z]+)\s+(\d+) s", line) for line in lines]
    budgets = [int(m.group(2)) for m in phases if m]
    assert [m.group(1) for m in phases if m][:3] == ["build", "core", "layers"], out.stdout
    total = re.fullmatch(r"total: (\d+) s", lines[-1])
    assert total and int(total.group(1)) == sum(budgets) <= LEASE_COMMAND_S, out.stdout


def test_a_missing_wheel_is_named_and_fails_the_plan(tmp_path):
    out = plan(tmp_path)
    assert out.returncode == 1
    for requirement in carried():
        assert f"missing: {requirement}" in out.stdout


def test_the_carried_wheels_satisfy_the_plan(tmp_path):
    for requirement in carried():
        name, version = requirement.split("==")
        (tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
    out = plan(tmp_path)
    assert out.returncode == 0, out.stdout
    assert "missing" not in out.stdout
