"""fuselet.info(): what this fuselet was built against and what is available here."""

from __future__ import annotations

import importlib.util
import platform
import sys

from fuselet import _core, _guard


def _layer_status(layer: str) -> dict:
    where = _core.layer_dir(layer)
    built = _guard.read_build_info(where) if where else None
    status = {"built": built, "running": None, "status": "not built", "path": str(where) if where else None}
    if built is None:
        return status
    if importlib.util.find_spec(layer) is None:
        status["status"] = f"{layer} not installed"
        return status
    running = _guard.running_torch() if layer == "torch" else _guard.running_jaxlib()
    status["running"] = running
    problems = (_guard.torch_mismatches if layer == "torch" else _guard.jax_mismatches)(built, running)
    status["status"] = "ok" if not problems else "MISMATCH: " + "; ".join(problems)
    return status


def report() -> dict:
    """Everything info() prints, as a dict."""
    from fuselet import __version__, _core

    try:
        core = _core.core_info()
    except ImportError as exc:
        core = {"error": str(exc)}
    return {
        "fuselet": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "core": core,
        "torch": _layer_status("torch"),
        "jax": _layer_status("jax"),
    }


def info(file=None) -> None:
    """Print the provenance and availability report (paste it into bug reports)."""
    r = report()
    lines = [f"fuselet {r['fuselet']} (python {r['python']}, {r['platform']})"]
    core = r["core"]
    if "error" in core:
        lines.append(f"  core:  MISSING: {core['error']}")
    else:
        cuda = f"CUDA kernels for {core['cuda_archs']}" if core["cuda_kernels"] else "no CUDA kernels"
        cpu = f"CPU kernels ({core['cpu_isa']}, {core['num_threads']} threads)"
        lines.append(f"  core:  libfuselet {core['version']}, {cpu}, {cuda}")
        lines.append(f"         {core['path']}")
    for layer in ("torch", "jax"):
        s = r[layer]
        built = s["built"]
        if built is None:
            lines.append(f"  {layer}: not built (rebuild with FUSELET_FRAMEWORK={layer} or install fuselet-{layer})")
            continue
        kernels = "CPU + CUDA" if built.get("cuda_kernels") else "CPU"
        running = _guard.describe(layer, s["running"]) if s["running"] else "-"
        abi = "exact ABI, " if layer == "torch" and not _guard.is_stable(built) else ""
        lines.append(
            f"  {layer}: built against {_guard.describe(layer, built)}, {abi}{kernels} kernels, "
            f"compiler {built['compiler']}, CUDA toolkit {built['cuda_toolkit'] or '-'}"
        )
        lines.append(f"         found {running}: {s['status']}")
        lines.append(f"         {s['path']}")
    print("\n".join(lines), file=file)
