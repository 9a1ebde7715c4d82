"""torch.cuda.nccl for the fake torch."""


def version() -> tuple[int, int, int]:
    return (2, 27, 5)
