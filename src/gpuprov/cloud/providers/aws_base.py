"""The plumbing every AWS call shares: clients (thread-safe, one per service and region), one error path
(no botocore exception leaves cloud/providers/: a refusal becomes `AwsError`, `LaunchError` or `NotFound`),
EC2's eventual consistency (`_settle`), the owner's tags, and the retry settings as the AWS CLI reads them.

Credentials, profile, region and endpoint come from the standard AWS chain (AWS_PROFILE,
AWS_REGION, ~/.aws, AWS_ENDPOINT_URL). Throttling and transient errors are retried by botocore's
standard retry mode; AWS_RETRY_MODE and AWS_MAX_ATTEMPTS keep their AWS meaning (AWS_MAX_ATTEMPTS
counts every attempt, the first included).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import boto3
from botocore import xform_name
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError

from gpuprov import mutations
from gpuprov.backoff import tries
from gpuprov.cloud.providers.aws_refusals import classify
from gpuprov.cloud.providers.base import TAG_NODE, TAG_OWNER, NotFound
from gpuprov.endpoints import WebPage, no_web_page, unreadable_answer
from gpuprov.errors import GpuprovError, UserInputError

T = TypeVar("T")

CREDENTIAL_CODES = {"AuthFailure", "InvalidClientTokenId", "ExpiredToken", "SignatureDoesNotMatch",
                    "UnrecognizedClientException", "InvalidAccessKeyId"}
NOT_FOUND = {"instance": "InvalidInstanceID.NotFound", "security-group": "InvalidGroup.NotFound",
             "key-pair": "InvalidKeyPair.NotFound", "volume": "InvalidVolume.NotFound",
             "spot-request": "InvalidSpotInstanceRequestID.NotFound", "image": "InvalidAMIID.NotFound",
             "snapshot": "InvalidSnapshot.NotFound", "placement-group": "InvalidPlacementGroup.Unknown",
             "address": "InvalidAllocationID.NotFound", "network-interface": "InvalidNetworkInterfaceID.NotFound"}


class NoAnswer(GpuprovError):
    """The request may have reached AWS and no answer came back (the connection dropped, the read timed out):
    what it asked may be done. A create with a ClientToken is sent again with the same token; one without looks
    for what it may have made first."""


class AwsError(GpuprovError):
    """EC2 (or another AWS service) refused a call: its code and message, and a fix where one is known."""

    def __init__(self, what: str, code: str, message: str, fix: str = "") -> None:
        self.what = what
        self.code = code
        self.message = message
        text = f"AWS refused {what}: {code}: {message}"
        super().__init__(text + (f"\n  fix: {fix}" if fix else ""))


def credentials_hint() -> str:
    return ("configure AWS credentials: `aws configure`, or AWS_PROFILE=<profile>, or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", str(exc)))


RETRY_MODES = ("standard", "adaptive", "legacy")  # botocore's, as the AWS CLI documents AWS_RETRY_MODE
FILTER_VALUES = 200  # EC2: "The maximum number of filter values specified on a single call is 200"
RETRY_CREATES = 4  # sends of a create without a ClientToken, each after a look for what the last one made
MAX_ATTEMPTS = 100  # a sanity bound on AWS_MAX_ATTEMPTS: every attempt waits a backoff of up to 20 s


def check_environment() -> None:
    """The AWS settings gpuprov reads from the environment, each refused by name (exit 2) before any client
    is built: botocore would fail later, deep in a call, with a ValueError or a partial-credentials error."""
    attempts = os.environ.get("AWS_MAX_ATTEMPTS")
    if attempts and not (attempts.strip().isdigit() and 1 <= int(attempts) <= MAX_ATTEMPTS):
        raise UserInputError("AWS_MAX_ATTEMPTS", f"{attempts!r} is not in the range 1 to {MAX_ATTEMPTS}",
                             "every attempt counts, the first included: e.g. 5, or unset it for the default")
    mode = os.environ.get("AWS_RETRY_MODE")
    if mode and mode not in RETRY_MODES:
        raise UserInputError("AWS_RETRY_MODE", f"{mode!r} is not a retry mode", f"one of {', '.join(RETRY_MODES)}")
    for name in sorted(k for k in os.environ if k == "AWS_ENDPOINT_URL" or k.startswith("AWS_ENDPOINT_URL_")):
        url = urlsplit(os.environ[name])
        try:
            url.port  # noqa: B018  (raises on a port that is no number)
        except ValueError:
            url = url._replace(netloc="")
        if os.environ[name] and (url.scheme not in ("http", "https") or not url.hostname):
            raise UserInputError(name, f"{os.environ[name]!r} is not an endpoint URL",
                                 "e.g. http://127.0.0.1:5000 (a local endpoint), or unset it for AWS itself")
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and not secret:  # botocore's PartialCredentialsError, at the first call
        raise UserInputError("AWS_SECRET_ACCESS_KEY", "not set, though AWS_ACCESS_KEY_ID is",
                             "set both (and AWS_SESSION_TOKEN for temporary credentials), or neither to use "
                             "AWS_PROFILE or ~/.aws")


def retry_config(attempts: int | None = None) -> Config:
    """botocore's retries as the AWS CLI reads them from the environment; `attempts` overrides the count."""
    check_environment()
    total = attempts if attempts is not None else int(os.environ.get("AWS_MAX_ATTEMPTS") or 5)
    retries = {"mode": os.environ.get("AWS_RETRY_MODE") or "standard", "total_max_attempts": total}
    return Config(retries=retries, connect_timeout=10, read_timeout=60)  # type: ignore[arg-type]


