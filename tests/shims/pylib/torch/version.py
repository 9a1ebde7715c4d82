# Rewritten by the uv shim on install (version, CUDA variant and SASS archs of the "wheel", the archs from the
# resolver's data: tests/shims/data/wheel-archs.tsv).
__version__ = "0.0.0+cu128"
cuda = "12.8"
arch_list = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
