"""Which AWS endpoint a client talks to, as the user set it, and what an answer that is not AWS's means.

botocore takes a service's endpoint from AWS_ENDPOINT_URL_<SERVICE> (the service id upper-cased, spaces and
hyphens as underscores: AWS_ENDPOINT_URL_EC2, AWS_ENDPOINT_URL_S3), else from AWS_ENDPOINT_URL. The EC2 provider
and team state's bucket both read them here, so "a local endpoint" and "the variable to blame" are decided once.

An answer botocore cannot parse (an HTML page, a web server that is not AWS) is the user's endpoint when one of
those variables is set: bad input, named by the variable, exit 2. Without one it is something between here and AWS
(a proxy, a captive portal), said as such.
"""

from __future__ import annotations

import os
from typing import Any

from gpuprov.errors import GpuprovError, UserInputError


def _variable(service: str) -> str:
    return "AWS_ENDPOINT_URL_" + service.upper().replace(" ", "_").replace("-", "_")


def endpoint_variables(service: str | None = None) -> list[str]:
    """The endpoint variables set for `service` (botocore's order: its own, then AWS_ENDPOINT_URL); for a call of
    an unknown service, every one that is set."""
    if service is not None:
        names = [_variable(service), "AWS_ENDPOINT_URL"]
    else:
        names = [*sorted(k for k in os.environ if k.startswith("AWS_ENDPOINT_URL_")), "AWS_ENDPOINT_URL"]
    return [name for name in names if os.environ.get(name)]


def endpoint_url(service: str) -> str | None:
    """The endpoint `service`'s client is pointed at by the environment; None for AWS itself."""
    names = endpoint_variables(service)
    return os.environ[names[0]] if names else None


def unreadable_answer(what: str, detail: str, service: str | None = None) -> GpuprovError:
    """An answer to `what` that botocore could not parse (`detail`, its words)."""
    why = detail.split("\n", 1)[0].split(", invalid XML received")[0]
    names = endpoint_variables(service)
    if names:
        return UserInputError(" or ".join(names), f"{os.environ[names[0]]} did not answer {what} as AWS does ({why})",
                              "point it at AWS or a local imitation of it (moto, `make sandbox`), or unset it for AWS "
                              "itself")
    return GpuprovError(f"AWS call {what}: its answer could not be read ({why}); is a proxy or captive portal "
                        "between this machine and AWS?")


class WebPage(Exception):
    """An answer that is a web page: raised by `no_web_page` inside botocore's call, read as an unreadable answer
    (`unreadable_answer`) by whoever made the call, like botocore's own ResponseParserError."""


def no_web_page(response_dict: dict[str, Any], **_: Any) -> None:
    """botocore's `before-parse` hook on every client gpuprov makes (EC2's, the team bucket's): an HTML page is no
    answer of AWS's, whatever its status; one that is well-formed XML would parse as an empty answer and fail later,
    in whatever read it (a web server at AWS_ENDPOINT_URL, a captive portal). A streamed body (an object read) is
    left to its reader."""
    body = response_dict.get("body")
    if isinstance(body, bytes) and body[:512].lstrip().lower().startswith((b"<!doctype html", b"<html")):
        raise WebPage("an HTML page")
