"""GET a public URL, with the few things the sources need: an Accept header (PEP 691 content negotiation), a
timeout, and errors that name the URL; whole (`get`) or streamed into a file with its sha256 (`save`). Each
source's base URL can be pointed elsewhere by an environment variable (a mirror, or the tests' local server on
127.0.0.1).

The variables: GPUPROV_PYPI_URL, GPUPROV_PYTORCH_INDEX_URL, GPUPROV_NVIDIA_REPOS_URL, each checked (http(s) with a
host, else bad input naming the variable). `described` writes a public URL by name, so no host lands in a data file.
"""

from __future__ import annotations

import gzip
import hashlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPResponse
from importlib.metadata import PackageNotFoundError, version
from typing import BinaryIO
from urllib.parse import urlparse

from gpuprov.errors import GpuprovError, UserInputError

TIMEOUT = 30.0

# the sources' public base URLs, and the variables that replace them
PYPI = ("GPUPROV_PYPI_URL", "https://pypi.org")
PYTORCH_INDEX = ("GPUPROV_PYTORCH_INDEX_URL", "https://download.pytorch.org/whl")
NVIDIA_REPOS = ("GPUPROV_NVIDIA_REPOS_URL", "https://developer.download.nvidia.com/compute/cuda/repos")


class SourceUnreachable(GpuprovError):
    """A source that did not answer (or answered an error): the refresh of its family fails, the rest go on."""

    def __init__(self, url: str, why: str, status: int | None = None) -> None:
        super().__init__(f"{url}: {why}")
        self.url, self.why, self.status = url, why, status


@dataclass(frozen=True)
class Response:
    url: str
    content_type: str
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def base_url(source: tuple[str, str]) -> str:
    """A source's base URL: its environment variable when set (checked: http or https with a host), else the public one."""
    from gpuprov.settings import settings

    variable, default = source
    given = settings().variable(variable)
    if given is None:
        return default
    value = given.text
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserInputError(variable, f"{value!r} is not an http(s) URL", f"e.g. {default}, or unset it")
    return value.rstrip("/")


def described(url: str) -> str:
    """A URL as a source record says it: the public sources by name and path (so a data file names no host),
    any other (a mirror, a local server) as it is."""
    for (_, public), name in ((PYPI, "PyPI"), (PYTORCH_INDEX, "the PyTorch wheel index"),
                              (NVIDIA_REPOS, "NVIDIA's CUDA repository")):
        if url.startswith(public):
            return f"{name} {url[len(public):] or '/'}"
    return url


def _agent() -> str:
    try:
        return f"gpuprov/{version('gpuprov')}"
    except PackageNotFoundError:
        return "gpuprov"


@contextmanager
def _answer(url: str, accept: str, timeout: float) -> Iterator[HTTPResponse]:
    """The open answer to a GET of `url`; whatever fails while it is read is SourceUnreachable naming it and why."""
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": _agent()})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            yield answer
    except urllib.error.HTTPError as exc:
        raise SourceUnreachable(url, f"HTTP {exc.code} {exc.reason}", exc.code) from None
    except urllib.error.URLError as exc:
        raise SourceUnreachable(url, str(exc.reason)) from None
    except (OSError, ValueError) as exc:
        raise SourceUnreachable(url, str(exc) or type(exc).__name__) from None


def save(url: str, out: BinaryIO, timeout: float = TIMEOUT) -> tuple[str, int]:
    """`url`'s body streamed into `out`, as it comes (a large package is never held whole): its sha256 and size."""
    digest, size = hashlib.sha256(), 0
    with _answer(url, "*/*", timeout) as answer:
        while chunk := answer.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    return digest.hexdigest(), size


def get(url: str, accept: str = "*/*", timeout: float = TIMEOUT) -> Response:
    """The body of `url` (a .gz one unpacked), or SourceUnreachable naming it and why."""
    with _answer(url, accept, timeout) as answer:
        body = answer.read()
        content_type = answer.headers.get("Content-Type", "")
    if url.endswith(".gz"):
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError) as exc:
            raise SourceUnreachable(url, f"not gzip: {exc}") from None
    return Response(url, content_type.split(";")[0].strip().lower(), body)
