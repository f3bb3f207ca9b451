"""Loads an AOTInductor package in a fresh process and runs it (tests/torch/test_aoti.py).

    python -m tests.torch.aoti_child PACKAGE INPUTS OUTPUTS [--without-fuselet]

INPUTS: a torch.save'd tuple of arguments; OUTPUTS: where the results are torch.save'd.
fuselet.torch is imported first (it registers the fuselet ops the package calls) unless
--without-fuselet is given.
"""

from __future__ import annotations

import sys

import torch

if __name__ == "__main__":
    package, inputs, outputs, *flags = sys.argv[1:]
    if "--without-fuselet" not in flags:
        import fuselet.torch  # noqa: F401
    model = torch._inductor.aoti_load_package(package)
    with torch.no_grad():
        torch.save(model(*torch.load(inputs)), outputs)
