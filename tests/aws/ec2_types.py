"""EC2's instance types as the imitation describes them: moto ships AWS's DescribeInstanceTypes data as it was
when moto 5.2.5 was cut; the proxy lays today's differences over moto's answers, as EC2 would give them.

* `NEW`: types pinned here so the tests do not hang on which moto's data has them: g7e.2xlarge (one NVIDIA RTX PRO
  6000 Blackwell Server Edition, issue 37; moto 5.2.5 has it too, as AWS's data gave it, and the proxy's item takes
  the place of moto's; the shipped snapshot has it since 2026-12-03), and g9.2xlarge, an INVENTED type with an L40
  (a GPU of plan/gpu_names.py's table the snapshot lacks), standing for the next type EC2 adds: every real GPU type
  EC2 describes on x86_64 is in the snapshot now. DescribeInstanceTypes lists
  them, and DescribeInstanceTypeOfferings offers them in `ZONES` of their region. Their shape is botocore's EC2
  model's (InstanceTypeInfo, its XML names from the model's locationName, as `xml_item` renders any value of a
  shape), so gpuprov reads them through its own parser.
* `GONE`: types EC2 no longer describes (P3: p3.2xlarge, p3.8xlarge, p3.16xlarge). moto 5.2.5's data lacks them
  already; the proxy drops them from both answers anyway, so a later moto that has them still leaves them out.

Only whole answers are rewritten (no InstanceType.N names a new type: moto would refuse it as InvalidInstanceType;
gpuprov asks for every type, page by page, with no names).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

NEW: dict[str, dict[str, Any]] = {
    # AWS's own figures for g7e.2xlarge as moto 5.2.5 ships them (GpuInfo name "RTX PRO Server 6000", 98,304 MiB,
    # 8 vCPU, 64 GiB, no EFA: issue 37 gives "EFA from 8xlarge"); the fields gpuprov does not read are abridged.
    "g7e.2xlarge": {
        "InstanceType": "g7e.2xlarge", "CurrentGeneration": True, "FreeTierEligible": False,
        "SupportedUsageClasses": ["on-demand", "spot"], "SupportedRootDeviceTypes": ["ebs"],
        "SupportedVirtualizationTypes": ["hvm"], "BareMetal": False, "Hypervisor": "nitro",
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"], "SustainedClockSpeedInGhz": 2.7},
        "VCpuInfo": {"DefaultVCpus": 8, "DefaultCores": 4, "DefaultThreadsPerCore": 2},
        "MemoryInfo": {"SizeInMiB": 65536},
        "InstanceStorageSupported": False,
        "EbsInfo": {"EbsOptimizedSupport": "default", "EncryptionSupport": "supported", "NvmeSupport": "required"},
        "NetworkInfo": {"NetworkPerformance": "Up to 50 Gigabit", "MaximumNetworkInterfaces": 4,
                        "MaximumNetworkCards": 1, "DefaultNetworkCardIndex": 0,
                        "NetworkCards": [{"NetworkCardIndex": 0, "NetworkPerformance": "Up to 50 Gigabit",
                                          "MaximumNetworkInterfaces": 4}],
                        "Ipv4AddressesPerInterface": 15, "Ipv6AddressesPerInterface": 15, "Ipv6Supported": True,
                        "EnaSupport": "required", "EfaSupported": False, "EncryptionInTransitSupported": True},
        "GpuInfo": {"Gpus": [{"Name": "RTX PRO Server 6000", "Manufacturer": "NVIDIA", "Count": 1,
                              "MemoryInfo": {"SizeInMiB": 98304}}],
                    "TotalGpuMemoryInMiB": 98304},
        "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
        "HibernationSupported": False, "BurstablePerformanceSupported": False, "DedicatedHostsSupported": True,
        "AutoRecoverySupported": True, "SupportedBootModes": ["legacy-bios", "uefi"],
    },
}
# INVENTED (no such type): g7e.2xlarge's shape with one L40 (48 GB, EC2-style 46,068 MiB), a type the snapshot lacks
NEW["g9.2xlarge"] = {**NEW["g7e.2xlarge"], "InstanceType": "g9.2xlarge",
                     "GpuInfo": {"Gpus": [{"Name": "L40", "Manufacturer": "NVIDIA", "Count": 1,
                                           "MemoryInfo": {"SizeInMiB": 46068}}], "TotalGpuMemoryInMiB": 46068}}
REGION = "us-east-1"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
GONE = frozenset({"p3.2xlarge", "p3.8xlarge", "p3.16xlarge"})


@cache
def _shape(operation: str, member: str) -> Any:
    import botocore.session

    model = botocore.session.get_session().get_service_model("ec2")
    return model.operation_model(operation).output_shape.members[member].member


def xml_item(shape: Any, value: Any) -> str:
    """`value` as EC2's query protocol writes it for `shape` (botocore's model: each member under its
    locationName, a list's entries as `item`)."""
    if shape.type_name == "structure":
        return "".join(f"<{m.serialization.get('name', name)}>{xml_item(m, value[name])}</{m.serialization.get('name', name)}>"
                       for name, m in shape.members.items() if name in value)
    if shape.type_name == "list":
        tag = shape.member.serialization.get("name", "item")
        return "".join(f"<{tag}>{xml_item(shape.member, v)}</{tag}>" for v in value)
    if shape.type_name == "boolean":
        return "true" if value else "false"
    return escape(str(value))


