"""The fast lane's fake cloud: the real `AwsProvider` against moto's in-process mock (`moto.mock_aws`, which stands
in for botocore's transport, as httpx's MockTransport does for httpx), and the CLI run in the test's own process.

    def test_x(fake_cloud):
        result = fake_cloud.gp("up", "n1", "--gpu", "T4", "--yes", "--no-bootstrap", "--no-wait")
        assert result.exit_code == 0, result.output   # Click's Result: exit_code, stdout, stderr, output
        fake_cloud.ec2().describe_instances()          # moto's ground truth, as `aws.ec2()` is in the heavy lane
        fake_cloud.leftovers()                         # what is left tagged as ours (tests.aws.cli.EMPTY when nothing)

It is the heavy lane's imitation (tests/aws/fixture.py) without the servers: moto with the same validation and
images (`moto_settings`), the same SSM parameters put the same way (`moto_seeded.seed`), the tool's AWS environment
(`tool_env`, `use_env`), the CLI's test settings (tests/aws/cli.py `CLI_SETTINGS`), the same `leftovers`.

The endpoint: AWS_ENDPOINT_URL is a loopback address (`ENDPOINT`) that no request reaches, as it is the moto
server's in the heavy lane, so gpuprov takes the cloud for the local imitation it is: it never connects to the
public addresses moto makes up (real machines on the internet: cloud/contact.py), and refuses an `up` that would.
With no endpoint set the mock would answer too, but the tool would take it for AWS itself. One botocore handler,
ahead of moto's, sends each request to AWS's name for its service and region (read from its SigV4 credential
scope) before moto's handler matches it; nothing leaves the process.

What moto 5.2 lacks and the heavy lane's proxy plays: placement groups and launches into them are played here by
the proxy's own `ClusterEc2` (tests/aws/ec2_cluster.py), in its "instant" kind. Heavy-only (the `aws` fixture):
the spot requests EC2 keeps for RunInstances and their interruptions (tests/aws/ec2_spot.py: moto makes none, so a
spot node here has none to cancel), the proxy's other EC2 contracts (pages, addresses, images), EC2's eventual
consistency, faults and lost answers, spot prices and quotas, and SSH to the instances.

The facts folder is the test's own, with what `up` keeps of EC2's DescribeInstanceTypes after its first read of the
day (cloud/instance_facts.py) already in it, made from moto's own table of types through the provider's parser:
moto's answer, all 1,395 types as XML, takes 10 s and more to build on a busy 2-core machine. The heavy lane reads
it through the API (tests/test_instance_facts.py).

DescribeInstanceTypeOfferings and DescribeInstanceTypes, moto's answers from its fixed tables of AWS's data (the
same whatever a test did), are built once per process (`_STATIC`). Each command makes its botocore sessions
afresh, as each run of the executable does; their loader of botocore's model files is shared (`_shared_loader`):
the files do not change, and reading EC2's model again for every client was most of these tests' time.

mock_aws keeps its backends in this process: `fake_cloud` starts it per test (a reset; the backends are built again
as the test first reaches them, a fraction of a second) and stops it after, so no other test meets it. The first
test of a worker pays for importing moto, boto3 and gpuprov's cloud modules, seconds that a session-wide mock would
not save.
"""

from __future__ import annotations

import functools
import re
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.aws.cli import CLI_SETTINGS
from tests.aws.ec2_cluster import ClusterEc2
from tests.aws.fault_proxy import ec2_error_body
from tests.aws.fixture import REGIONS, moto_settings, ssm_parameters, tagged_in_moto, tool_env, use_env
from tests.aws.moto_seeded import seed

# never connected to: every request is answered in the process (loopback, so gpuprov knows it for a local imitation)
ENDPOINT = "http://127.0.0.1:9"
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/([^/]+)/aws4_request")
_PLACEMENT = ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup")
# answered from moto's fixed tables of AWS's data (the same for every account, whatever a test did), each a large
# answer to build: once per process
_STATIC = ("DescribeInstanceTypeOfferings", "DescribeInstanceTypes")
_ANSWERS: dict[tuple[str, str], tuple[int, dict[str, str], bytes]] = {}


