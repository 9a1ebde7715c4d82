#!/usr/bin/env bash
# AWS EFA installer (gpuprov test shim), shipped inside the tarball the curl shim serves. Like the real
# efa_installer.sh it must run as root, asks before installing unless -y, refuses an option it does not know,
# installs under /opt/amazon (here under GPUPROV_SYSROOT) and records its version in
# /opt/amazon/efa_installed_packages ("# EFA installer version: V").
set -euo pipefail
# shellcheck source=../lib/common.sh
source "@SHIM_HOME@/lib/common.sh"
shim_record efa_installer.sh "$@"
version="@VERSION@"
ofi_nccl="@OFI_NCCL@"
yes=0
for arg in "$@"; do
  case "$arg" in
    -y | --yes) yes=1 ;;
    -m | --minimal | -g | --enable-gdr | -n | --no-verify | -k | --skip-kmod | -l | --skip-limit-conf | -d | --debug-packages) ;;
    *) echo "Unknown option: $arg" >&2; echo "Usage: efa_installer.sh [-y] [-m] [-n] [-k] [-l] [-d]" >&2; exit 1 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then
  echo "This script must be run as root" >&2
  exit 1
fi
if [ "$yes" != 1 ]; then
  read -r -p "Do you want to continue? [y/N] " answer || answer=""
  case "$answer" in y | Y) ;; *) echo "Aborting." >&2; exit 1 ;; esac
fi
root="${GPUPROV_SYSROOT:-}"
mkdir -p "$root/opt/amazon/efa/lib" "$root/opt/amazon/efa/bin" "$root/opt/amazon/ofi-nccl/lib"
printf 'gpuprov test shim: libfabric with the efa provider\n' >"$root/opt/amazon/efa/lib/libfabric.so.1"
printf 'gpuprov test shim: aws-ofi-nccl %s\n' "$ofi_nccl" >"$root/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"
printf '#!/usr/bin/env bash\nexec "%s/libexec/fi_info" "$@"\n' "@SHIM_HOME@" >"$root/opt/amazon/efa/bin/fi_info"
chmod 0755 "$root/opt/amazon/efa/bin/fi_info"
printf '# EFA installer version: %s\n# Debug packages installed: no\n' "$version" >"$root/opt/amazon/efa_installed_packages"
shim_set_pkg aws-efa-installer "$version"
echo "===================================================" >&2
echo "EFA installation complete." >&2
