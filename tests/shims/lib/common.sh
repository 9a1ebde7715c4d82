# Shared by the shims in tests/shims/bin (sourced, not run).
#
# State (persists across a simulated reboot):  ${GPUPROV_SHIM_STATE:-/var/lib/gpuprov-shim}
#   env           optional: shell `export VAR=value` lines with shim settings, sourced first
#   calls.log     one line per shim call: "name args..."
#   installed     one line per installed package: "name version"
#   held          apt-mark holds, one name a line
#   enabled/      systemd units enabled (one empty file per unit)
#   who           sessions the `who` shim prints (one `who` line each)
# Volatile (cleared by a reboot):              ${GPUPROV_SHIM_RUN:-/run/gpuprov-shim}
#   driver-installed-this-boot   written when the driver package is installed; while it exists
#                                the kernel module is not loaded (nvidia-smi fails like the real
#                                one does after a fresh install, until the reboot)
#   active/       systemd units started in this boot
# shellcheck shell=bash

SHIM_STATE="${GPUPROV_SHIM_STATE:-/var/lib/gpuprov-shim}"
SHIM_RUN="${GPUPROV_SHIM_RUN:-/run/gpuprov-shim}"
# shellcheck disable=SC2034  # used by the shims that source this file
SHIM_HOME="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Per-host shim settings (`export GPUPROV_SHIM_GPU=H100` lines), for shells that do not carry
# the test's environment (the SSH test hosts write it); the file wins over the environment.
if [ -f "$SHIM_STATE/env" ]; then
  # shellcheck disable=SC1091
  source "$SHIM_STATE/env"
fi
mkdir -p "$SHIM_STATE/enabled" "$SHIM_RUN/active"
touch "$SHIM_STATE/installed" "$SHIM_STATE/held"

shim_record() {
  printf '%s\n' "$*" >>"$SHIM_STATE/calls.log"
}

shim_pkg_version() {
  awk -v p="$1" '$1 == p {print $2; found=1} END {exit !found}' "$SHIM_STATE/installed"
}

shim_installed() {
  shim_pkg_version "$1" >/dev/null
}

shim_set_pkg() {
  local tmp="$SHIM_STATE/installed.tmp"
  awk -v p="$1" '$1 != p' "$SHIM_STATE/installed" >"$tmp"
  printf '%s %s\n' "$1" "$2" >>"$tmp"
  mv -f "$tmp" "$SHIM_STATE/installed"
}

# The driver version a branch's pinning package selects (recent releases of each branch).
shim_branch_version() {
  case "$1" in
    535) echo 535.274.02 ;;
    550) echo 550.163.01 ;;
    560) echo 560.35.05 ;;
    570) echo 570.195.03 ;;
    575) echo 575.57.08 ;;
    580) echo 580.95.05 ;;
    590) echo 590.48.01 ;;
    595) echo 595.91.07 ;;
    *) echo "$1.20.01" ;;
  esac
}

# Highest CUDA version a driver branch supports (what nvidia-smi prints as "CUDA Version").
shim_branch_cuda() {
  case "$1" in
    535) echo 12.2 ;;
    550) echo 12.4 ;;
    560) echo 12.6 ;;
    570) echo 12.8 ;;
    575) echo 12.9 ;;
    580) echo 13.0 ;;
    590) echo 13.1 ;;
    *) echo 13.2 ;;
  esac
}

shim_driver_installed() {
  shim_installed nvidia-open || shim_installed cuda-drivers
}

# The installed driver's version: from the pinning package (exact, or the branch's release).
shim_driver_version() {
  local pin
  pin="$(awk '$1 ~ /^nvidia-driver-pinning-/ {sub(/^nvidia-driver-pinning-/, "", $1); print $1; exit}' "$SHIM_STATE/installed")"
  case "$pin" in
    "") shim_branch_version 580 ;;
    *.*) echo "$pin" ;;
    *) shim_branch_version "$pin" ;;
  esac
}

shim_module_loaded() {
  shim_driver_installed && [ ! -e "$SHIM_RUN/driver-installed-this-boot" ]
}

shim_unit_enabled() {
  [ -e "$SHIM_STATE/enabled/$1" ]
}

shim_unit_active() {
  [ -e "$SHIM_RUN/active/$1" ] || shim_unit_enabled "$1"
}

# GPU model from GPUPROV_SHIM_GPU (T4, A100, H100, B200; catalog names accepted).
shim_gpu_model() {
  case "${GPUPROV_SHIM_GPU:-A100}" in
    T4) echo T4 ;;
    A100 | A100-40GB | A100-SXM4-40GB) echo A100 ;;
    H100 | H100-80GB) echo H100 ;;
    B200) echo B200 ;;
    *) echo "gpuprov shim: unknown GPUPROV_SHIM_GPU=${GPUPROV_SHIM_GPU}" >&2; return 1 ;;
  esac
}

shim_gpu_count() {
  echo "${GPUPROV_SHIM_GPU_COUNT:-1}"
}

# Kernel modules other than nvidia's (ib_umad, mlx5_ib, ...): one empty file per loaded module in
# $SHIM_RUN/modules (a reboot unloads them). At the first module query of a boot, the modules listed in
# the sysroot's /etc/modules-load.d/*.conf are loaded, as systemd-modules-load does at boot, if their
# package is installed.
# The package that ships a module (Ubuntu's AWS kernels: the InfiniBand modules are in modules-extra).
shim_module_package() {
  case "$1" in
    ib_umad | ib_uverbs | ib_core | mlx5_ib | rdma_ucm) echo "linux-modules-extra-$(uname -r)" ;;
    *) echo "linux-modules-$(uname -r)" ;;
  esac
}

shim_module_available() {
  case "$1" in
    ib_umad | ib_uverbs | ib_core | mlx5_ib | rdma_ucm) shim_installed "$(shim_module_package "$1")" ;;
    *) return 1 ;;
  esac
}

shim_boot_modules() {
  local conf mod
  mkdir -p "$SHIM_RUN/modules"
  [ -e "$SHIM_RUN/boot-modules-loaded" ] && return 0
  : >"$SHIM_RUN/boot-modules-loaded"
  for conf in "${GPUPROV_SYSROOT:-/nonexistent}"/etc/modules-load.d/*.conf; do
    [ -r "$conf" ] || continue
    while read -r mod _; do
      case "$mod" in "" | "#"* | ";"*) continue ;; esac
      if shim_module_available "$mod"; then : >"$SHIM_RUN/modules/$mod"; fi
    done <"$conf"
  done
}

shim_module_loaded_named() {
  shim_boot_modules
  [ -e "$SHIM_RUN/modules/$1" ]
}

# persistence mode is on when nvidia-persistenced runs with --persistence-mode: the packaged unit passes
# --no-persistence-mode, so only a drop-in under the sysroot that says --persistence-mode turns it on.
shim_persistence_mode_on() {
  local d="${GPUPROV_SYSROOT:-/nonexistent}/etc/systemd/system/nvidia-persistenced.service.d"
  shim_unit_active nvidia-persistenced && cat "$d"/*.conf 2>/dev/null | grep -q '^ExecStart=.*[[:space:]]--persistence-mode'
}
