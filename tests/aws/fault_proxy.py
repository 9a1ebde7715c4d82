"""Fault-injecting reverse proxy in front of moto_server (HTTP/1.1, threaded).

Run:  python fault_proxy.py LISTEN_PORT UPSTREAM_URL      (LISTEN_PORT 0 = pick a free one)
When listening it prints one line  ``fault_proxy ready http://127.0.0.1:PORT``  (flushed); before that
nothing.  ``GET /__faults__`` answering 200 is the other readiness signal.

Every request not under ``/__faults__`` is forwarded to the upstream unless a rule matches it or the realism
layer (below) answers it.

Kinds (the realism layer, class Ec2Realism; EC2 developer guide, "Eventual consistency in the Amazon EC2 API"):
  realistic (the default, and what DELETE /__faults__ restores)  EC2's eventual consistency, for resources created
           through this proxy (RunInstances instance ids, CreateSecurityGroup GroupId, ImportKeyPair/CreateKeyPair
           KeyName + KeyPairId, CreateVolume VolumeId; spot request ids from RunInstances/RequestSpotInstances replies
           only lag behind tag filters):
           * fresh ids: the first ``fresh_lookups`` (default 2) requests naming a fresh id by id answer EC2's NotFound
             (HTTP 400) instead of being forwarded -- DescribeInstances/TerminateInstances/StopInstances/
             StartInstances InstanceId.N, ModifyInstanceAttribute InstanceId ->
             InvalidInstanceID.NotFound; DescribeSecurityGroups GroupId.N, AuthorizeSecurityGroupIngress/
             DeleteSecurityGroup GroupId, RunInstances SecurityGroupId.N -> InvalidGroup.NotFound; DescribeKeyPairs
             KeyName.N/KeyPairId.N, RunInstances KeyName -> InvalidKeyPair.NotFound; DescribeVolumes VolumeId.N ->
             InvalidVolume.NotFound. Several ids: NotFound if any is fresh; each refusal counts one look-up for
             every fresh id the request named. A matching rule with a canned effect (code/body/spot_prices) wins.
           * tag lag: the first ``tag_lag`` (default 1) Describe{Instances,SecurityGroups,KeyPairs,Volumes,
             SpotInstanceRequests} answers filtered by tag (Filter.N.Name "tag:..." or "tag-key") that would show a
             fresh resource leave its item out (an emptied reservation goes too); one look-up per resource hidden.
           * images: a CreateImage (or CopyImage) id is fresh like the others (DescribeImages ImageId.N,
             DeregisterImage, RunInstances ImageId -> InvalidAMIID.NotFound) and `pending` in its first
             ``image_pending`` (default 2) DescribeImages answers before moto's `available`.
           * client tokens: the first ``token_lag`` (default 1) DescribeInstances filtered by a launch's `client-token`
             find nothing yet (a filtered Describe is eventually consistent like the tag filters).
           Budgets are fixed when the create reply passes. Ids created straight in moto are never fresh.
           In both kinds (EC2's contract, not timing): CreateImage of a name the account already has is
           InvalidAMIName.Duplicate; its snapshot TagSpecification tags the image's snapshots (moto: NotImplemented).
           CopyImage (moto reads neither): its ClientToken answers a repeat with the first copy, and its
           TagSpecification.N tag the copy and its snapshots; the copy's root snapshot has the source's size.
  instant  moto as it is: everything passes through, nothing is learnt.

S3 (tests/aws/s3_contracts.py): a request's action is botocore's `x-id` or the method on an object (form Bucket and
Key for rules); one conditional PutObject/DeleteObject (If-None-Match / If-Match) per object reaches moto at a time,
another arriving meanwhile is S3's 409 ConditionalRequestConflict (log outcome "s3-conflict").

EC2 contracts moto lacks (tests/aws/ec2_contracts.py, which has the sources), before a request reaches moto and on
its answer, in both kinds unless said: AssociateAddress by InstanceId of a multi-interface instance ->
InvalidInstanceID; AllocateAddress past the Elastic IP quota (the canned L-0263D0A3 answer, else 5) ->
AddressLimitExceeded; RunInstances with a root volume below the image's snapshot -> InvalidBlockDeviceMapping (and
images' root snapshots sized as EC2 sizes them); IPv6 counts as EC2 takes them; a security group of another VPC than
the launch's subnet (named, or the zone's default one) -> InvalidParameter; an unknown instance profile ->
InvalidParameterValue (realistic: a profile created through the proxy too, for its first ``fresh_lookups``
launches); MaxResults/NextToken on DescribeSpotPriceHistory/SpotInstanceRequests/Volumes/Images/Snapshots, and
``page_size``; realistic: a deregistered image still listed for ``deregistered_listed`` answers.

EC2's instance types today (tests/aws/ec2_types.py): DescribeInstanceTypes and DescribeInstanceTypeOfferings answer
moto's data with g7e.2xlarge and an invented g9.2xlarge pinned (in botocore's EC2 model's shape) and without retired
ones (P3).

Control API (same port, JSON):
  POST   /__faults__          body: one rule or a list of rules -> appended (a rule whose ``name`` equals an
                              existing rule's name replaces it in place, counters reset). Answers the ids.
  GET    /__faults__          {"rules": [rule + "id", "hits", "held"], "log": [entry...], "holding": N,
                               "realism": {"kind", "fresh_lookups", "tag_lag", "known": [{"region", "id", "kind",
                               "fresh", "lag"}...]}}   (fresh/lag = look-ups left)
  DELETE /__faults__          clear rules and log (and release anything held); back to the default realistic
                              settings, every fresh id forgotten
  GET    /__faults__/kind     {"kind": "realistic"|"instant", "fresh_lookups": N, "tag_lag": N}
  POST   /__faults__/kind     body: any of those three fields (others keep their value) -> all three; 400 on an
                              unknown field or bad value
  POST   /__faults__/release  answer every held request now; -> {"released": N}
  DELETE /__faults__/log      clear only the log
  POST   /__faults__/spot/interrupt  body {"instance_id", "region"}: EC2 interrupts that spot instance (ec2_spot.py)
  GET    /__faults__/placement-groups   the placement groups the proxy keeps (moto has none; ec2_cluster.py)
  GET    /__faults__/spot-requests   the spot requests the proxy keeps for RunInstances (moto makes none; ec2_spot.py)
  POST   /__faults__/regions  {"not_enabled": [...]}: the opt-in regions the account has not enabled (default
                              NOT_ENABLED): every call there answers AuthFailure 401; DescribeRegions leaves them out
                              unless AllRegions
  GET    /__faults__/capacity  Capacity Reservations, Block offerings and the proxy's clock (ec2_capacity.py); POST
                              {"reservations": [...], "offerings": [...], "advance": seconds} adds them, moves the clock
  GET    /__faults__/contracts  the EC2-contract settings (page_size, deregistered_listed, address_limit) and what was
                              learnt for them; POST one or more settings -> all of them (400 on an unknown one); DELETE
                              /__faults__ restores the defaults
  DELETE /__faults__/tokens   forget the ClientTokens seen (EC2 state, not a fault: DELETE /__faults__ keeps them;
                              the fixture's reset() calls this with moto's own reset)

Rule fields:
  action   query-protocol Action (RunInstances) -- for JSON-protocol requests it also matches the operation
           part of X-Amz-Target (GetServiceQuota)
  target   exact X-Amz-Target (ServiceQuotasV20190624.GetServiceQuota)
  service  / region   match the SigV4 credential scope (ec2, us-west-2) -- optional
  match    {field: value}: query form fields (Placement.AvailabilityZone, InstanceType, ...) or top-level JSON
           keys. Values are compared as strings; a list value = any of; None = field must be absent.
  times    None = always, N = only the first N matching requests
  delay    seconds to sleep before acting (optional, combines with any effect)
  name     optional label (see POST)
 one effect:
  code (+ status, message)  -> AWS error: EC2 XML for query protocol, JSON __type + x-amzn-ErrorType for JSON
           protocol. Without ``status``: EC2's status for the code (EC2_ERROR_STATUS: Insufficient*Capacity and
           InternalError 500, RequestLimitExceeded and Unavailable 503, AuthFailure 401, UnauthorizedOperation
           403), else 400; JSON protocol 400. An explicit ``status`` wins.
  body (+ status default 200, content_type)  -> canned body
  spot_prices: [{"instance_type", "az", "price", "product"?, "az_id"?}]  -> DescribeSpotPriceHistory answer
           built per request: rows filtered by the request's InstanceType.N / ProductDescription.N /
           AvailabilityZone / Filter.N (instance-type, availability-zone, product-description), timestamp now
  capacity: N (RunInstances) -> EC2's capacity for the whole request: MinCount above N is refused with
           InsufficientInstanceCapacity (500) and nothing launches; otherwise min(MaxCount, N) instances launch
  pause: true  -> the request waits on its way, before the cloud (or the S3 imitation's one-conditional-write-in-
           flight rule) sees it, until POST /__faults__/release; then it goes on as any other (counted in "holding").
           A request slow on the network: another client's requests meanwhile meet the object as it is.
  hold: true  -> forward upstream, read the answer, count it (rule "held", log "held": true), then answer
           only after POST /__faults__/release; if the client goes away meanwhile the answer is dropped
           (log "outcome": "client-gone").
  lose: "drop" | "500"  -> forward upstream (the work is done), then drop the connection without an answer, or answer
           500 InternalError (S3's error document for S3): a lost answer (EC2 API reference, "Ensure idempotency":
           repeat with the same token; on S3 a conditional write's repeat meets its own write: 412)
  spot_dies: CODE (RunInstances) -> the launched instances go pending -> terminated at once with StateReason CODE
  (no effect but delay) -> forwarded after the delay

Log entry (one per proxied request, in arrival order):
  {"seq", "method", "path", "service", "region", "action", "target", "form", "json", "status",
   "rule" (id/name of the rule that fired, "fresh" when the realism layer answered NotFound, or None), "held",
   "outcome" ("forwarded", "fault", "fresh-notfound", "held", "released", "client-gone", "upstream-error: ..."),
   "fresh" (the fresh ids a "fresh-notfound" answer named), "hidden" (ids tag lag left out of the answer)}
  "status" is filled when the upstream/canned answer exists (None before that).

Other AWS status conventions worth using: SpotMaxPriceTooLow/VcpuLimitExceeded/MaxSpotInstanceCountExceeded/
Unsupported/InvalidParameterValue 400 (the default).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import http.client
import json
import re
import select
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

try:  # as a module (tests) or as a script (python fault_proxy.py): the sibling modules either way
    from tests.aws.ec2_capacity import CapacityEc2
    from tests.aws.ec2_cluster import ClusterEc2, live_instances, terminate_form
    from tests.aws.ec2_contracts import Ec2Contracts
    from tests.aws.ec2_spot import SpotEc2
    from tests.aws.ec2_types import answer as types_answer
    from tests.aws.s3_contracts import CONFLICT_BODY, S3Conditional
    from tests.aws.s3_contracts import action as s3_action
except ImportError:  # pragma: no cover - script mode
    from ec2_capacity import CapacityEc2  # type: ignore[no-redef]
    from ec2_cluster import ClusterEc2, live_instances, terminate_form  # type: ignore[no-redef]
    from ec2_contracts import Ec2Contracts  # type: ignore[no-redef]
    from ec2_spot import SpotEc2  # type: ignore[no-redef]
    from ec2_types import answer as types_answer  # type: ignore[no-redef]
    from s3_contracts import CONFLICT_BODY, S3Conditional  # type: ignore[no-redef]
    from s3_contracts import action as s3_action

CONTROL = "/__faults__"
# Opt-in regions the account has not enabled (moto 5.2's DescribeRegions marks these `not-opted-in`): a call signed
# for one answers AuthFailure (401), as EC2 does ("AWS was not able to validate the provided access credentials"),
# and DescribeRegions leaves them out unless AllRegions (EC2 API reference, DescribeRegions).
NOT_ENABLED = ("ap-east-1", "ap-east-2", "ap-south-2", "ap-southeast-4", "ap-southeast-5", "ap-southeast-6",
               "ap-southeast-7", "ca-west-1", "eu-central-2", "eu-south-2", "il-central-1", "me-central-1",
               "me-south-1", "mx-central-1")
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "content-length", "proxy-authorization", "proxy-authenticate"}
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/([^/]+)/aws4_request")


# ----------------------------------------------------------------------------------------------- pure helpers
def ec2_error_body(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>fault-proxy</RequestID></Response>").encode()


def s3_error_body(code: str, message: str) -> bytes:
    """S3's REST error document (S3 API reference, "Error responses"): <Error> at the root, not EC2's <Response>."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{escape(code)}</Code><Message>{escape(message)}'
            "</Message><RequestId>fault-proxy</RequestId></Error>").encode()


