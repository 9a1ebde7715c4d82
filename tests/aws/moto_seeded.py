"""moto_server that puts the images' SSM parameters back itself after every reset (tests/aws/fixture.py).

Every test that uses the fake AWS starts with a reset, and the parameters gpuprov reads to find an image (Ubuntu's,
the other OSes') must be there again. Put through the API they were ~38 requests a test, each a round trip through
HTTP, botocore and moto (0.5-2 s a test on a busy 2-core machine); here they go straight into moto's SSM backend,
with the same validation (the image must exist), inside the reset request.

    python moto_seeded.py SEED.json -H 127.0.0.1 -p PORT     SEED.json: {"region": [[name, image id], ...], ...}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def seed(rows: dict[str, list[list[str]]]) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import ssm_backends

    for region, parameters in rows.items():
        backend = ssm_backends[DEFAULT_ACCOUNT_ID][region]
        for name, value in parameters:
            backend.put_parameter(name=name, description="", value=value, parameter_type="String", allowed_pattern="",
                                  keyid="", overwrite=True, tags=[], data_type="aws:ec2:image", tier=None, policies=None)


def main(argv: list[str]) -> None:
    from moto.moto_api._internal.models import MotoAPIBackend
    from moto.server import main as serve

    rows = json.loads(Path(argv[0]).read_text())
    reset = MotoAPIBackend.reset

    def reset_and_seed(self: Any) -> None:
        reset(self)
        seed(rows)

    MotoAPIBackend.reset = reset_and_seed  # type: ignore[method-assign]
    serve(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
