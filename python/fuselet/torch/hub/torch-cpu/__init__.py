"""fuselet's layers, the cpu build variant of its local kernel repository."""

from fuselet.torch.hub import layers  # noqa: F401