def json_error_body(code: str, message: str) -> bytes:
    return json.dumps({"__type": code, "message": message}).encode()


def _ts(t: _dt.datetime | None = None) -> str:
    t = t or _dt.datetime.now(_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def spot_price_history_body(rows: list[dict[str, Any]], form: dict[str, str] | None = None) -> bytes:
    """DescribeSpotPriceHistory XML (shape checked against botocore's ec2 model) for rows filtered like AWS does."""
    form = form or {}

    def listed(prefix: str) -> list[str]:
        return [v for k, v in form.items() if re.fullmatch(re.escape(prefix) + r"\.\d+", k)]

    want_types = set(listed("InstanceType"))
    want_products = set(listed("ProductDescription"))
    want_az = {form["AvailabilityZone"]} if form.get("AvailabilityZone") else set()
    filters: dict[str, set[str]] = {}
    for k, v in form.items():
        m = re.fullmatch(r"Filter\.(\d+)\.Name", k)
        if m:
            filters.setdefault(v, set()).update(listed(f"Filter.{m.group(1)}.Value"))
    now = _ts()
    items = []
    for r in rows:
        product = r.get("product", "Linux/UNIX")
        if want_types and r["instance_type"] not in want_types:
            continue
        if want_products and product not in want_products:
            continue
        if want_az and r["az"] not in want_az:
            continue
        if "instance-type" in filters and r["instance_type"] not in filters["instance-type"]:
            continue
        if "availability-zone" in filters and r["az"] not in filters["availability-zone"]:
            continue
        if "product-description" in filters and product not in filters["product-description"]:
            continue
        az_id = f"<availabilityZoneId>{escape(r['az_id'])}</availabilityZoneId>" if r.get("az_id") else ""
        items.append(f"<item><instanceType>{escape(r['instance_type'])}</instanceType>"
                     f"<productDescription>{escape(product)}</productDescription>"
                     f"<spotPrice>{float(r['price']):.6f}</spotPrice><timestamp>{r.get('timestamp', now)}</timestamp>"
                     f"<availabilityZone>{escape(r['az'])}</availabilityZone>{az_id}</item>")
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            "<requestId>fault-proxy</requestId><spotPriceHistorySet>" + "".join(items) +
            "</spotPriceHistorySet><nextToken></nextToken></DescribeSpotPriceHistoryResponse>").encode()


def _matches_value(actual: Any, want: Any) -> bool:
    if want is None:
        return actual is None
    if actual is None:
        return False
    if isinstance(want, list) and not isinstance(actual, list):
        return any(_matches_value(actual, w) for w in want)
    if isinstance(want, (dict, list)):
        return actual == want
    if isinstance(actual, bool) or isinstance(want, bool):
        return str(actual).lower() == str(want).lower()
    return str(actual) == str(want)


# ----------------------------------------------------------------------------------------------- EC2 statuses
# HTTP status EC2 answers with for these error codes when a rule names the code but no status. Source: EC2 API
# reference, "Error codes for the Amazon EC2 API" (server errors, such as the Insufficient*Capacity family and
# InternalError, come with a 5xx status; RequestLimitExceeded and Unavailable with 503). Any other code: 400.
EC2_ERROR_STATUS = {
    "InsufficientInstanceCapacity": 500, "InsufficientCapacity": 500, "InsufficientHostCapacity": 500,
    "InsufficientReservedInstanceCapacity": 500, "InternalError": 500,
    "RequestLimitExceeded": 503, "Unavailable": 503,
    "AuthFailure": 401, "UnauthorizedOperation": 403,
}

