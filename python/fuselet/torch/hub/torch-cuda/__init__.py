"""fuselet's layers, the cuda build variant of its local kernel repository."""

from fuselet.torch.hub import layers  # noqa: F401
