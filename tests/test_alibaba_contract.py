"""The ECS imitation's contract with the SDK: every answer it gave in a whole node's life (launch, stop, start,
a cluster's deployment set, image, gc) read through the SDK's own `<Action>ResponseBody` model and written out again
unchanged, so no field is one the SDK does not know, and every action the provider sends was answered at least once."""

from __future__ import annotations

import re
from pathlib import Path

from alibabacloud_ecs20140526 import models

from gpuprov.cloud.providers.base import CloudResource, ImageRequest, LaunchRequest
from tests.test_alibaba import A10, REGION, ZONE_H, _access, provider_image

PROVIDERS = Path(__file__).resolve().parent.parent / "src" / "gpuprov" / "cloud" / "providers"


def _life(provider, cloud) -> None:
    access = _access(provider)
    provider.ssh_cidrs(REGION, access.security_group_id)
    provider.key_pair_exists(REGION, access.key_name)
    provider.find_security_group(REGION, "gpuprov-n1")
    provider.image(REGION, "ubuntu-24.04")
    provider.image_root(REGION, provider_image)
    provider.public_image(REGION, "ubuntu_22_04")
    provider.subnets(REGION, provider.network(REGION, None).vpc_id, [ZONE_H])
    provider.network(REGION, f"vsw-{ZONE_H}")
    provider.offerings(REGION, [A10])
    provider.prices(REGION, [A10])
    provider.list_price(REGION, A10, zone=ZONE_H, disk_gb=60)
    provider.disk_price(REGION, 60, zone=ZONE_H)
    provider.zone_stock(REGION, [A10])
    provider.gpu_instance_types(REGION)
    provider.instance_store(A10, REGION)
    provider.quota(REGION, "max-postpaid-instance-vcpu-count")
    provider.enabled_regions(REGION)
    instance = provider.launch(LaunchRequest(node="n1", region=REGION, zone=ZONE_H, instance_type=A10, market="spot",
                                             image_id=provider_image, access=access, disk_gb=40, client_token="t"), 5)
    provider.find_launched(REGION, "t")
    provider.stop(REGION, [instance.id], 1)
    provider.wait_stopped(REGION, [instance.id], 5)
    provider.set_instance_type(REGION, instance.id, A10, 1)
    provider.start(REGION, [instance.id], 1)
    provider.wait_running(REGION, instance.id, 5, 1)
    provider.authorize_self(REGION, access.security_group_id, 1)
    into = provider.create_placement_group(REGION, "n1", "gpuprov-n1-set")
    pair = provider.launch_group(LaunchRequest(node="n1", region=REGION, zone=ZONE_H, instance_type=A10,
                                               market="on-demand", image_id=provider_image, access=access, disk_gb=40,
                                               client_token="t-set", count=2, min_count=2, placement_group=into), 5)
    provider.terminate(REGION, [i.id for i in pair], 1)
    provider.delete(CloudResource("placement-group", "gpuprov-n1-set", REGION, "n1"), settle=1)  # by its name
    image = provider.create_image(ImageRequest(REGION, instance.id, "img", "d", "n1", "s", "ubuntu-22.04"))
    provider.wait_image(REGION, image, 5, 1)
    provider.delete_image(REGION, image)
    vpc, cidr = provider.create_own_vpc(REGION)  # a region with no default VPC: gpuprov's own, a zone's vSwitch
    switch = provider.create_own_switch(REGION, vpc, cidr, ZONE_H)
    provider.delete(CloudResource("vswitch", switch, REGION, "-"))
    provider.delete(CloudResource("vpc", vpc, REGION, "-"))
    _ram_life(provider, cloud.ram, access)
    for resource in sorted(provider.tagged(REGION), key=lambda r: r.kind != "instance"):
        provider.delete(resource, settle=1)


def _ram_life(provider, ram, access) -> None:
    """The RAM role's life (RAM's imitation, beside ECS's): made with a lost answer looked for, an instance launched
    with it, listed for gc, deleted."""
    from tests.alibaba.server import Fault

    ram.faults += [Fault(action, lose=True) for action in ("CreatePolicy", "CreateRole", "AttachPolicyToRole")]
    role = provider.create_stop_role()
    assert provider.has_stop_role() and provider.tagged_stop_roles()[0].id == role
    instance = provider.launch(LaunchRequest(node="n2", region=REGION, zone=ZONE_H, instance_type=A10,
                                             market="on-demand", image_id=provider_image, access=access, disk_gb=40,
                                             client_token="t-role", instance_profile=role), 5)
    provider.terminate(REGION, [instance.id], 1)
    provider.delete(CloudResource("ram-role", role, "global", "(shared)"))


def test_every_answer_reads_back_through_the_sdks_response_model(ecs_cloud, alibaba):
    from alibabacloud_ram20150501 import models as ram_models

    _life(alibaba, ecs_cloud)
    assert ecs_cloud.answers and ecs_cloud.ram.answers
    for sdk, answers in ((models, ecs_cloud.answers), (ram_models, ecs_cloud.ram.answers)):
        for action, body in answers:
            model = getattr(sdk, f"{action}ResponseBody")
            assert model().from_map(body).to_map() == body, action


def test_every_action_the_provider_sends_was_answered(ecs_cloud, alibaba):
    _life(alibaba, ecs_cloud)
    source = "".join(p.read_text() for p in PROVIDERS.glob("alibaba*.py"))
    sent = set(re.findall(r'_(?:call|send|pages|each)\(\s*[\w.]+,\s*"([A-Z][A-Za-z]+)"', source))
    assert sent - {action for action, _ in ecs_cloud.answers} == set()
    from gpuprov import mutations

    # alibaba_ram.py's calls: its reads by name, and every change the mutations table lets its client send
    ram_sent = set(re.findall(r'_(?:ram|create)\(\s*"([A-Z][A-Za-z]+)"', source)) | {
        op for service, op in mutations.MUTATIONS if service == "alibaba-ram"}
    assert {"CreateRole", "DeleteRole", "ListRoles", "GetRole"} <= ram_sent
    assert ram_sent - {action for action, _ in ecs_cloud.ram.answers} == set()