# ----------------------------------------------------------------------------------------------- EC2 realism
KINDS = ("realistic", "instant")
REALISM_DEFAULTS: dict[str, Any] = {"kind": "realistic", "fresh_lookups": 2, "tag_lag": 1, "image_pending": 2,
                                    "token_lag": 1}

# Requests that name resources by id: action -> [(form field pattern, resource kind)]
_BY_ID: dict[str, list[tuple[str, str]]] = {
    "DescribeInstances": [(r"InstanceId\.\d+", "instance")],
    "TerminateInstances": [(r"InstanceId\.\d+", "instance")],
    "StopInstances": [(r"InstanceId\.\d+", "instance")],
    "StartInstances": [(r"InstanceId\.\d+", "instance")],
    "ModifyInstanceAttribute": [(r"InstanceId", "instance")],
    "DescribeSecurityGroups": [(r"GroupId\.\d+", "group")],
    "AuthorizeSecurityGroupIngress": [(r"GroupId", "group")],
    "DeleteSecurityGroup": [(r"GroupId", "group")],
    "DescribeKeyPairs": [(r"KeyName\.\d+", "key"), (r"KeyPairId\.\d+", "key")],
    "RunInstances": [(r"SecurityGroupId\.\d+", "group"), (r"NetworkInterface\.\d+\.SecurityGroupId\.\d+", "group"),
                     (r"KeyName", "key")],
    "DescribeVolumes": [(r"VolumeId\.\d+", "volume")],
    "DescribeImages": [(r"ImageId\.\d+", "image")],
    "DeregisterImage": [(r"ImageId", "image")],
}
_BY_ID["RunInstances"].append((r"ImageId", "image"))
_NOT_FOUND = {"instance": "InvalidInstanceID.NotFound", "group": "InvalidGroup.NotFound",
              "key": "InvalidKeyPair.NotFound", "volume": "InvalidVolume.NotFound", "image": "InvalidAMIID.NotFound"}
# Describe calls whose items a tag filter may not show yet: action -> (list element, id elements of an item)
_LISTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "DescribeInstances": ("reservationSet", ("instanceId",)),  # items nested: reservation -> instancesSet
    "DescribeSecurityGroups": ("securityGroupInfo", ("groupId",)),
    "DescribeKeyPairs": ("keySet", ("keyPairId", "keyName")),
    "DescribeVolumes": ("volumeSet", ("volumeId",)),
    "DescribeSpotInstanceRequests": ("spotInstanceRequestSet", ("spotInstanceRequestId",)),
}


def regions_answer(body: bytes, not_enabled: set[str], all_regions: bool) -> bytes:
    """moto's DescribeRegions (every region, AllRegions ignored) as EC2 answers it: regions not enabled only with
    AllRegions, then with optInStatus not-opted-in."""
    text = body.decode()

    def item(m: re.Match[str]) -> str:
        block = m.group(0)
        name = re.search(r"<regionName>([^<]+)</regionName>", block)
        if name is None or name.group(1) not in not_enabled:
            return block
        if not all_regions:
            return ""
        return re.sub(r"<optInStatus>[^<]*</optInStatus>", "<optInStatus>not-opted-in</optInStatus>", block)

    return re.sub(r"<item>.*?</item>", item, text, flags=re.S).encode()


def not_found_message(kind: str, ids: list[str], field: str = "") -> str:
    """EC2's NotFound wording. Instances: every id the request named that is missing (EC2 lists them all);
    groups, key pairs, volumes: the first one."""
    if kind == "instance":
        if len(ids) == 1:
            return f"The instance ID '{ids[0]}' does not exist"
        return f"The instance IDs '{', '.join(ids)}' do not exist"
    if kind == "group":
        return f"The security group '{ids[0]}' does not exist"
    if kind == "image":
        return f"The image id '[{ids[0]}]' does not exist"
    if kind == "key":
        return f"The key pair ID '{ids[0]}' does not exist" if field.startswith("KeyPairId") else \
            f"The key pair '{ids[0]}' does not exist"
    return f"The volume '{ids[0]}' does not exist."


def _xml(body: bytes) -> tuple[ET.Element, str] | None:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    return root, (root.tag[1:].split("}")[0] if root.tag.startswith("{") else "")