class _ToMoto:
    """The botocore `before-send` handler, registered once per process ahead of moto's and doing nothing while no
    FakeCloud is on: it answers the placement-group calls, and hands every other request to moto's own handler at
    AWS's address for it (and hands back the request as it came)."""

    def __init__(self) -> None:
        self.cloud: FakeCloud | None = None

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        cloud = self.cloud
        split = urllib.parse.urlsplit(request.url)
        if cloud is None or f"{split.scheme}://{split.netloc}" != ENDPOINT:
            return None
        auth = request.headers.get("Authorization") or b""
        scope = _SCOPE.search(auth.decode() if isinstance(auth, bytes) else auth)
        if scope is None:
            raise RuntimeError(f"the in-process fake cloud cannot tell the service of an unsigned request: {request.url}")
        region, service = scope.groups()
        loopback = request.url
        request.url = urllib.parse.urlunsplit(("https", f"{service}.{region}.amazonaws.com", split.path, split.query, ""))
        try:
            return cloud.ec2_request(region, request, kwargs) if service == "ec2" else cloud.moto(request, kwargs)
        finally:
            # botocore calls every before-send handler and takes the first answer: moto's own, next, must see a
            # request that is not AWS's and pass, or it would answer it a second time
            request.url = loopback


_HANDLER = _ToMoto()


def _install() -> None:
    """Put the handler into botocore's built-in handlers, ahead of moto's: every session made afterwards (each
    provider makes its own) has it."""
    from botocore.handlers import BUILTIN_HANDLERS
    from moto.core.models import botocore_stubber

    if ("before-send", _HANDLER) in BUILTIN_HANDLERS:
        return
    BUILTIN_HANDLERS.insert(BUILTIN_HANDLERS.index(("before-send", botocore_stubber)), ("before-send", _HANDLER))


class FakeCloud:
    """moto in this process, seeded as the moto server is, and the CLI run against it with Click's CliRunner."""

    def __init__(self, workdir: Path, regions: tuple[str, ...] = REGIONS) -> None:
        self.workdir = workdir
        self.regions = regions
        self.cluster = ClusterEc2()  # instant kind: a new group is known at once (fresh_lookups 0)
        self._lock = threading.Lock()  # ClusterEc2 runs under its caller's lock (the proxy's state lock)
        self._mock: Any = None
        self._clients: dict[str, Any] = {}

    def env(self) -> dict[str, str]:
        """The environment the CLI runs with (os.environ, through `use_env`)."""
        return {**tool_env(ENDPOINT, self.workdir), **CLI_SETTINGS}

    def start(self) -> FakeCloud:
        from moto import mock_aws

        _install()
        self._mock = mock_aws()
        self._mock.start()  # a fresh account: every backend reset
        seed({region: ssm_parameters() for region in self.regions})
        _HANDLER.cloud = self
        return self

    def stop(self) -> None:
        _HANDLER.cloud = None
        if self._mock is not None:
            self._mock.stop()
            self._mock = None

    # ------------------------------------------------------------------ the CLI
    def gp(self, *args: str) -> Any:
        """`gpuprov ARGS` in this process: Click's Result (exit_code, stdout, stderr, output). Each command reads
        its settings afresh, as each run of the executable does."""
        from click.testing import CliRunner

        from gpuprov.cli import main
        from gpuprov.settings import reset

        reset()
        return CliRunner().invoke(main, list(args), prog_name="gpuprov")

    # ------------------------------------------------------------------ ground truth
    def ec2(self, region: str = "us-east-1") -> Any:
        """A boto3 EC2 client into the mock, for assertions and for making things behind gpuprov's back."""
        if region not in self._clients:
            import boto3

            self._clients[region] = boto3.client("ec2", region_name=region, endpoint_url=ENDPOINT)
        return self._clients[region]

    def leftovers(self, tag_key: str = "gpuprov:node") -> dict[str, list[str]]:
        """As AwsEndpoint.leftovers: every live resource carrying `tag_key`, by kind, in every region (no spot
        request: moto makes none for RunInstances, and the proxy that keeps them is the heavy lane's)."""
        out: dict[str, list[str]] = {"instances": [], "security_groups": [], "key_pairs": [], "volumes": [],
                                     "spot_requests": [], "launch_templates": [], "placement_groups": [],
                                     "addresses": []}
        for region in self.regions:
            for kind, found in tagged_in_moto(self.ec2(region), tag_key).items():
                out[kind] += found
        with self._lock:
            out["placement_groups"] += [g["name"] for g in self.cluster.groups.values() if tag_key in g["tags"]]
        return out

    # ------------------------------------------------------------------ requests (the handler's)
    def moto(self, request: Any, kwargs: dict[str, Any]) -> Any:
        from moto.core.models import botocore_stubber

        return botocore_stubber(kwargs.get("event_name", "before-send"), request)

    def ec2_request(self, region: str, request: Any, kwargs: dict[str, Any]) -> Any:
        """An EC2 call: the placement-group ones answered by ClusterEc2, RunInstances checked by it and handed to
        moto as moto understands it (no group, MinCount as EC2 would launch), the rest to moto as they are."""
        body = request.body or b""
        form = dict(urllib.parse.parse_qsl(body.decode() if isinstance(body, bytes) else body, keep_blank_values=True))
        req = {"action": form.get("Action", ""), "form": form, "region": region}
        if req["action"] in _PLACEMENT:
            return self._answer(request, self._placement(req))
        if req["action"] in _STATIC:
            return self._static(region, request, kwargs)
        if req["action"] != "RunInstances":
            return self.moto(request, kwargs)
        with self._lock:
            checked = self.cluster.run_instances(req, None)
        if not isinstance(checked, dict):
            return self._answer(request, checked)
        request.body = urllib.parse.urlencode(checked).encode()
        request.headers["Content-Length"] = str(len(request.body))
        response = self.moto(request, kwargs)
        if response is not None and response.status_code == 200:
            with self._lock:
                self.cluster.launched(req, response.content)
        return response

    def _static(self, region: str, request: Any, kwargs: dict[str, Any]) -> Any:
        """moto's answer from its fixed tables, built once per process for each region and request."""
        from botocore.awsrequest import AWSResponse
        from moto.core.botocore_stubber import MockRawResponse

        key = (region, str(request.body))
        if key not in _ANSWERS:
            response = self.moto(request, kwargs)
            _ANSWERS[key] = (response.status_code, dict(response.headers.items()), response.content)
        status, headers, body = _ANSWERS[key]
        return AWSResponse(request.url, status, headers, MockRawResponse(body))  # type: ignore[arg-type]

    def _placement(self, req: dict[str, Any]) -> tuple[int, bytes] | tuple[int, str, str]:
        with self._lock:
            if req["action"] != "DeletePlacementGroup":
                answer = self.cluster.answer(req)
                assert answer is not None
                return answer
            members = self.cluster.members(req)
        live = self._live(req["region"], members)
        with self._lock:
            return self.cluster.delete(req, live)

    def _live(self, region: str, ids: list[str]) -> list[str]:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        backend = ec2_backends[DEFAULT_ACCOUNT_ID][region]
        return [i.id for i in backend.all_instances() if i.id in ids and i.state != "terminated"]

    @staticmethod
    def _answer(request: Any, result: tuple[int, bytes] | tuple[int, str, str]) -> Any:
        from botocore.awsrequest import AWSResponse
        from moto.core.botocore_stubber import MockRawResponse

        if len(result) == 2:
            status, body = result
        else:
            status, code, message = result
            body = ec2_error_body(code, message)
        return AWSResponse(request.url, status, {"Content-Type": "text/xml"}, MockRawResponse(body))  # type: ignore[arg-type]


