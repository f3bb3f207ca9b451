"""The report fuse() leaves on a model and fuse_report(model) returns: the kinds of layer fuse()
considers (KINDS), a Row per module it considered (fused, with the op that runs, or left, with
why), and FuseReport, which counts them per kind and prints them."""

from __future__ import annotations

import collections
import dataclasses

import torch

KINDS = ("norm", "mlp", "rope", "loss")


@dataclasses.dataclass(frozen=True)
class Row:
    kind: str  # one of KINDS
    path: str  # the module's name in model.named_modules() ("" for the model itself)
    fused: bool
    detail: str  # what runs (fused) or why it was left


class FuseReport:
    """What fuse() did to one model: a Row per module it considered."""

    def __init__(self, model_type, rows):
        self.model_type = model_type
        self.rows = list(rows)

    def fused(self, kind: str | None = None) -> list[Row]:
        return [r for r in self.rows if r.fused and kind in (None, r.kind)]

    def left(self, kind: str | None = None) -> list[Row]:
        return [r for r in self.rows if not r.fused and kind in (None, r.kind)]

    def summary(self) -> dict:
        """{kind: {"fused": n, "left": n, "ops": {detail: n}, "reasons": {reason: n}}} for every kind."""
        out = {}
        for kind in KINDS:
            fused, left = self.fused(kind), self.left(kind)
            out[kind] = {
                "fused": len(fused),
                "left": len(left),
                "ops": dict(collections.Counter(r.detail for r in fused)),
                "reasons": dict(collections.Counter(r.detail for r in left)),
            }
        return out

    def __str__(self) -> str:
        lines = [f"fuselet.torch.transformers.fuse: model_type {self.model_type!r}"]
        for kind, s in self.summary().items():
            lines.append(f"  {kind}: {s['fused']} fused, {s['left']} left")
            lines += [f"    fused x{n}: {d}" for d, n in s["ops"].items()]
            lines += [f"    left  x{n}: {d}" for d, n in s["reasons"].items()]
        return "\n".join(lines)

    __repr__ = __str__


def fuse_report(model) -> FuseReport:
    """The report of the last fuse(model): per kind of layer, what was fused, what was left and why."""
    report = vars(model).get("_fuselet_report") if isinstance(model, torch.nn.Module) else None
    if report is None:
        raise ValueError(f"model: {type(model).__name__} was not fused (call fuselet.torch.transformers.fuse(model) first)")
    return report
