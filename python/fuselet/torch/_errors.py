"""The stable-ABI build's refusals as the Python exceptions they stand for.

A stable kernel (csrc/torch/api.h, FUSELET_TORCH_STABLE) can throw only standard C++
exceptions, and which Python exception each becomes is the running torch's choice: up to torch
2.14 a raw torch.ops.fuselet call left them to pybind11 (std::invalid_argument: ValueError),
from 2.15 on torch translates them itself, every one but std::out_of_range to a RuntimeError.
So the stable kernels head each refusal with the exception it stands for ("[fuselet ValueError]
weight: expected ...") and install() registers over each of them, for the same dispatch key, a
Python kernel that calls it (torch.library.get_kernel) and raises that exception with the rest
of the message: the raw ops refuse as the exact build's do (ValueError, TypeError,
NotImplementedError), under any torch and in torch.inference_mode too. The cost is one Python
call per op call, and only in the stable build: the exact build raises c10's typed errors itself.
"""

from __future__ import annotations

import re
import warnings

# the heads of csrc/torch/api.h's fail()
TAG = re.compile(r"\[fuselet (ValueError|TypeError|NotImplementedError)\] ")
KINDS = {"ValueError": ValueError, "TypeError": TypeError, "NotImplementedError": NotImplementedError}

_LIBRARY = None  # the torch.library.Library of the kernels (kept alive)


def untag(message: str) -> tuple[type[Exception] | None, str]:
    """(the exception a stable kernel's message names, the message without its head); (None,
    message) for a message without one (a failure that is not a refusal: RuntimeError as is)."""
    match = TAG.match(message)
    return (KINDS[match[1]], message[match.end() :]) if match else (None, message)


def _raising_as_tagged(kernel):
    """A Python kernel that runs the stable kernel `kernel` and raises its refusals as the
    exceptions they name."""

    def run(keyset, *args, **kwargs):
        try:
            return kernel.call_boxed(keyset, *args, **kwargs)
        except Exception as exc:  # whatever the running torch made of the C++ exception
            kind, message = untag(str(exc))
            if kind is None:
                raise
            raise kind(message) from None

    return run


def install(torch, keys: tuple[str, ...]) -> None:
    """Over every stable kernel of the fuselet ops for the dispatch keys `keys` (CPU, and CUDA in
    a build with CUDA kernels): a Python kernel that raises its refusals as what they name."""
    global _LIBRARY
    _LIBRARY = torch.library.Library("fuselet", "IMPL")
    with warnings.catch_warnings():
        # torch < 2.15 warns (once) on any kernel registered over another: here that is the point
        warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
        for name in torch._C._dispatch_get_all_op_names():
            if not name.startswith("fuselet::"):
                continue
            for key in keys:
                if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                    kernel = torch.library.get_kernel(name, key)
                    _LIBRARY.impl(name.removeprefix("fuselet::"), _raising_as_tagged(kernel), key, with_keyset=True)
