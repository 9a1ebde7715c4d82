"""The plumbing every Alibaba Cloud ECS call shares: the SDK client (one per region, guarded by gpuprov/mutations.py),
one error path (no SDK exception leaves cloud/providers/: a refusal becomes `EcsError`, `LaunchError` or
`NotFound`), resends where they are safe, pages, ECS's eventual consistency (`_settle`), and the owner's tags.

Credentials come from Alibaba's documented chain (alibabacloud-credentials' default client): the
ALIBABA_CLOUD_ACCESS_KEY_ID/_SECRET variables, the aliyun CLI's ~/.aliyun/config.json profile that
ALIBABA_CLOUD_PROFILE names, a RAM role on an ECS instance. That SDK reads its variables once, when it is first
imported (alibabacloud_credentials/utils/auth_util.py): it is imported at the first call, never before.
GPUPROV_ALIBABA_ENDPOINT (a URL: http://127.0.0.1:8000) points every call at one endpoint instead of
ecs.<region>.aliyuncs.com; the tests point it at their imitation.

Every request is built from the SDK's own `<Action>Request` model and every answer read through its
`<Action>ResponseBody`; the client checks each action against gpuprov/mutations.py before it is sent, and the SDK's
own retries stay off (gpuprov resends only what the table allows).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar
from urllib.parse import urlsplit

from gpuprov import mutations
from gpuprov.backoff import tries
from gpuprov.cloud.providers.alibaba_refusals import classify
from gpuprov.cloud.providers.base import TAG_NODE, TAG_OWNER, TAG_TEAM, NotFound
from gpuprov.errors import GpuprovError, UserInputError

T = TypeVar("T")

ENDPOINT_VAR = "GPUPROV_ALIBABA_ENDPOINT"
PAGE = 100  # ECS's largest PageSize / MaxResults
RETRIES = 4  # sends of a request that got no answer or was throttled
NOT_FOUND = {"instance": ("InvalidInstanceId.NotFound",), "security-group": ("InvalidSecurityGroupId.NotFound",),
             "key-pair": ("InvalidKeyPairName.NotFound",), "image": ("InvalidImageId.NotFound",),
             "snapshot": ("InvalidSnapshotId.NotFound",), "placement-group": ("InvalidDeploymentSetId.NotFound",)}


class EcsError(GpuprovError):
    """ECS refused a call: Alibaba Cloud's code and message, and a fix where one is known."""

    def __init__(self, what: str, code: str, message: str, fix: str = "") -> None:
        self.what = what
        self.code = code
        self.message = message
        super().__init__(f"Alibaba Cloud refused {what}: {code}: {message}" + (f"\n  fix: {fix}" if fix else ""))


class EcsNoAnswer(GpuprovError):
    """The request may have reached ECS and no answer came back: what it asked may be done."""


def credentials_hint() -> str:
    return ("configure Alibaba Cloud credentials: ALIBABA_CLOUD_ACCESS_KEY_ID/ALIBABA_CLOUD_ACCESS_KEY_SECRET, or "
            "`aliyun configure` and ALIBABA_CLOUD_PROFILE=<profile>, or a RAM role on the ECS instance")


def endpoint() -> tuple[str, str] | None:
    """(protocol, host[:port]) from GPUPROV_ALIBABA_ENDPOINT, refused by name when it is no URL."""
    raw = os.environ.get(ENDPOINT_VAR)
    if not raw:
        return None
    url = urlsplit(raw)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise UserInputError(ENDPOINT_VAR, f"{raw!r} is not an endpoint URL",
                             "e.g. http://127.0.0.1:8000 (a local endpoint), or unset it for Alibaba Cloud itself")
    return url.scheme, url.netloc