@functools.cache
def _shared_loader(search_path: str | None = None) -> Any:
    """One botocore loader per data path for every session of this process (it caches each model it reads)."""
    from botocore.loaders import create_loader

    return create_loader(search_path)


@functools.cache
def _instance_types() -> list[Any]:
    """moto's DescribeInstanceTypes rows, as the provider reads them."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    from gpuprov.cloud.providers.aws import _type_info

    return sorted((_type_info(row) for row in INSTANCE_TYPES.values()), key=lambda i: i.name)


class _TypesRead:
    """A provider that only lists instance types: what `live_catalog` asks, answered from moto's table."""

    def gpu_instance_types(self, region: str) -> list[Any]:
        return _instance_types()


def _instance_facts(regions: tuple[str, ...]) -> None:
    """The day's instance types of each region in the facts folder, written by `live_catalog` itself."""
    from gpuprov.cloud.instance_facts import live_catalog
    from gpuprov.plan import catalog

    for region in regions:
        live_catalog(catalog.load(), _TypesRead(), region, lambda text: None)  # type: ignore[arg-type]


@pytest.fixture
def fake_cloud(gp_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeCloud]:
    """The in-process fake cloud for one test (the fast lane's `aws` + `env`): a fresh mock, os.environ pointing
    the CLI at it, a GPUPROV home of the test's own (`gp_home`)."""
    cloud = FakeCloud(Path(tempfile.mkdtemp(prefix="fake-cloud-", dir=tmp_path)))
    monkeypatch.setenv("GPUPROV_HOME", str(gp_home))
    for key, value in moto_settings(cloud.workdir).items():  # read when the mock builds a region's EC2 backend
        monkeypatch.setenv(key, value)
    use_env(monkeypatch, cloud.env())
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(cloud.workdir / "facts"))
    monkeypatch.setattr("botocore.session.create_loader", _shared_loader)
    _instance_facts(cloud.regions)
    cloud.start()
    try:
        yield cloud
    finally:
        cloud.stop()
