"""The AWS region a command works in, found the way the AWS CLI finds it, and where AWS's calls go.

--region, then AWS_REGION, then AWS_DEFAULT_REGION, then gpuprov's config file (`region`), then the
profile's `region` in the AWS config
file (AWS_PROFILE or the default profile), then us-east-1. botocore is read only when a profile
could say something, so `plan` stays fast and offline. No SDK is imported to load this module: cloud/ reads
`local_endpoint` through the registry (cloud/providers/__init__.py `local_endpoint`) without making a provider.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuprov.cloud.region import Region
from gpuprov.errors import UserInputError

DEFAULT = "us-east-1"


def resolve(given: str | None) -> Region:
    if given:
        return Region(given, "--region")
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(var):
            return Region(os.environ[var], var)
    from gpuprov.paths import config_path

    if config_path().exists():
        from gpuprov.plan import config as settings

        configured = settings.load().region
        if configured:
            return Region(configured, f"config file {config_path()}")
    profile = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE")
    config = Path(os.environ.get("AWS_CONFIG_FILE") or Path.home() / ".aws" / "config")
    if profile or config.exists():
        import botocore.session
        from botocore.exceptions import ProfileNotFound

        try:
            region = botocore.session.Session().get_config_variable("region")
        except ProfileNotFound:
            raise profile_not_found(profile or "default") from None
        if region:
            return Region(str(region), f"profile '{profile or 'default'}'")
    return Region(DEFAULT, "default")


def profile_not_found(profile: str) -> UserInputError:
    return UserInputError("AWS_PROFILE", f"no AWS profile called {profile!r} in the AWS config or credentials files",
                          "list profiles with `aws configure list-profiles`, or unset AWS_PROFILE")


def local_endpoint() -> str | None:
    """The EC2 endpoint when it is on this machine (AWS_ENDPOINT_URL_EC2 or AWS_ENDPOINT_URL on 127.0.0.0/8,
    ::1 or localhost: moto, `make sandbox`); None for AWS itself."""
    import ipaddress
    from urllib.parse import urlsplit

    from gpuprov.endpoints import endpoint_url

    url = endpoint_url("EC2")
    host = urlsplit(url).hostname if url else None
    if not host:
        return None
    if host == "localhost":
        return url
    try:
        return url if ipaddress.ip_address(host).is_loopback else None
    except ValueError:
        return None
