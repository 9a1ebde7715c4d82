"""A playbook's `data:` entries: datasets fetched from S3 before the playbook's own steps, checkpoints saved to S3
when the node is about to go (a spot notice, an autostop/TTL shutdown, `gpuprov down`).

    data:
      - from: s3://my-data/datasets/imagenet     # a download: before the steps, resumable (`aws s3 sync`)
        to: /data/imagenet
      - from: /work/ckpt                         # an upload: on the spot notice and before `down`
        to: s3://my-ckpt/run1
        when: [interrupt, down]                  # interrupt, stop (an autostop/TTL shutdown), down; or one word

Both directions run on the node with the AWS CLI (`aws s3 sync`: a file is copied when its size differs or the source
is newer, so a rerun after a cut fetches only what is missing), with the node's own credentials (`up --s3-access`
gives it a role scoped to the buckets). Pure: the entries, their checks and the two steps; the uploads' helper on the
node is rendered from templates/data_save.sh.j2.

`DataSpec` (`from`/`to`: exactly one side `s3://BUCKET/PREFIX`, the other an absolute path without `..`; `when`
for uploads only, and required there) is checked at load like every field (file:line). `data_steps` puts two
steps before the playbook's own: `data-save` installs `/usr/local/lib/gpuprov/save-data WHEN` (each upload for
that moment, `aws s3 sync PATH URI`, every entry tried, the exit the number that failed) and `data-fetch` runs
`aws s3 sync URI PATH` per download (changed when the CLI printed a `download:` line). The interrupt watch runs
`save-data interrupt` after the on-interrupt hook within HOOK_TIMEOUT (an interrupt upload alone turns the watch
on: `Guards.save_on_interrupt`), the autostop and TTL checks `save-data stop` before `shutdown`, and `down`
`save-data down` (cloud/data_save.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuprov.plan.render import StepPlan

When = Literal["interrupt", "stop", "down"]
WHENS: tuple[When, ...] = ("interrupt", "stop", "down")
# S3's bucket names: 3-63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit
S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[^\s*?\x00]*)?")
# the helper the uploads' step installs; the interrupt watch, the autostop and TTL checks and `down` run it
SAVE_HELPER = "/usr/local/lib/gpuprov/save-data"


def split_s3(uri: str) -> tuple[str, str]:
    """s3://BUCKET/PREFIX → (BUCKET, PREFIX without slashes at either end)."""
    m = S3_URI.fullmatch(uri)
    if not m:
        raise ValueError(f"{uri!r} is not s3://BUCKET/PREFIX")
    return m.group(1), (m.group(2) or "").strip("/")


def _side(value: str) -> str:
    """One side of an entry: an s3:// URI or an absolute path on the node, nothing a shell or the CLI reads as more."""
    if value.startswith("s3://"):
        bucket, _ = split_s3(value)
        if ".." in bucket:
            raise ValueError(f"{value!r}: a bucket name has no '..'")
        return value
    if value.startswith("oss://"):  # Alibaba Cloud's Object Storage Service: no ossutil step yet
        raise ValueError(f"{value!r}: gpuprov moves data with S3 only for now (oss:// is not read); "
                         "an s3://BUCKET/PREFIX or an absolute path on the node")
    if not value.startswith("/") or "\n" in value or "\x00" in value:
        raise ValueError(f"{value!r} is neither s3://BUCKET/PREFIX nor an absolute path on the node")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r}: a path must not contain '..' components")
    return value


class DataSpec(BaseModel):
    """One `data:` entry: exactly one side in S3."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    source: Annotated[str, Field(alias="from", min_length=1, max_length=4096)]
    to: Annotated[str, Field(min_length=1, max_length=4096)]
    when: tuple[When, ...] = ()

    @field_validator("source", "to")
    @classmethod
    def _one_side(cls, value: str) -> str:
        return _side(value)

    @field_validator("when", mode="before")
    @classmethod
    def _words(cls, value: object) -> object:
        # `when: interrupt` and `when: interrupt|down` as well as a list
        return tuple(value.split("|")) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _direction(self) -> DataSpec:
        up, down = self.source.startswith("s3://"), self.to.startswith("s3://")
        if up == down:
            raise ValueError("one side is s3://BUCKET/PREFIX and the other a path on the node "
                             f"(from {self.source!r} to {self.to!r})")
        if up and self.when:
            raise ValueError("`when` is for uploads (from a path to s3://); a download runs before the playbook's steps")
        if down and not self.when:
            raise ValueError(f"an upload needs `when`: one or more of {', '.join(WHENS)}")
        if len(set(self.when)) != len(self.when):
            raise ValueError("`when` names a moment twice")
        return self

    @property
    def download(self) -> bool:
        return self.source.startswith("s3://")

    @property
    def s3(self) -> str:
        return self.source if self.download else self.to

    def summary(self) -> dict[str, object]:
        return {"from": self.source, "to": self.to, "when": list(self.when) or ["up"]}


def data_steps(entries: tuple[DataSpec, ...]) -> list[StepPlan]:
    """The uploads' helper first (a spot notice may come while the download runs), then the downloads."""
    steps = []
    saves = tuple(e for e in entries if not e.download)
    fetches = tuple(e for e in entries if e.download)
    if saves:
        what = "; ".join(f"{e.source} → {e.to} on {'/'.join(e.when)}" for e in saves)
        steps.append(StepPlan("data-save", "data_save.sh.j2", "data",
                              f"save to S3 with aws s3 sync: {what} ({SAVE_HELPER})", (("saves", saves),)))
    if fetches:
        what = "; ".join(f"{e.source} → {e.to}" for e in fetches)
        steps.append(StepPlan("data-fetch", "data_fetch.sh.j2", "data",
                              f"fetch from S3 with aws s3 sync (resumable): {what}", (("fetches", fetches),)))
    return steps


def saves_on(entries: tuple[DataSpec, ...], when: When) -> tuple[DataSpec, ...]:
    return tuple(e for e in entries if not e.download and when in e.when)
