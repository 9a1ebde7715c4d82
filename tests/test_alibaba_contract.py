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


def _life(provider) -> None:
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
    for resource in sorted(provider.tagged(REGION), key=lambda r: r.kind != "instance"):
        provider.delete(resource, settle=1)


def test_every_answer_reads_back_through_the_sdks_response_model(ecs_cloud, alibaba):
    _life(alibaba)
    assert ecs_cloud.answers
    for action, body in ecs_cloud.answers:
        model = getattr(models, f"{action}ResponseBody")
        assert model().from_map(body).to_map() == body, action


def test_every_action_the_provider_sends_was_answered(ecs_cloud, alibaba):
    _life(alibaba)
    sent = set(re.findall(r'_(?:call|send|pages|each)\(\s*[\w.]+,\s*"([A-Z][A-Za-z]+)"',
                          "".join(p.read_text() for p in PROVIDERS.glob("alibaba*.py"))))
    assert sent - {action for action, _ in ecs_cloud.answers} == set()
