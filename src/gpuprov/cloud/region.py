"""The region a command works in, with where it came from (said when it was not --region).

Each cloud finds its own: AWS's chain is providers/aws_region.py, another cloud's is its CLI's variable or its
catalog's first region (cli/common.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Region:
    name: str
    source: str  # "--region", "AWS_REGION", "profile 'dev'", "default" …

    def __str__(self) -> str:
        return f"{self.name} (from {self.source})"

