"""scripts/emu_surface.py (scripts/lint.sh's `emu` check): the core's kernels use only the CUDA
that fuselet's emulator implements, and a construct it lacks is refused naming file and line."""

from __future__ import annotations

import importlib.util

import pytest

from tests.config.conftest import ROOT

spec = importlib.util.spec_from_file_location("emu_surface", ROOT / "scripts" / "emu_surface.py")
emu_surface = importlib.util.module_from_spec(spec)
spec.loader.exec_module(emu_surface)

# One line per construct of emu_surface.NOT_EMULATED / RAW, as a kernel would write it.
OFFENDERS = {
    "atomics": "atomicAdd(&out[0], v);",
    "__syncwarp": "__syncwarp();",
    "warp votes and matches": "const unsigned b = __ballot_sync(0xffffffffu, v > 0);",
    "shuffles other than __shfl_xor_sync": "v = __shfl_down_sync(0xffffffffu, v, 1);",
    "barriers with a predicate": "n = __syncthreads_count(v > 0);",
    "cooperative groups": "auto g = cooperative_groups::this_thread_block();",
    "asynchronous copies": "__pipeline_memcpy_async(dst, src, 16);",
    "inline PTX": 'asm volatile("bar.sync 0;");',
    "cache-hinted loads and stores": "v = __ldg(p);",
    "memory fences": "__threadfence();",
    "clocks and sleeps": "t = clock64();",
    "constant, managed, texture memory": "__constant__ float table[16];",
    "launches other than launch_kernel": "cudaLaunchKernel(f, grid, block, args, 0, s);",
    "a raw <<<...>>> launch (use launch_kernel)": "kernel<<<grid, block>>>(p);",
    "a raw __shared__ declaration (use FUSELET_SHARED / FUSELET_DYNAMIC_SHARED)": "__shared__ float s[32];",
}


def test_the_kernels_use_only_what_the_emulator_implements():
    files = sorted([*emu_surface.KERNELS.glob("*.cu"), *emu_surface.KERNELS.glob("*.cuh")])
    assert len(files) >= 7
    assert [hit for f in files for hit in emu_surface.scan(f)] == []


def test_every_rule_has_an_offender_here():
    assert set(OFFENDERS) == {what for _, what in emu_surface.NOT_EMULATED + emu_surface.RAW}


@pytest.mark.parametrize("what", sorted(OFFENDERS))
def test_a_construct_the_emulator_lacks_is_refused_with_file_and_line(tmp_path, what):
    kernel = tmp_path / "k.cu"
    kernel.write_text(f"__global__ void k(float* out) {{\n  // {OFFENDERS[what]} in a comment is fine\n  {OFFENDERS[what]}\n}}\n")
    hits = emu_surface.scan(kernel)  # named relative to the tree where the file lies in it
    assert any(f"k.cu:3: {what}," in h for h in hits), hits
    assert not any("k.cu:2:" in h for h in hits), hits


def test_common_cuh_may_spell_out_what_its_helpers_wrap(tmp_path):
    helper = tmp_path / "common.cuh"
    helper.write_text("#define FUSELET_SHARED(type, name) __shared__ type name\n  K<<<grid, block>>>(args...);\n")
    assert emu_surface.scan(helper) == []
    assert emu_surface.main([str(tmp_path / "common.cuh")]) == 0
