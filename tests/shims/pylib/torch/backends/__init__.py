"""torch.backends for the fake torch: only the TF32 switch (off by default, as in torch since 1.12)."""

from torch.backends import cuda  # noqa: F401