def _offering(name: str, location: str, kind: str) -> dict[str, str]:
    return {"InstanceType": name, "LocationType": kind, "Location": location}


def _filter(form: dict[str, str], name: str) -> list[str] | None:
    """The values of the request's Filter.N named `name` (None when it has none)."""
    for key, value in form.items():
        m = re.fullmatch(r"Filter\.(\d+)\.Name", key)
        if m and value == name:
            return [v for k, v in form.items() if re.fullmatch(rf"Filter\.{m.group(1)}\.Value\.\d+", k)]
    return None


def _rewrite(body: bytes, set_tag: str, shape: Any, new: list[dict[str, Any]]) -> bytes:
    """The answer with GONE types' items left out and `new` (values of `shape`) added at the end of its set."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return body
    ns = root.tag[1:].split("}")[0] if root.tag.startswith("{") else ""
    q = (lambda tag: f"{{{ns}}}{tag}") if ns else (lambda tag: tag)
    found = root.find(q(set_tag))
    if found is None:
        return body
    replaced = GONE | {str(v.get("InstanceType") or "") for v in new} - {""}  # a pinned type's item is ours
    gone = [item for item in found if (item.findtext(q("instanceType")) or "").strip() in replaced]
    for item in gone:
        found.remove(item)
    for value in new:
        found.append(ET.fromstring(f'<item xmlns="{ns}">{xml_item(shape, value)}</item>' if ns else
                                   f"<item>{xml_item(shape, value)}</item>"))
    if not gone and not new:
        return body
    if ns:
        ET.register_namespace("", ns)  # keep the default namespace (no ns0: prefixes) for botocore
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def answer(action: str, region: str | None, form: dict[str, str], body: bytes) -> bytes:
    """moto's answer to DescribeInstanceTypes or DescribeInstanceTypeOfferings as EC2 gives it today."""
    ours = region == REGION and "NextToken" not in form  # the new types come on the first (only) page
    if action == "DescribeInstanceTypes":
        named = any(k.startswith(("InstanceType.", "Filter.")) for k in form)
        return _rewrite(body, "instanceTypeSet", _shape(action, "InstanceTypes"),
                        list(NEW.values()) if ours and not named else [])
    kind = form.get("LocationType", "region")
    wanted, locations = _filter(form, "instance-type"), _filter(form, "location")
    where = {"region": (REGION,), "availability-zone": ZONES}.get(kind, ())
    new = [_offering(name, loc, kind) for name in NEW if ours and (wanted is None or name in wanted)
           for loc in where if locations is None or loc in locations]
    return _rewrite(body, "instanceTypeOfferingSet", _shape(action, "InstanceTypeOfferings"), new)
