"""AWS's Elastic Fabric Adapter: the interfaces a cluster node launches with, the installer of its software, and how
`plan --nodes N` says them. Pure (no SDK): cloud/cluster_network.py lays a cluster out with it, and its `efa` step
installs what `EFA_INSTALLER` names.

The interfaces: ENA primary at card 0/device 0, EFA-only at card 0/device 1 when card 0 carries EFA (p6-b300's
does not) and device 0 of every other EFA card; one card: one `efa` interface.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.cloud.providers.base import Nic


# The EFA software (EFA driver, libfabric, rdma-core, Open MPI and the AWS OFI NCCL plugin in one installer).
# Source: AWS EC2 User Guide, "Elastic Fabric Adapter release notes" (efa-changelog): 1.51.0, October 22, 2026,
# "Upgrade to Amazon OFI NCCL Plugin 1.22.0"; URL form efa-installer.amazonaws.com/aws-efa-installer-<version>.tar.gz
# (AWS's "Get started with EFA and NCCL", and aws-parallelcluster-cookbook's installer_url).
# Environment: FI_PROVIDER=efa selects libfabric's EFA provider; the plugin and libfabric on LD_LIBRARY_PATH, without
# which NCCL falls back to sockets (NVIDIA-NeMo/RL PR #2359); FI_EFA_USE_DEVICE_RDMA=1 only on the types whose EFA
# device does RDMA read (catalog `efa_rdma`, p4d and later P types: libfabric refuses the setting on a device without
# it; aws/sagemaker-training-toolkit torch_distributed.py sets it for those types only).
@dataclass(frozen=True)
class EfaInstaller:
    version: str
    url: str
    env: tuple[tuple[str, str], ...]


EFA_INSTALLER = EfaInstaller(
    version="1.51.0", url="https://efa-installer.amazonaws.com/aws-efa-installer-1.51.0.tar.gz",
    env=(("FI_PROVIDER", "efa"), ("LD_LIBRARY_PATH", "/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib")))
DEVICE_RDMA_ENV = ("FI_EFA_USE_DEVICE_RDMA", "1")


def efa_interfaces(cards: tuple[int, ...]) -> tuple[Nic, ...]:
    """AWS's layout for EFA on the network cards that carry it (catalog.yaml `cluster_network.interface_source`):
    one card, card 0: one EFA-with-ENA interface; else an ENA primary (card 0, device 0), an EFA-only interface at
    card 0 device 1 when card 0 carries EFA, then EFA-only at device 0 on every other EFA card."""
    if cards == (0,):
        return (Nic(0, 0, "efa"),)
    return (Nic(0, 0, "interface"), *((Nic(0, 1, "efa-only"),) if 0 in cards else ()),
            *(Nic(card, 0, "efa-only") for card in cards if card != 0))


def lines(interfaces: tuple[Nic, ...], device_rdma: bool) -> list[str]:
    """What `plan --nodes N` says of a node's EFA: its interfaces, NCCL's transport over them, and its public address
    (EC2 gives none to an instance launched with more than one network interface: an Elastic IP a node)."""
    cards = len({n.card for n in interfaces})
    several = len(interfaces) > 1
    kinds = "ENA + EFA-only on each card" if several else "EFA with ENA"
    said = [f"network: EFA, {cards} card(s), {len(interfaces)} interface(s) a node ({kinds})",
            "NCCL: libfabric's EFA provider + AWS OFI NCCL plugin (`efa` step)"
            + (", device RDMA (FI_EFA_USE_DEVICE_RDMA=1)" if device_rdma else ", no device RDMA")]
    if several:
        said.append("public address: an Elastic IP a node (EC2 gives none with several interfaces)")
    return said


def step_words(installer: EfaInstaller, instance_type: str, device_rdma: bool) -> str:
    """The `efa` step's summary in the plan: the installer and what it sets."""
    return (f"AWS EFA installer {installer.version} (EFA driver, libfabric, AWS OFI NCCL plugin); NCCL/libfabric "
            "environment in /etc/gpuprov/efa.env"
            + ("" if device_rdma else f" (no device RDMA: {instance_type}'s EFA has no RDMA read)"))