def chunked(filters: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """`Filters` keyword arguments for as many calls as it takes: EC2 refuses a call whose filters carry more than
    FILTER_VALUES values in all (FilterLimitExceeded), so the longest filter is split; the calls' answers together
    are the one call's (each value is one filter's alternative)."""
    if not filters:
        return [{}]
    values = sum(len(f["Values"]) for f in filters)
    if values <= FILTER_VALUES:
        return [{"Filters": filters}]
    longest = max(range(len(filters)), key=lambda i: len(filters[i]["Values"]))
    room = FILTER_VALUES - (values - len(filters[longest]["Values"]))
    if room < 1:
        raise AssertionError(f"filters with {values} values cannot be split into calls of {FILTER_VALUES}")
    long = list(filters[longest]["Values"])
    return [{"Filters": [*filters[:longest], {**filters[longest], "Values": long[at:at + room]}, *filters[longest + 1:]]}
            for at in range(0, len(long), room)]


def _unfenced() -> None:
    """No fence: a provider used on its own (tests, tools) holds no lease."""


class AwsBase:
    """What every AWS provider part builds on: the owner, the poll interval, the clients and the error path."""

    def __init__(self, owner: str, *, poll: float = 2.0, legacy: str | None = None,
                 team: dict[str, str] | None = None) -> None:
        check_environment()
        self.owner = owner  # what new resources are tagged with
        self.team = team  # team state: gpuprov:team and gpuprov:member on everything (cloud/tags.py team_tags)
        # what follows records as ours: the owner, and the legacy one (cloud/tags.py) of resources made before
        self.owners = (owner, legacy) if legacy else (owner,)
        # what gc lists (and sets apart): every install with this user and host name (EC2 filters take wildcards)
        self.family = (legacy, f"{legacy}/*") if legacy else (owner,)
        self.poll = poll
        # called before every AWS call: the CLI gives it `state.locks.fence`, which stops a command whose node lease
        # a teammate took (a provider knows nothing of the records, so the check is handed in)
        self.fence: Callable[[], None] = _unfenced
        self._lock = threading.Lock()
        self._session: Any = None
        self._clients: dict[tuple[str, str, bool], Any] = {}

    def _client(self, service: str, region: str, *, retries: bool = True) -> Any:
        # boto3 clients are thread-safe, sessions are not: build clients under a lock, then share them
        key = (service, region, retries)
        with self._lock:
            if key not in self._clients:
                if self._session is None:
                    try:
                        self._session = boto3.session.Session()
                    except ProfileNotFound as exc:
                        from gpuprov.cloud.providers.aws_region import profile_not_found

                        raise profile_not_found(str(exc.kwargs.get("profile", "?"))) from None
                config = retry_config() if retries else retry_config(attempts=1)
                made = self._session.client(service, region_name=region, config=config)
                made.meta.events.register("before-parse", no_web_page)
                mutations.guard(made, service, retries=retries)
                self._clients[key] = made
            return self._clients[key]

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one AWS call, unless the fence stops it first; every failure becomes a GpuprovError that says what to
        do."""
        self.fence()
        try:
            return fn()
        except NoCredentialsError:
            raise UserInputError("AWS credentials", "none found", credentials_hint()) from None
        except PartialCredentialsError as exc:  # a profile or credentials file with half of a key pair
            raise UserInputError("AWS credentials", f"incomplete: {exc}", credentials_hint()) from None
        except NoRegionError:
            raise UserInputError("--region", "no AWS region set", "pass --region or set AWS_REGION") from None
        except ProfileNotFound as exc:
            from gpuprov.cloud.providers.aws_region import profile_not_found

            raise profile_not_found(str(exc.kwargs.get("profile", "?"))) from None
        except ClientError as exc:
            code, message = _code(exc), _message(exc)
            fix = credentials_hint() if code in CREDENTIAL_CODES else classify(code, message, "on-demand").fix
            raise AwsError(what, code, message, fix) from None
        except (ConnectionClosedError, ReadTimeoutError, EndpointConnectionError, ConnectTimeoutError) as exc:
            raise NoAnswer(f"AWS call {what} got no answer: {exc}") from None
        except (ResponseParserError, WebPage) as exc:  # not AWS's answer: an HTML page, a web server that is not AWS
            raise unreadable_answer(what, str(exc)) from None
        except BotoCoreError as exc:  # bad config, and the like
            raise GpuprovError(f"AWS call {what} failed: {exc}") from None

    def _create_once(self, what: str, send: Callable[[], T], look: Callable[[], T | None], *,
                     duplicate: str | None = None, settle: float = 60.0) -> T:
        """A create without a ClientToken (Repeat.LOOK in gpuprov/mutations.py), `send` on a client with retries
        off. After an answer that may have been lost (none came, a 5xx, throttling), `look` for what it made
        before asking again. `duplicate`: the refusal a second send meets when the first was made after all; EC2
        may not show it yet, so it is then looked for until it does (within `settle` seconds)."""
        lost = False
        for attempt in range(1, RETRY_CREATES + 1):
            try:
                return self._call(what, send)
            except NoAnswer:
                if attempt == RETRY_CREATES:
                    raise
            except AwsError as exc:
                if lost and duplicate is not None and exc.code == duplicate:
                    return self._look_until(what, look, settle)
                if classify(exc.code, exc.message, "on-demand").then != "retry" or attempt == RETRY_CREATES:
                    raise
            lost = True
            time.sleep(self.poll * attempt)
            made = look()
            if made is not None:
                return made
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _look_until(self, what: str, look: Callable[[], T | None], settle: float) -> T:
        """`look` with backoff until it finds something, for at most `settle` seconds (EC2 is eventually
        consistent: what a lost answer made may not be listed yet)."""
        for _ in tries(settle, self.poll, self.poll * 8):
            found = look()
            if found is not None:
                return found
        raise GpuprovError(f"{what}: its answer was lost and what it made is not listed after {settle:.0f}s")

    def _pages(self, client: Any, what: str, key: str, **kwargs: Any) -> list[Any]:
        """Every page of a paginated Describe call's `key` items (EC2 answers at most MaxResults, or its own page
        limit, and a NextToken for the rest: page 1 alone misses them); filters with more values than one call may
        carry are asked in several calls."""
        paginator = client.get_paginator(xform_name(what))
        return self._call(what, lambda: [item for filters in chunked(kwargs.get("Filters"))
                                         for page in paginator.paginate(**{**kwargs, **filters})
                                         for item in page[key]])

    def _settle(self, what: str, fn: Callable[[], T], kind: str, cloud_id: str, settle: float) -> T:
        """`fn`, looking again (with backoff) while the resource answers NotFound within `settle` seconds:
        right after a create EC2 may not know the id yet (EC2 guide, "Eventual consistency")."""
        code = ""
        for _ in tries(settle, self.poll, self.poll * 8):
            try:
                return self._call(what, fn)
            except AwsError as exc:
                if exc.code != NOT_FOUND.get(kind):
                    raise
                code = exc.code
        raise NotFound(kind, cloud_id, code)

    def _tags(self, node: str, extra: dict[str, str] | None = None) -> list[dict[str, str]]:
        tags = {TAG_NODE: node, TAG_OWNER: self.owner, "Name": f"gpuprov-{node}", **(self.team or {}), **(extra or {})}
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def _owned(self, everyone: bool = False) -> list[dict[str, Any]]:
        if self.team:  # team state: every member's, as the team's records are everyone's
            return [{"Name": f"tag:{k}", "Values": [v]} for k, v in self.team.items() if k == "gpuprov:team"]
        return [{"Name": f"tag:{TAG_OWNER}", "Values": list(self.family if everyone else self.owners)}]

    def _while_in_use(self, fn: Callable[[], Any], timeout: float = 300) -> None:
        """EC2 keeps a group or volume 'in use' for a while after its instance is gone: retry, bounded."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                fn()
                return
            except AwsError as exc:
                if exc.code not in ("DependencyViolation", "VolumeInUse", "IncorrectState", "InvalidSnapshot.InUse",
                                    "InvalidPlacementGroup.InUse", "InvalidIPAddress.InUse") \
                        or time.monotonic() > deadline:
                    raise
                time.sleep(self.poll)


def tag_value(raw: dict[str, Any], key: str = TAG_NODE) -> str | None:
    for tag in raw.get("Tags") or []:
        if tag.get("Key") == key:
            return str(tag.get("Value"))
    return None
