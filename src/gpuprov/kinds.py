"""The kinds of cloud resource gpuprov makes, named once: the records keep them (state/), the providers make
and remove them (cloud/providers/, which may not read the records), so the one name lives on the floor both
stand on."""

from __future__ import annotations

from typing import Literal

# an image row has node None: images outlive the node they were baked from; a snapshot is an image's (a provider
# finds and removes it by its tag, the records never hold one); a vpc and its vswitch rows (gpuprov's own network
# where a region has none by default: cloud/own_network.py) have node None too, the region's as its key pair is; so
# does a ram-role row (the role an Alibaba node's guards stop it with: cloud/stop_role.py), whose region is "global"
ResourceKind = Literal["key-pair", "security-group", "instance", "spot-request", "volume", "image", "snapshot",
                       "placement-group", "address", "iam-role", "instance-profile", "vpc", "vswitch", "ram-role"]