class Ec2Realism:
    """What moto does not do and EC2 does: eventual consistency ("realistic" kind, the default).

    The EC2 developer guide ("Eventual consistency in the Amazon EC2 API") warns that right after a create
    call a NotFound "does not mean the resource does not exist", and that a filtered Describe may not show it
    yet. moto answers every call from one consistent dict, so a tool that only ever met moto never learns to
    wait and retry. In "realistic" kind, for resources created *through this proxy*:

      * the first ``fresh_lookups`` requests naming the new id (by id) answer EC2's NotFound (HTTP 400)
        instead of being forwarded; each such answer counts one look-up for every fresh id it named;
      * the first ``tag_lag`` tag-filtered Describe answers that would show the resource leave it out.

    Budgets are fixed when the create reply passes through. "instant" kind = moto as is (no learning either).
    All methods run under the proxy state's lock.
    """

    def __init__(self) -> None:
        self.settings: dict[str, Any] = dict(REALISM_DEFAULTS)
        # (region, id or key name) -> {"kind", "ids", "fresh", "lag"}; a key pair's name and id share one record
        self.known: dict[tuple[str | None, str], dict[str, Any]] = {}

    def reset(self) -> None:
        self.settings = dict(REALISM_DEFAULTS)
        self.known.clear()

    def configure(self, update: dict[str, Any]) -> dict[str, Any]:
        """Change some settings (unknown fields / bad values: ValueError); returns all of them."""
        unknown = set(update) - set(REALISM_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown realism settings {sorted(unknown)}")
        new = dict(self.settings, **update)
        if new["kind"] not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {new['kind']!r}")
        for k in ("fresh_lookups", "tag_lag", "image_pending", "token_lag"):
            if isinstance(new[k], bool) or not isinstance(new[k], int) or new[k] < 0:
                raise ValueError(f"{k} must be an integer >= 0, not {new[k]!r}")
        self.settings = new
        return dict(new)

    def state(self) -> dict[str, Any]:
        out = dict(self.settings)
        out["known"] = [{"region": region, "id": rid, **{k: rec[k] for k in ("kind", "fresh", "lag")}}
                        for (region, rid), rec in self.known.items()]
        return out

    def _applies(self, req: dict[str, Any]) -> bool:
        return (self.settings["kind"] == "realistic" and req["json"] is None and req["target"] is None
                and req["service"] in (None, "ec2"))

    # -- before forwarding
    def refuse(self, req: dict[str, Any]) -> tuple[str, str, list[str]] | None:
        """(code, message, fresh ids named) when the request names a still-fresh id; counts the look-up."""
        if not self._applies(req) or req["action"] not in _BY_ID:
            return None
        form, region = req["form"], req["region"]
        named: list[tuple[str, str, dict[str, Any]]] = []  # (field, value, record)
        for pattern, kind in _BY_ID[req["action"]]:
            for field in sorted((k for k in form if re.fullmatch(pattern, k)), key=_field_order):
                rec = self.known.get((region, form[field]))
                if rec is not None and rec["kind"] == kind and rec["fresh"] > 0:
                    named.append((field, form[field], rec))
        if not named:
            return None
        field, _, first = named[0]
        ids = [v for _, v, rec in named if rec["kind"] == first["kind"]]
        for rec in {id(rec): rec for _, _, rec in named}.values():
            rec["fresh"] -= 1
        return _NOT_FOUND[first["kind"]], not_found_message(first["kind"], ids, field), [v for _, v, _ in named]

    # -- after forwarding
    def observe(self, req: dict[str, Any], status: int, body: bytes) -> tuple[bytes, list[str]]:
        """Learn ids from a create reply; drop lagging items from a tag-filtered Describe. -> (body, hidden ids)"""
        if not self._applies(req) or status != 200:
            return body, []
        action = req["action"]
        if action == "DescribeImages":
            return self._pending(req["region"], body), []
        if action in ("RunInstances", "CreateSecurityGroup", "ImportKeyPair", "CreateKeyPair", "CreateVolume",
                      "RequestSpotInstances", "CreateImage", "CopyImage"):
            parsed = _xml(body)
            if parsed is not None:
                self._learn(req["region"], action, *parsed)
            return body, []
        if action in _LISTED and _tag_filtered(req["form"]):
            return self._hide(req["region"], action, body)
        return body, []

    def _remember(self, region: str | None, kind: str, ids: list[str], fresh: bool = True) -> None:
        ids = [i for i in ids if i]
        if ids:
            rec = {"kind": kind, "ids": ids, "fresh": self.settings["fresh_lookups"] if fresh else 0,
                   "lag": self.settings["tag_lag"]}
            for i in ids:
                self.known[(region, i)] = rec

    def _learn(self, region: str | None, action: str, root: ET.Element, ns: str) -> None:
        q = (lambda tag: f"{{{ns}}}{tag}") if ns else (lambda tag: tag)

        def text(el: ET.Element, tag: str) -> str:
            return (el.findtext(q(tag)) or "").strip()

        if action == "RunInstances":
            for item in root.findall(f"{q('instancesSet')}/{q('item')}"):
                self._remember(region, "instance", [text(item, "instanceId")])
                self._remember(region, "spot", [text(item, "spotInstanceRequestId")], fresh=False)
        elif action == "RequestSpotInstances":
            for item in root.findall(f"{q('spotInstanceRequestSet')}/{q('item')}"):
                self._remember(region, "spot", [text(item, "spotInstanceRequestId")], fresh=False)
        elif action == "CreateSecurityGroup":
            self._remember(region, "group", [text(root, "groupId")])
        elif action == "CreateVolume":
            self._remember(region, "volume", [text(root, "volumeId")])
        elif action in ("CreateImage", "CopyImage"):  # a copy is `pending` until its snapshots are copied
            self._remember(region, "image", [text(root, "imageId")])
            self.known[(region, text(root, "imageId"))]["pending"] = self.settings["image_pending"]
        else:
            self._remember(region, "key", [text(root, "keyName"), text(root, "keyPairId")])

    def _pending(self, region: str | None, body: bytes) -> bytes:
        """A new image is `pending` for its first ``image_pending`` DescribeImages answers (EC2: CreateImage returns
        at once; the image turns `available` when its snapshots are complete), whatever moto says."""
        parsed = _xml(body)
        if parsed is None:
            return body
        root, ns = parsed
        q = (lambda tag: f"{{{ns}}}{tag}") if ns else (lambda tag: tag)
        changed = False
        for item in root.iter(q("item")):
            rec = self.known.get((region, (item.findtext(q("imageId")) or "").strip()))
            state = item.find(q("imageState"))
            if rec is not None and rec.get("pending", 0) > 0 and state is not None and state.text == "available":
                rec["pending"] -= 1
                state.text = "pending"
                changed = True
        if not changed:
            return body
        if ns:
            ET.register_namespace("", ns)
        return ET.tostring(root, encoding="utf-8", xml_declaration=True)

    def _hide(self, region: str | None, action: str, body: bytes) -> tuple[bytes, list[str]]:
        parsed = _xml(body)
        if parsed is None:
            return body, []
        root, ns = parsed
        q = (lambda tag: f"{{{ns}}}{tag}") if ns else (lambda tag: tag)
        listing, id_tags = _LISTED[action]
        hidden: list[str] = []

        def lagging(item: ET.Element) -> str | None:
            for tag in id_tags:
                rid = (item.findtext(q(tag)) or "").strip()
                rec = self.known.get((region, rid)) if rid else None
                if rec is not None and rec["lag"] > 0:
                    rec["lag"] -= 1
                    return str(rec["ids"][0])  # a key pair by its name
            return None

        for container in root.findall(q(listing)):
            for item in list(container):
                if action == "DescribeInstances":  # reservation items hold the instance items
                    for inner in item.findall(q("instancesSet")):
                        for inst in list(inner):
                            rid = lagging(inst)
                            if rid:
                                inner.remove(inst)
                                hidden.append(rid)
                                if len(inner) == 0:
                                    container.remove(item)
                else:
                    rid = lagging(item)
                    if rid:
                        container.remove(item)
                        hidden.append(rid)
        if not hidden:
            return body, []
        if ns:
            ET.register_namespace("", ns)  # keep the default namespace (no ns0: prefixes) for botocore
        return ET.tostring(root, encoding="utf-8", xml_declaration=True), hidden


class ClientTokens:
    """RunInstances's ClientToken as EC2 honours it and moto does not (EC2 API reference, "Ensure
    idempotency"): a request repeating a token gets the first launch's answer and launches nothing more,
    and DescribeInstances filters by `client-token`. In both kinds: this is EC2's contract, not timing.
    The filter is rewritten into an `instance-id` filter on the ids the token launched (moto knows that one)."""

    NONE = "i-00000000000000000"  # an id no instance has: the filter then matches nothing
    # CopyImage's ClientToken too ("Unique, case-sensitive identifier you provide to ensure idempotency of the
    # request", EC2 API reference, CopyImage); moto ignores it and would copy again
    ACTIONS = ("RunInstances", "CopyImage")

    def __init__(self) -> None:
        self.answers: dict[tuple[str | None, str], bytes] = {}
        self.ids: dict[tuple[str | None, str], list[str]] = {}
        self.lag: dict[tuple[str | None, str], int] = {}  # realistic kind: client-token look-ups still to miss

    def reset(self) -> None:
        self.answers.clear()
        self.ids.clear()
        self.lag.clear()

    def replay(self, req: dict[str, Any]) -> bytes | None:
        token = req["form"].get("ClientToken") if req["action"] in self.ACTIONS else None
        return self.answers.get((req["region"], token)) if token else None

    def observe(self, req: dict[str, Any], status: int, body: bytes, lag: int = 0) -> None:
        """Remember a launch's answer; its ids lag `lag` client-token look-ups behind (the filter is eventually
        consistent like every filtered Describe: realistic kind's ``token_lag``)."""
        token = req["form"].get("ClientToken") if req["action"] in self.ACTIONS else None
        parsed = _xml(body) if token and status == 200 else None
        if parsed is None:
            return
        root, ns = parsed
        q = (lambda tag: f"{{{ns}}}{tag}") if ns else (lambda tag: tag)
        if (req["region"], token) not in self.answers:
            self.lag[(req["region"], token)] = lag
        self.answers[(req["region"], token)] = body
        self.ids[(req["region"], token)] = [(i.findtext(q("instanceId")) or "").strip()
                                           for i in root.findall(f"{q('instancesSet')}/{q('item')}")]

    def rewrite(self, req: dict[str, Any], body: bytes) -> bytes:
        """The request body with each client-token filter turned into an instance-id filter."""
        form = req["form"]
        if req["action"] != "DescribeInstances" or "client-token" not in form.values():
            return body
        out = dict(form)
        for k, v in form.items():
            m = re.fullmatch(r"Filter\.(\d+)\.Name", k)
            if not (m and v == "client-token"):
                continue
            prefix = f"Filter.{m.group(1)}.Value."
            tokens = [form[f] for f in form if f.startswith(prefix)]
            for f in [f for f in out if f.startswith(prefix)]:
                del out[f]
            ids = []
            for t in tokens:
                if self.lag.get((req["region"], t), 0) > 0:  # not in the filter's answer yet
                    self.lag[(req["region"], t)] -= 1
                    continue
                ids += self.ids.get((req["region"], t), [])
            ids = ids or [self.NONE]
            out[k] = "instance-id"
            out.update({f"{prefix}{j}": i for j, i in enumerate(ids, 1)})
        return urllib.parse.urlencode(out).encode()


class CreateImageTags:
    """CreateImage's TagSpecification.N with ResourceType snapshot: EC2 tags the image's new snapshots with it
    (API reference, CreateImage: "you can tag the AMI, the snapshots, or both"); moto raises NotImplementedError.
    The proxy sends moto the request without it and tags the snapshots itself (in both kinds: EC2's contract)."""

    @staticmethod
    def split(req: dict[str, Any], body: bytes) -> tuple[bytes, list[tuple[str, str]]]:
        form = req["form"]
        if req["action"] not in ("CreateImage", "CopyImage"):
            return body, []
        if req["action"] == "CopyImage":  # moto's CopyImage reads no TagSpecification: the proxy tags both
            return body, []
        specs = {m.group(1) for k in form if (m := re.fullmatch(r"TagSpecification\.(\d+)\.ResourceType", k))
                 and form[k] == "snapshot"}
        if not specs:
            return body, []
        tags: list[tuple[str, str]] = []
        out = {}
        for k, v in form.items():
            m = re.fullmatch(r"TagSpecification\.(\d+)\.(.*)", k)
            if m and m.group(1) in specs:
                t = re.fullmatch(r"Tag\.(\d+)\.Key", m.group(2))
                if t:
                    tags.append((v, form.get(f"TagSpecification.{m.group(1)}.Tag.{t.group(1)}.Value", "")))
                continue
            out[k] = v
        # the specifications left are numbered again from 1 (moto reads TagSpecification.1, .2, ... until a gap)
        kept = sorted({int(m.group(1)) for k in out if (m := re.fullmatch(r"TagSpecification\.(\d+)\..*", k))})
        renumber = {str(old): str(new) for new, old in enumerate(kept, 1)}
        out = {re.sub(r"^TagSpecification\.(\d+)\.", lambda m: f"TagSpecification.{renumber[m.group(1)]}.", k): v
               for k, v in out.items()}
        return urllib.parse.urlencode(out).encode(), tags


def _field_order(field: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in field.split(".")]


def _tag_filtered(form: dict[str, str]) -> bool:
    return any(re.fullmatch(r"Filter\.\d+\.Name", k) and (v.startswith("tag:") or v == "tag-key")
               for k, v in form.items())


# ----------------------------------------------------------------------------------------------- state
class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.rules: list[dict[str, Any]] = []
        self.log: list[dict[str, Any]] = []
        self.next_id = 1
        self.seq = 0
        self.release_gen = 0
        self.holding = 0
        self.realism = Ec2Realism()
        self.tokens = ClientTokens()
        self.cluster = ClusterEc2()  # placement groups, MinCount/MaxCount, network cards (tests/aws/ec2_cluster.py)
        self.spot = SpotEc2()  # RunInstances's spot requests, relaunch, disabled, interruptions (tests/aws/ec2_spot.py)
        self.not_enabled: set[str] = set(NOT_ENABLED)
        self.contracts = Ec2Contracts()  # Elastic IPs, root volumes, IPv6, instance profiles, pages (ec2_contracts.py)
        self.s3 = S3Conditional()  # conditional writes that race: S3's 409 (s3_contracts.py)
        self.capacity = CapacityEc2()  # Capacity Reservations and Capacity Blocks (ec2_capacity.py)

    def add(self, rules: list[dict[str, Any]]) -> list[int]:
        ids = []
        with self.lock:
            for r in rules:
                r = dict(r, hits=0, held=0, id=self.next_id)
                self.next_id += 1
                ids.append(r["id"])
                for i, old in enumerate(self.rules):
                    if r.get("name") is not None and old.get("name") == r["name"]:
                        self.rules[i] = r
                        break
                else:
                    self.rules.append(r)
        return ids

    def pick(self, req: dict[str, Any], pause: bool = False) -> dict[str, Any] | None:
        """First matching rule (hit counted), under the lock: a `pause` one (before anything sees the request), or
        any other."""
        for r in self.rules:
            if bool(r.get("pause")) != pause:
                continue
            if r.get("action") is not None and r["action"] != req["action"]:
                continue
            if r.get("target") is not None and r["target"] != req["target"]:
                continue
            if r.get("service") is not None and r["service"] != req["service"]:
                continue
            if r.get("region") is not None and r["region"] != req["region"]:
                continue
            fields = req["json"] if isinstance(req["json"], dict) else req["form"]
            if not all(_matches_value(fields.get(k), v) for k, v in (r.get("match") or {}).items()):
                continue
            if r.get("times") is not None and r["hits"] >= int(r["times"]):
                continue
            r["hits"] += 1
            return r
        return None


STATE = _State()


# ----------------------------------------------------------------------------------------------- handler
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # without it every reply stalls ~40 ms (delayed ACK)
    upstream: urllib.parse.SplitResult  # set by make_server
    state: _State = STATE
    server_version = "fault-proxy"

    def log_message(self, *a: Any) -> None:  # quiet
        pass

    # -- plumbing
    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, body: bytes, headers: list[tuple[str, str]] | dict[str, str]) -> None:
        self.send_response(status)
        items = headers.items() if isinstance(headers, dict) else headers
        for k, v in items:
            if k.lower() not in HOP_HEADERS and k.lower() not in ("server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, default=str).encode(), {"Content-Type": "application/json"})

    # -- control API
    def _control(self, body: bytes) -> None:
        st = self.state
        path = self.path.split("?")[0].rstrip("/")
        if path == CONTROL and self.command == "GET":
            with st.lock:
                return self._json(200, {"rules": st.rules, "log": st.log, "holding": st.holding,
                                        "realism": st.realism.state()})
        if path == CONTROL and self.command == "POST":
            try:
                rules = json.loads(body or b"[]")
            except ValueError as e:
                return self._json(400, {"error": f"bad JSON: {e}"})
            if isinstance(rules, dict):
                rules = [rules]
            return self._json(200, {"ids": st.add(rules)})
        if path == CONTROL and self.command == "DELETE":
            with st.cond:
                st.rules.clear()
                st.log.clear()
                st.realism.reset()
                st.not_enabled = set(NOT_ENABLED)
                st.contracts.reset()
                st.release_gen += 1
                st.cond.notify_all()
            return self._json(200, {"ok": True})
        if path == CONTROL + "/release" and self.command == "POST":
            with st.cond:
                n = st.holding
                st.release_gen += 1
                st.cond.notify_all()
            return self._json(200, {"released": n})
        if path == CONTROL + "/kind" and self.command == "GET":
            with st.lock:
                return self._json(200, dict(st.realism.settings))
        if path == CONTROL + "/kind" and self.command == "POST":
            try:
                update = json.loads(body or b"{}")
                if not isinstance(update, dict):
                    raise ValueError("expected a JSON object")
                with st.lock:
                    return self._json(200, st.realism.configure(update))
            except ValueError as e:
                return self._json(400, {"error": str(e)})
        if path == CONTROL + "/tokens" and self.command == "DELETE":  # EC2's own state: goes with moto's reset only
            with st.lock:
                st.tokens.reset()
                st.cluster.reset()
                st.spot.reset()
                st.capacity.reset()
            st.contracts.forget()
            return self._json(200, {"ok": True})
        if path == CONTROL + "/spot/interrupt" and self.command == "POST":
            try:
                ask = json.loads(body or b"{}")
                how = st.spot.interrupt(ask.get("region"), ask["instance_id"], (self.upstream, dict(self.headers.items())
                                                                                 | self._signing(ask.get("region"))),
                                        st.lock)
            except (ValueError, KeyError) as e:
                return self._json(400, {"error": str(e)})
            return self._json(200, {"instance": ask["instance_id"], "did": how})
        if path == CONTROL + "/placement-groups" and self.command == "GET":
            with st.lock:
                return self._json(200, [{"region": r, "name": n, "id": g["id"], "strategy": g["strategy"],
                                         "tags": g["tags"], "instances": g["instances"]}
                                        for (r, n), g in st.cluster.groups.items()])
        if path == CONTROL + "/regions" and self.command == "POST":  # {"not_enabled": [...]}
            ask = json.loads(body or b"{}")
            with st.lock:
                st.not_enabled = set(ask.get("not_enabled", NOT_ENABLED))
                return self._json(200, {"not_enabled": sorted(st.not_enabled)})
        if path == CONTROL + "/spot-requests" and self.command == "GET":
            with st.lock:
                return self._json(200, [{"region": reg, "id": sid, "state": r["state"], "type": r["type"],
                                         "instance": r["instance"], "tags": r["tags"]}
                                        for (reg, sid), r in st.spot.requests.items()])
        if path == CONTROL + "/contracts" and self.command == "GET":
            return self._json(200, st.contracts.state())
        if path == CONTROL + "/contracts" and self.command == "POST":
            try:
                update = json.loads(body or b"{}")
                if not isinstance(update, dict):
                    raise ValueError("expected a JSON object")
                return self._json(200, st.contracts.configure(update))
            except ValueError as e:
                return self._json(400, {"error": str(e)})
        if path == CONTROL + "/capacity":  # GET: reservations, offerings, the clock; POST: add them, advance it
            try:
                ask = json.loads(body or b"{}") if self.command == "POST" else {}
                with st.lock:
                    return self._json(200, st.capacity.configure(ask))
            except (ValueError, KeyError, TypeError) as e:
                return self._json(400, {"error": str(e)})
        if path == CONTROL + "/log" and self.command == "DELETE":
            with st.lock:
                st.log.clear()
            return self._json(200, {"ok": True})
        return self._json(404, {"error": f"unknown control call {self.command} {self.path}"})

    # -- proxying
    def _describe(self, body: bytes) -> dict[str, Any]:
        target = self.headers.get("X-Amz-Target")
        ctype = (self.headers.get("Content-Type") or "").lower()
        m = _SCOPE.search(self.headers.get("Authorization") or "")
        req: dict[str, Any] = {"method": self.command, "path": self.path, "service": m.group(2) if m else None,
                               "region": m.group(1) if m else None, "action": None, "target": target,
                               "form": {}, "json": None}
        if target:
            req["action"] = target.rsplit(".", 1)[-1]
            try:
                req["json"] = json.loads(body or b"{}")
            except ValueError:
                req["json"] = None
        else:
            form: dict[str, str] = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            if body and ("x-www-form-urlencoded" in ctype or not ctype) and req["service"] != "s3":  # S3: an object
                form.update(urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
            req["form"] = form
            req["action"] = s3_action(self.command, self.path, form) if req["service"] == "s3" else form.get("Action")
        return req

    def _forward(self, body: bytes) -> tuple[int, bytes, list[tuple[str, str]]]:
        up = self.upstream
        c = http.client.HTTPConnection(up.hostname, up.port, timeout=300)
        try:
            hdrs = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            c.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT") else None,
                      headers=hdrs)
            resp = c.getresponse()
            return resp.status, resp.read(), resp.getheaders()
        finally:
            c.close()

    def _image_named(self, name: str) -> str | None:
        """EC2 refuses a second image of the same name in an account and region (InvalidAMIName.Duplicate); moto
        does not: the proxy asks moto whether the account has one."""
        form = {"Action": "DescribeImages", "Version": "2016-11-15", "Owner.1": "self", "Filter.1.Name": "name",
                "Filter.1.Value.1": name}
        status, body, _ = self._forward(urllib.parse.urlencode(form).encode())
        parsed = _xml(body) if status == 200 else None
        if parsed is None:
            return None
        root, ns = parsed
        ids = [e.text for e in root.iter(f"{{{ns}}}imageId" if ns else "imageId") if e.text]
        return ids[0] if ids else None

    def _tag_copy(self, form: dict[str, str], reply: bytes) -> None:
        """What CopyImage's TagSpecification.N does in EC2 ("The tags to apply to the new AMI and new snapshots",
        API reference, CopyImage): moto's CopyImage reads none, so the proxy tags the copy and its snapshots."""
        by_type: dict[str, list[tuple[str, str]]] = {}
        for k, v in form.items():
            m = re.fullmatch(r"TagSpecification\.(\d+)\.Tag\.(\d+)\.Key", k)
            if m:
                kind = form.get(f"TagSpecification.{m.group(1)}.ResourceType", "")
                by_type.setdefault(kind, []).append((v, form.get(k.removesuffix("Key") + "Value", "")))
        parsed = _xml(reply)
        image_id = "" if parsed is None else (parsed[0].findtext(f"{{{parsed[1]}}}imageId" if parsed[1] else "imageId")
                                              or "").strip()
        if image_id and by_type.get("image"):
            tags = {"Action": "CreateTags", "Version": "2016-11-15", "ResourceId.1": image_id}
            for i, (k, v) in enumerate(by_type["image"], 1):
                tags[f"Tag.{i}.Key"], tags[f"Tag.{i}.Value"] = k, v
            self._forward(urllib.parse.urlencode(tags).encode())
        if by_type.get("snapshot"):
            self._tag_image_snapshots(reply, by_type["snapshot"])

    def _tag_image_snapshots(self, reply: bytes, tags: list[tuple[str, str]]) -> None:
        """What CreateImage's TagSpecification of ResourceType snapshot does in EC2 (moto raises NotImplemented)."""
        parsed = _xml(reply)
        if parsed is None:
            return
        root, ns = parsed
        image_id = (root.findtext(f"{{{ns}}}imageId" if ns else "imageId") or "").strip()
        status, body, _ = self._forward(urllib.parse.urlencode(
            {"Action": "DescribeImages", "Version": "2016-11-15", "ImageId.1": image_id}).encode())
        described = _xml(body) if status == 200 else None
        if described is None:
            return
        droot, dns = described
        snaps = [e.text for e in droot.iter(f"{{{dns}}}snapshotId" if dns else "snapshotId") if e.text]
        form = {"Action": "CreateTags", "Version": "2016-11-15"}
        for i, snap in enumerate(snaps, 1):
            form[f"ResourceId.{i}"] = snap
        for i, (k, v) in enumerate(tags, 1):
            form[f"Tag.{i}.Key"], form[f"Tag.{i}.Value"] = k, v
        if snaps:
            self._forward(urllib.parse.urlencode(form).encode())

    def _client_gone(self) -> bool:
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _handle(self) -> None:
        body = self._read_body()
        if self.path.split("?")[0].rstrip("/").startswith(CONTROL):
            return self._control(body)
        req = self._describe(body)
        self._pause(req)
        # S3: one conditional write per object from arrival to answer (a rule's delay included), another meanwhile
        # is S3's 409 (s3_contracts.py)
        written = S3Conditional.conditional(req, self.headers)
        if written is not None and not self.state.s3.begin(written):
            with self.state.lock:
                self.state.seq += 1
                self.state.log.append({"seq": self.state.seq, **req, "status": 409, "rule": None, "held": False,
                                       "outcome": "s3-conflict", "fresh": [], "hidden": []})
            return self._reply(409, CONFLICT_BODY, [("Content-Type", "application/xml")], {})
        self._written = written
        try:
            return self._proxy(body, req)
        finally:
            self._end_write()

    def _pause(self, req: dict[str, Any]) -> None:
        """A `pause` rule: the request waits here, seen by nothing yet, until the next release."""
        st = self.state
        with st.cond:
            if st.pick(req, pause=True) is None:
                return
            st.holding += 1
            gen = st.release_gen
            try:
                while st.release_gen == gen:
                    st.cond.wait(0.05)
            finally:
                st.holding -= 1

    def _end_write(self) -> None:
        """S3 has written (or refused) the object: a conditional write arriving now meets it as it is (a held
        answer's object is there already: the next writer's condition fails 412, as on S3)."""
        written, self._written = getattr(self, "_written", None), None
        if written is not None:
            self.state.s3.end(written)

    def _proxy(self, body: bytes, req: dict[str, Any]) -> None:
        st = self.state
        with st.lock:
            st.seq += 1
            entry = {"seq": st.seq, **req, "status": None, "rule": None, "held": False, "outcome": None,
                     "fresh": [], "hidden": []}
            st.log.append(entry)
            rule = st.pick(req)
            if rule is not None:
                entry["rule"] = rule.get("name") or rule["id"]
                rule = dict(rule)  # snapshot
        if rule and rule.get("delay"):
            time.sleep(float(rule["delay"]))
        is_json = req["target"] is not None
        with st.lock:
            off = req["region"] in st.not_enabled
        if off:  # an opt-in region the account has not enabled: every service there refuses the credentials
            with st.lock:
                entry.update(status=401, outcome="region-not-enabled")
            message = "AWS was not able to validate the provided access credentials"
            if is_json:
                return self._reply(400, json_error_body("UnrecognizedClientException", message),
                                   [("Content-Type", "application/x-amz-json-1.1"),
                                    ("x-amzn-ErrorType", "UnrecognizedClientException")], entry)
            return self._reply(401, ec2_error_body("AuthFailure", message), [("Content-Type", "text/xml;charset=UTF-8")],
                               entry)
        canned = bool(rule and (rule.get("code") or rule.get("body") is not None or rule.get("spot_prices") is not None))
        refused = None
        if not canned:  # a request that would reach moto: EC2 may not know a fresh id yet
            with st.lock:
                refused = st.realism.refuse(req)
                if refused is not None:
                    entry.update(rule="fresh", status=400, outcome="fresh-notfound", fresh=refused[2])
                    for r in st.rules:  # a hold/delay rule waits for a request that reaches the cloud
                        if rule is not None and r["id"] == rule["id"]:
                            r["hits"] -= 1
        if refused is not None:
            return self._reply(400, ec2_error_body(refused[0], refused[1]), [("Content-Type", "text/xml;charset=UTF-8")],
                               entry)
        if rule and rule.get("code"):
            status = int(rule.get("status") or (400 if is_json else EC2_ERROR_STATUS.get(rule["code"], 400)))
            msg = rule.get("message") or rule["code"]
            if is_json:
                out = (status, json_error_body(rule["code"], msg),
                       [("Content-Type", "application/x-amz-json-1.1"), ("x-amzn-ErrorType", rule["code"]),
                        ("x-amzn-RequestId", "fault-proxy")])
            elif req["service"] == "s3":
                out = (status, s3_error_body(rule["code"], msg), [("Content-Type", "application/xml")])
            else:
                out = (status, ec2_error_body(rule["code"], msg), [("Content-Type", "text/xml;charset=UTF-8")])
        elif rule and rule.get("spot_prices") is not None:
            rows = spot_price_history_body(rule["spot_prices"], req["form"])
            out = (*st.contracts.page(req, int(rule.get("status", 200)), rows), [("Content-Type", "text/xml;charset=UTF-8")])
        elif rule and rule.get("body") is not None:
            b = rule["body"]
            b = b.encode() if isinstance(b, str) else json.dumps(b).encode()
            ctype = rule.get("content_type") or ("application/x-amz-json-1.1" if is_json else "text/xml;charset=UTF-8")
            out = (int(rule.get("status", 200)), b, [("Content-Type", ctype), ("x-amzn-RequestId", "fault-proxy")])
        elif (replayed := self.state.tokens.replay(req)) is not None:
            out = (200, replayed, [("Content-Type", "text/xml;charset=UTF-8")])
        elif req["action"] == "CreateImage" and (taken := self._image_named(req["form"].get("Name", ""))):
            out = (400, ec2_error_body("InvalidAMIName.Duplicate",
                                       f"AMI name {req['form'].get('Name')} is already in use by AMI {taken}"),
                   [("Content-Type", "text/xml;charset=UTF-8")])
        elif (capacity := self._capacity(req)) is not None:
            out = capacity
        elif (contract := self._contract(req)) is not None:
            out = contract
        elif (answered := self._cluster(req, rule)) is not None or (answered := self._spot(req)) is not None:
            out = answered
            fresh = req.get("fresh_refused")
            if fresh is not None:  # a placement group EC2 does not know yet: realism's answer, as for any fresh id
                with st.lock:
                    entry.update(rule="fresh", status=400, outcome="fresh-notfound", fresh=[fresh])
                    for r in st.rules:  # a hold/delay rule waits for a request that reaches the cloud
                        if rule is not None and r["id"] == rule["id"]:
                            r["hits"] -= 1
                return self._reply(*out, entry)
        else:
            st.contracts.shape(req, lambda form: self._forward(urllib.parse.urlencode(form).encode()))
            if req.get("forward_form") is not None:  # Run/TerminateInstances as moto understands them (ec2_cluster.py)
                body = urllib.parse.urlencode(req["forward_form"]).encode()
            try:
                body, snapshot_tags = CreateImageTags.split(req, body)
                out = self._forward(self.state.tokens.rewrite(req, body))
                self._end_write()
                if snapshot_tags and out[0] == 200:
                    self._tag_image_snapshots(out[1], snapshot_tags)
                if req["action"] == "CopyImage" and out[0] == 200:
                    self._tag_copy(req["form"], out[1])
            except OSError as e:
                with st.lock:
                    entry["status"] = 502
                    entry["outcome"] = f"upstream-error: {e}"
                return self._send(502, str(e).encode(), {"Content-Type": "text/plain"})
            upstream = (self.upstream, dict(self.headers.items()))
            st.spot.after(req, out[0], upstream, st.lock)  # a persistent request relaunches (calls moto: no lock)
            with st.lock:
                body_out = out[1]
                if req["action"] == "RunInstances" and out[0] == 200:
                    body_out = st.spot.launched(req, body_out)
                elif req["action"] == "DescribeInstances" and out[0] == 200:
                    body_out = st.spot.rewrite(req["region"], body_out)
                elif req["action"] == "DescribeSpotInstanceRequests" and out[0] == 200:
                    body_out = st.spot.merge(req, body_out)
                elif req["action"] == "DescribeRegions" and out[0] == 200:
                    body_out = regions_answer(body_out, st.not_enabled, req["form"].get("AllRegions") == "true")
                elif req["action"] in ("DescribeInstanceTypes", "DescribeInstanceTypeOfferings") and out[0] == 200:
                    body_out = types_answer(req["action"], req["region"], req["form"], body_out)  # ec2_types.py
                realistic = st.realism.settings["kind"] == "realistic"
                st.tokens.observe(req, out[0], body_out, st.realism.settings["token_lag"] if realistic else 0)
                if req["action"] == "RunInstances" and out[0] == 200:
                    st.cluster.launched(req, body_out)
                    st.capacity.launched(req, body_out)
                elif req["action"] == "TerminateInstances" and out[0] == 200:
                    st.capacity.terminated(req["form"])
                status_out, body_out = st.contracts.after(req, out[0], body_out, st.realism.settings)
                out = (status_out, body_out, out[2])
                answer, hidden = st.realism.observe(req, out[0], body_out)
                entry["hidden"] = hidden
            if rule and rule.get("spot_dies") and req["action"] == "RunInstances" and out[0] == 200:
                st.spot.dies(req["region"], answer, str(rule["spot_dies"]), upstream, st.lock)
            out = (out[0], answer, out[2])
        if rule and rule.get("lose") and not canned:  # the work is done (a replayed token's too); the answer is lost
            with st.lock:
                entry["status"] = out[0]
                entry["outcome"] = f"lost-{rule['lose']}"
            if rule["lose"] == "drop":
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return None
            if req["service"] == "s3":  # S3's own error document (S3 API reference, "Error responses")
                return self._reply(500, s3_error_body("InternalError", "We encountered an internal error. Please "
                                                      "try again."), [("Content-Type", "application/xml")], entry)
            return self._reply(500, ec2_error_body("InternalError", "An internal error has occurred"),
                               [("Content-Type", "text/xml;charset=UTF-8")], entry)
        if rule and rule.get("hold"):
            with st.cond:
                entry["status"] = out[0]
                entry["held"] = True
                entry["outcome"] = "held"
                for r in st.rules:
                    if r["id"] == rule["id"]:
                        r["held"] += 1
                st.holding += 1
                gen = st.release_gen
                try:
                    while st.release_gen == gen:
                        st.cond.wait(0.05)
                        if st.release_gen == gen and self._client_gone():
                            entry["outcome"] = "client-gone"
                            self.close_connection = True
                            return
                finally:
                    st.holding -= 1
                entry["outcome"] = "released"
        else:
            with st.lock:
                entry["status"] = out[0]
                entry["outcome"] = "fault" if canned else "forwarded"
        self._reply(*out, entry)

    def _capacity(self, req: dict[str, Any]) -> tuple[int, bytes, list[tuple[str, str]]] | None:
        """Capacity Reservations and Blocks (ec2_capacity.py): an answer, or None to go on (a RunInstances into a
        reservation goes on with the form moto reads: a new dict, so the log keeps what the client sent)."""
        if req["target"] is not None or req["service"] not in (None, "ec2"):
            return None
        xml = [("Content-Type", "text/xml;charset=UTF-8")]
        with self.state.lock:
            if req["action"] == "RunInstances":
                result = self.state.capacity.run_instances(req)
                if isinstance(result, dict):
                    req["form"] = result
                    return None
            else:
                result = self.state.capacity.answer(req)
        if result is None:
            return None
        if len(result) == 2:
            return result[0], result[1], xml  # type: ignore[misc]
        status, code, message = result  # type: ignore[misc]
        return status, ec2_error_body(code, message), xml

    def _contract(self, req: dict[str, Any]) -> tuple[int, bytes, list[tuple[str, str]]] | None:
        """EC2's refusal of a request moto would take (ec2_contracts.py), or None to go on."""
        with self.state.lock:
            rules, realistic = [dict(r) for r in self.state.rules], self.state.realism.settings["kind"] == "realistic"
        refusal = self.state.contracts.before(
            req, lambda form: self._forward(urllib.parse.urlencode(form).encode()), rules, realistic)
        if refusal is None:
            return None
        status, code, message = refusal
        return status, ec2_error_body(code, message), [("Content-Type", "text/xml;charset=UTF-8")]

    def _cluster(self, req: dict[str, Any], rule: dict[str, Any] | None) -> tuple[int, bytes, list[tuple[str, str]]] | None:
        """What EC2 does for clusters and moto does not (ec2_cluster.py): an answer, or None to forward (a
        RunInstances then goes on as req["forward_form"])."""
        if req["target"] is not None or req["service"] not in (None, "ec2"):
            return None
        xml = [("Content-Type", "text/xml;charset=UTF-8")]
        st = self.state
        if req["action"] == "DeletePlacementGroup":
            with st.lock:
                ids = st.cluster.members(req)
            live = live_instances(self.upstream, dict(self.headers.items()), ids)
            with st.lock:
                result = st.cluster.delete(req, live)
        elif req["action"] == "RunInstances":
            with st.lock:
                result = st.cluster.run_instances(req, rule.get("capacity") if rule else None)  # type: ignore[assignment]
            if isinstance(result, dict):
                req["forward_form"] = result
                return None
        elif req["action"] == "TerminateInstances":
            answer = terminate_form(self.upstream, dict(self.headers.items()), req["form"])
            if isinstance(answer, dict):
                req["forward_form"] = answer
            if not isinstance(answer, bytes):
                return None
            return 200, answer, xml
        else:
            with st.lock:
                realistic = st.realism.settings["kind"] == "realistic"
                st.cluster.fresh_lookups = st.realism.settings["fresh_lookups"] if realistic else 0
                result = st.cluster.answer(req)  # type: ignore[assignment]
            if result is None:
                return None
        if len(result) == 2:
            return result[0], result[1], xml  # type: ignore[misc]
        status, code, message = result  # type: ignore[misc]
        return status, ec2_error_body(code, message), xml

    def _spot(self, req: dict[str, Any]) -> tuple[int, bytes, list[tuple[str, str]]] | None:
        """What EC2 does with spot requests and moto does not (ec2_spot.py): an answer, or None to forward."""
        if req["target"] is not None or req["service"] not in (None, "ec2"):
            return None
        xml = [("Content-Type", "text/xml;charset=UTF-8")]
        st = self.state
        if req["action"] == "CancelSpotInstanceRequests":
            with st.lock:
                mine = st.spot.mine(req)
            if not mine:
                return None  # a RequestSpotInstances request of moto's own
            result = st.spot.cancel(req, (self.upstream, dict(self.headers.items())), st.lock)
        else:
            with st.lock:
                result = st.spot.answer(req)  # type: ignore[assignment]
            if result is None:
                return None
        if len(result) == 2:
            return result[0], result[1], xml  # type: ignore[misc]
        status, code, message = result  # type: ignore[misc]
        return status, ec2_error_body(code, message), xml

    def _signing(self, region: str | None) -> dict[str, str]:
        """Headers for a call the proxy makes to moto on its own (control API): a SigV4-shaped Authorization naming
        the region, which is all moto reads of it."""
        when = _dt.datetime.now(_dt.timezone.utc)
        return {"Authorization": f"AWS4-HMAC-SHA256 Credential=testing/{when:%Y%m%d}/{region or 'us-east-1'}/ec2/"
                                 "aws4_request, SignedHeaders=host;x-amz-date, Signature=0",
                "X-Amz-Date": f"{when:%Y%m%dT%H%M%SZ}"}

    def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]], entry: dict[str, Any]) -> None:
        try:
            self._send(status, body, headers)
        except OSError:
            with self.state.lock:
                entry["outcome"] = "client-gone"
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def make_server(port: int, upstream_url: str, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Build (not start) a proxy server; in-process use: threading.Thread(target=srv.serve_forever).start()."""
    handler = type("BoundHandler", (Handler,), {"upstream": urllib.parse.urlsplit(upstream_url), "state": _State()})
    return _Server((host, port), handler)


# ----------------------------------------------------------------------------------------------- client helpers
def _call(proxy_url: str, method: str, path: str, payload: Any = None, timeout: float = 10.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(proxy_url.rstrip("/") + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def add_rules(proxy_url: str, rules: list[dict[str, Any]] | dict[str, Any]) -> list[int]:
    return _call(proxy_url, "POST", CONTROL, rules)["ids"]


def get_state(proxy_url: str) -> dict[str, Any]:
    return _call(proxy_url, "GET", CONTROL)


def clear(proxy_url: str) -> None:
    _call(proxy_url, "DELETE", CONTROL)


def forget_tokens(proxy_url: str) -> None:
    _call(proxy_url, "DELETE", CONTROL + "/tokens")


def placement_groups(proxy_url: str) -> list[dict[str, Any]]:
    """The placement groups the proxy keeps for EC2 (moto has none): region, name, id, strategy, tags, instances."""
    return _call(proxy_url, "GET", CONTROL + "/placement-groups")


def release(proxy_url: str) -> int:
    return _call(proxy_url, "POST", CONTROL + "/release", {})["released"]


def set_regions(proxy_url: str, not_enabled: list[str]) -> list[str]:
    return _call(proxy_url, "POST", CONTROL + "/regions", {"not_enabled": not_enabled})["not_enabled"]


def capacity(proxy_url: str, ask: dict[str, Any] | None = None) -> dict[str, Any]:
    return _call(proxy_url, "POST" if ask else "GET", CONTROL + "/capacity", ask)


def spot_requests(proxy_url: str) -> list[dict[str, Any]]:
    return _call(proxy_url, "GET", CONTROL + "/spot-requests")


def interrupt(proxy_url: str, instance_id: str, region: str = "us-east-1") -> str:
    """EC2 interrupts a spot instance (ec2_spot.py); returns "stopped" or "terminated"."""
    return _call(proxy_url, "POST", CONTROL + "/spot/interrupt", {"instance_id": instance_id, "region": region})["did"]


def get_contracts(proxy_url: str) -> dict[str, Any]:
    """The EC2-contract settings and what the proxy learnt for them (ec2_contracts.py)."""
    return _call(proxy_url, "GET", CONTROL + "/contracts")


def set_contracts(proxy_url: str, **settings: Any) -> dict[str, Any]:
    """Change some of page_size / deregistered_listed / address_limit (until DELETE /__faults__)."""
    return _call(proxy_url, "POST", CONTROL + "/contracts", settings)


def get_kind(proxy_url: str) -> dict[str, Any]:
    return _call(proxy_url, "GET", CONTROL + "/kind")


def set_kind(proxy_url: str, **settings: Any) -> dict[str, Any]:
    """Change some of kind / fresh_lookups / tag_lag (the others keep their values); returns all three."""
    return _call(proxy_url, "POST", CONTROL + "/kind", settings)


def wait_ready(proxy_url: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            get_state(proxy_url)
            return
        except OSError:
            if time.monotonic() > end:
                raise TimeoutError(f"fault proxy {proxy_url} not ready after {timeout} s") from None
            time.sleep(0.02)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    srv = make_server(int(argv[1]), argv[2])
    print(f"fault_proxy ready http://127.0.0.1:{srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
