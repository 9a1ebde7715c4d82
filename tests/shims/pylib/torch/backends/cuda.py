"""torch.backends.cuda.matmul.allow_tf32: fp32 matmuls use TF32 tensor cores on 8.0+ when set."""


class _Matmul:
    allow_tf32 = False


matmul = _Matmul()
