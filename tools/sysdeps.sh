#!/usr/bin/env bash
# Installs the system packages the test-suite drives for real (sshd, sudo, ip, shellcheck, rsync, prometheus
# and prometheus-node-exporter,
# debootstrap and dpkg-dev for the real-apt chroot, dnf/rpm/createrepo-c for the real-dnf test, systemd-analyze to verify the rendered units),
# when they are missing and we can: as root with apt-get. Otherwise says what is missing.
# `sysdeps.sh sandbox` (make sandbox): only what the sandbox runs (tools/sandbox.py): sshd in the hosts' namespaces,
# sudo for their login user, ip for the namespaces, rsync for `gpuprov sync`, the node exporter for `--metrics`.
set -euo pipefail
missing=()
[[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
command -v sudo >/dev/null || missing+=(sudo)
command -v ip >/dev/null || missing+=(iproute2)
command -v rsync >/dev/null || missing+=(rsync)
[[ -x /usr/bin/prometheus-node-exporter ]] || missing+=(prometheus-node-exporter)
if [[ ${1:-} != sandbox ]]; then
command -v shellcheck >/dev/null || missing+=(shellcheck)
# tests/test_cluster_hosts.py: a firewall rule (DROP) inside one test host's namespace
command -v iptables >/dev/null || [[ -x /usr/sbin/iptables ]] || missing+=(iptables)
# tests/test_systemd_units.py: `systemd-analyze verify` on every rendered unit and timer
command -v systemd-analyze >/dev/null || missing+=(systemd)
# the real-apt test (tests/test_real_apt.py): a debootstrapped chroot and a local repository
command -v debootstrap >/dev/null || [[ -x /usr/sbin/debootstrap ]] || missing+=(debootstrap)
command -v dpkg-scanpackages >/dev/null || missing+=(dpkg-dev)
# the real-dnf test (tests/test_real_dnf.py): dnf (and its versionlock plugin) on an install root, rpmbuild and
# createrepo_c for the imitation of NVIDIA's RPM repository
command -v dnf >/dev/null || missing+=(dnf)
[[ -e /usr/lib/python3/dist-packages/dnf-plugins/versionlock.py ]] || missing+=(dnf-plugins-core)
command -v rpmbuild >/dev/null || missing+=(rpm)
command -v createrepo_c >/dev/null || missing+=(createrepo-c)
# tests/test_metrics_ssh.py: the distribution's node exporter (above) runs inside the SSH test hosts, and a real
# Prometheus (with promtool) scrapes it through `gpuprov metrics serve`
[[ -x /usr/bin/prometheus && -x /usr/bin/promtool ]] || missing+=(prometheus)
# tests/test_site_cache_ssh.py: `bootstrap --cache-host` runs apt-cacher-ng inside a test host (bench/site_cache.py too)
command -v apt-cacher-ng >/dev/null || [[ -x /usr/sbin/apt-cacher-ng ]] || missing+=(apt-cacher-ng)
fi
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # the tests start their own exporter and Prometheus on loopback; the packages' services stay off here
  if [[ -d /run/systemd/system ]]; then
    for unit in prometheus prometheus-node-exporter apt-cacher-ng; do
      systemctl disable --now "$unit.service" >/dev/null 2>&1 || true
    done
  fi
else
  echo "missing system packages (install them, as root): ${missing[*]}; tests that need them will skip" >&2
fi
