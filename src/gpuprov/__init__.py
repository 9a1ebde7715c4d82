"""gpuprov: GPU machines with a verified PyTorch stack, from one command and back to zero spend."""

__version__ = "0.1.0"
