# Rewritten by the uv shim on install (version and CUDA variant of the "wheel").
__version__ = "0.0.0+cu128"
cuda = "12.8"