def stamp(raw: str | None) -> datetime | None:
    """ECS's times: 2026-01-02T03:04Z or 2026-01-02T03:04:05Z (UTC)."""
    if not raw:
        return None
    for form in ("%Y-%m-%dT%H:%MZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(raw, form).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def tags_of(raw: dict[str, Any]) -> dict[str, str]:
    return {str(t.get("TagKey")): str(t.get("TagValue")) for t in (raw.get("Tags") or {}).get("Tag") or []}


def _method(action: str, package: str = "alibabacloud_ecs20140526") -> str:
    """The SDK client's method for an action (DescribeVSwitches: describe_vswitches), of ECS's SDK or `package`'s."""
    import importlib

    client = importlib.import_module(f"{package}.client").Client
    names = {name.replace("_", ""): name for name in dir(client) if not name.startswith("_")}
    return names[action.lower()]

class EcsBase:
    """What every part of the ECS provider builds on: the owner, the poll interval, the clients and the error path."""

    def __init__(self, owner: str, *, poll: float = 2.0, legacy: str | None = None,
                 team: dict[str, str] | None = None) -> None:
        endpoint()  # a bad endpoint is said before any call
        self.owner = owner
        self.team = team
        self.owners = (owner, legacy) if legacy else (owner,)
        self.family = legacy or owner  # gc's everyone: every install with this user and host name
        self.poll = poll
        self.fence: Callable[[], None] = lambda: None  # the CLI hands in state.locks.fence, as for AWS
        self._lock = threading.Lock()  # clients are built once, under the lock, then shared by threads
        self._clients: dict[str, Any] = {}
        self._credential: Any = None

    # --- the one path every call takes ---------------------------------------------------------

    def _client(self, region: str) -> Any:
        with self._lock:
            return self._built(region)

    def _built(self, region: str) -> Any:
        from alibabacloud_ecs20140526.client import Client

        return self._made(region, Client, "alibaba-ecs", region_id=region)

    def _made(self, key: str, sdk_client: Any, service: str, **config: Any) -> Any:
        """The SDK client kept under `key`, made once (the caller holds the lock): Alibaba's credentials chain, the
        timeouts, the local endpoint where one is set, and every call checked by `mutations` (retries off)."""
        if key not in self._clients:
            from alibabacloud_credentials.client import Client as Credentials
            from alibabacloud_tea_openapi.utils_models import Config

            class _Checked(sdk_client):  # type: ignore[misc,valid-type]
                def call_api(self, params: Any, request: Any, runtime: Any) -> Any:
                    mutations.check(service, str(params.action), retries=False)
                    return super().call_api(params, request, runtime)

            if self._credential is None:
                self._credential = Credentials()
            made = Config(credential=self._credential, connect_timeout=10_000, read_timeout=60_000, **config)
            where = endpoint()
            if where:
                made.protocol, made.endpoint = where
            self._clients[key] = _Checked(made)
        return self._clients[key]

    def _send(self, region: str, action: str, params: dict[str, Any]) -> dict[str, Any]:
        """One ECS call: the request built by the SDK's `<Action>Request` model, the answer as its body's map."""
        from alibabacloud_ecs20140526 import models

        self.fence()
        request = getattr(models, f"{action}Request")().from_map(
            {"RegionId": region, **params} if "RegionId" in _fields(action) else params)
        return self._ask(self._client(region), request, _method(action), action, action,
                         lambda code: classify(code, "on-demand").fix)

    def _ask(self, client: Any, request: Any, method: str, action: str, what: str,
             fix: Callable[[str], str] = lambda code: "") -> dict[str, Any]:
        """One request sent once by an SDK client (ECS's or RAM's), its refusal an EcsError naming `what` with its
        code and message, no answer EcsNoAnswer, no credentials one UserInputError."""
        from alibabacloud_credentials.exceptions import CredentialException
        from darabonba.runtime import RuntimeOptions
        from Tea.exceptions import TeaException, UnretryableException

        try:
            # the SDK's own retries off: a resend is gpuprov's choice, by the mutations table (_call)
            once = RuntimeOptions(autoretry=False, max_attempts=1)
            reply = getattr(client, f"{method}_with_options")(request, once)
        except UnretryableException as exc:  # the SDK's wrapper of what went wrong before an answer was read
            inner = getattr(exc, "inner_exception", None)
            if isinstance(inner, CredentialException):
                raise UserInputError("Alibaba Cloud credentials", "none found in the chain",
                                     credentials_hint()) from None
            # the connection dropped or the read timed out (the SDK hands the cause over as a map): done, maybe
            detail = inner.get("message") if isinstance(inner, dict) else inner
            raise EcsNoAnswer(f"Alibaba Cloud call {action} got no answer: {detail or exc}") from None
        except TeaException as exc:
            code = str(exc.code or "Unknown")
            data = getattr(exc, "data", None) or {}
            message = str(data.get("Message") or getattr(exc, "message", "") or exc)
            raise EcsError(what, code, message, fix(code)) from None
        except CredentialException:
            raise UserInputError("Alibaba Cloud credentials", "none found in the chain", credentials_hint()) from None
        except OSError as exc:
            raise EcsNoAnswer(f"Alibaba Cloud call {action} got no answer: {exc}") from None
        body = reply.body.to_map() if reply.body is not None else {}
        return dict(body)

    def _call(self, region: str, action: str, **params: Any) -> dict[str, Any]:
        """A call that is safe to send again (a read, a ClientToken, a harmless change): resent after no answer
        or throttling, with backoff."""
        for attempt in range(1, RETRIES + 1):
            try:
                return self._send(region, action, params)
            except EcsNoAnswer:
                if attempt == RETRIES or mutations.MUTATIONS.get(("alibaba-ecs", action)) in mutations.NEVER_RESENT:
                    raise
            except EcsError as exc:
                if classify(exc.code, "on-demand").then != "retry" or attempt == RETRIES:
                    raise
            time.sleep(self.poll * attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _pages(self, region: str, action: str, key: tuple[str, str], size: int = PAGE,
               **params: Any) -> list[dict[str, Any]]:
        """Every page of a Describe call (PageNumber/PageSize, or NextToken/MaxResults where the model has it);
        `size`: the action's largest page where it is smaller than ECS's usual 100."""
        items: list[dict[str, Any]] = []
        fields = _fields(action)
        if "NextToken" in fields and "PageNumber" not in fields:
            token: str | None = None
            while True:
                page = self._call(region, action, **params, MaxResults=size, **({"NextToken": token} if token else {}))
                items += (page.get(key[0]) or {}).get(key[1]) or []
                token = page.get("NextToken") or None
                if not token:
                    return items
        number = 1
        while True:
            page = self._call(region, action, **params, PageNumber=number, PageSize=size)
            got = (page.get(key[0]) or {}).get(key[1]) or []
            items += got
            if not got or len(items) >= int(page.get("TotalCount") or 0):
                return items
            number += 1

    def _settle(self, kind: str, cloud_id: str, settle: float, fn: Callable[[], T]) -> T:
        """`fn`, again with backoff while ECS answers NotFound within `settle` seconds: a resource made a moment
        ago may not be known yet."""
        code = ""
        for _ in tries(settle, self.poll, self.poll * 8):
            try:
                return fn()
            except EcsError as exc:
                if exc.code not in NOT_FOUND.get(kind, ()):
                    raise
                code = exc.code
        raise NotFound(kind, cloud_id, code)

    def _tag_list(self, node: str, extra: dict[str, str] | None = None) -> list[dict[str, str]]:
        tags = {TAG_NODE: node, TAG_OWNER: self.owner, **(self.team or {}), **(extra or {})}
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def _mine(self, tags: dict[str, str], everyone: bool = False) -> bool:
        if self.team:
            return tags.get(TAG_TEAM) == self.team.get(TAG_TEAM)
        owner = tags.get(TAG_OWNER)
        if owner is None:
            return False
        return owner == self.family or owner.startswith(self.family + "/") if everyone else owner in self.owners


def _fields(action: str) -> set[str]:
    """The parameter names the SDK's `<Action>Request` model sends (its map keys)."""
    import inspect

    from alibabacloud_ecs20140526 import models

    model = getattr(models, f"{action}Request")
    return {_camel(name) for name in inspect.signature(model.__init__).parameters if name != "self"}


def _camel(name: str) -> str:
    """The SDK's snake_case field as ECS spells the parameter (region_id: RegionId); close enough for the lookups
    here (RegionId, NextToken, PageNumber)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))
