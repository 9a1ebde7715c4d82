# Shared by the shims in tests/shims/bin (sourced, not run).
#
# State (persists across a simulated reboot):  ${GPUPROV_SHIM_STATE:-/var/lib/gpuprov-shim}
#   env           optional: shell `export VAR=value` lines with shim settings, sourced first
#   calls.log     one line per shim call: "name args..."
#   installed     one line per installed package: "name version"
#   held          apt-mark holds, one name a line
#   nvidia-repo   DISTRO/ARCH of NVIDIA's repository, written when curl fetches its cuda-keyring
#                 (default ubuntu2404/x86_64); nvidia-repo-url: that keyring's folder URL
#   lock-until    optional: an epoch second; until then another process (unattended-upgrades)
#                 holds apt's and dpkg's locks: the shims that lock fail with the real messages
#   nvidia-repo.extra.tsv  optional: more rows in the format of tests/shims/data/nvidia-repo.tsv
#                 (a test publishes a newer point release this way)
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
# GPUPROV_SHIM_NOUVEAU=loaded: the GPU's open-source driver claims it at boot unless blacklisted then (decided
# at the first shim call of a boot, before any step of that boot could write the blacklist).
if [ "${GPUPROV_SHIM_NOUVEAU:-}" = loaded ] && [ ! -e "$SHIM_RUN/nouveau-decided" ]; then
  : >"$SHIM_RUN/nouveau-decided"
  if ! grep -qs '^blacklist nouveau' "${GPUPROV_SYSROOT:-/nonexistent}"/etc/modprobe.d/*.conf; then
    mkdir -p "$SHIM_RUN/modules"
    : >"$SHIM_RUN/modules/nouveau"
  fi
fi

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

# --- apt's and dpkg's locks (messages and exit codes of apt 2.6 and dpkg 1.21, seen in
# tests/test_real_apt.py's chroot) -----------------------------------------------------------------
SHIM_LOCK_PID=4242

shim_lock_held() {
  [ -s "$SHIM_STATE/lock-until" ] && [ "$(date +%s)" -lt "$(cat "$SHIM_STATE/lock-until")" ]
}

# shim_apt_lock_error frontend|lists: what apt-get prints when it cannot take the lock (then exit 100)
shim_apt_lock_error() {
  if [ "$1" = lists ]; then
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process $SHIM_LOCK_PID (unattended-upgr)" >&2
    echo "E: Unable to lock directory /var/lib/apt/lists/" >&2
  else
    echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process $SHIM_LOCK_PID (unattended-upgr)" >&2
    echo "N: Be aware that removing the lock file is not a solution and may break your system." >&2
    echo "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?" >&2
  fi
}

# what dpkg prints (then exit 2)
shim_dpkg_lock_error() {
  echo "dpkg: error: dpkg frontend lock was locked by another process with pid $SHIM_LOCK_PID" >&2
  echo "Note: removing the lock file is always wrong, can damage the locked area" >&2
}

# --- NVIDIA's repository, from tests/shims/data/nvidia-repo.tsv (real names and versions) -------
SHIM_REPO_DATA="$SHIM_HOME/data/nvidia-repo.tsv"

# Names only NVIDIA's CUDA repository carries (the shims check them against the data); other
# names (linux-headers-*, build-essential, ...) come from Ubuntu's archive, which is not modelled.
shim_nvidia_name() {
  case "$1" in
    nvidia-* | cuda-* | libnvidia-* | nvlsm | libnvsdm* | datacenter-gpu-manager-*) return 0 ;;
    *) return 1 ;;
  esac
}

# Names NVIDIA's container toolkit repository carries (nvidia.github.io/libnvidia-container): there once its list file
# is in the sysroot's sources.list.d and apt-get update read it (lists-ctk), from tests/shims/data/ctk-repo.tsv.
shim_ctk_name() {
  case "$1" in
    nvidia-container-toolkit | nvidia-container-toolkit-base | libnvidia-container-tools | libnvidia-container1) return 0 ;;
    *) return 1 ;;
  esac
}

shim_nvidia_repo_url() {
  cat "$SHIM_STATE/nvidia-repo-url" 2>/dev/null || echo "(no NVIDIA repository configured)"
}

shim_nvidia_repo() {
  if [ -s "$SHIM_STATE/nvidia-repo" ]; then cat "$SHIM_STATE/nvidia-repo"; else echo ubuntu2404/x86_64; fi
}

# shim_apt_update_list LIST: `apt-get update` of that one list (-o Dir::Etc::SourceList=LIST). NVIDIA's repository
# in a folder of the host (an offline bundle's, file://) is read as apt reads a flat repository: its InRelease
# verified with the real gpgv against the keyring the list names (signed-by, under the sysroot), the Packages.gz
# listed there by its sha256; its packages are then the ones that index names (shim_repo_rows). A repository on the
# network is a Hit, except on a host with no route out (GPUPROV_SHIM_OFFLINE=1), where it fails as apt says it.
shim_apt_update_list() {
  local list="$1" line rest opts url dir keyring n=0
  [ -f "$list" ] || { echo "E: The list file $list does not exist" >&2; return 1; }
  while read -r line; do
    case "$line" in deb\ *) ;; *) continue ;; esac
    n=$((n + 1))
    rest="${line#deb }"
    opts=""
    if [ "${rest:0:1}" = "[" ]; then opts="${rest%%]*}"; rest="${rest#*] }"; fi
    url="${rest%% *}"
    url="${url%/}"
    case "$url" in
      file://*)
        dir="${url#file://}"
        keyring="$(sed -n 's/.*signed-by=\([^] ]*\).*/\1/p' <<<"$opts")"
        if [ ! -f "$dir/InRelease" ]; then
          echo "E: The repository 'file:$dir/ ./ Release' does not have a Release file." >&2
          return 1
        fi
        if [ -z "$keyring" ] || ! gpgv --keyring "${GPUPROV_SYSROOT:-}$keyring" "$dir/InRelease" >/dev/null 2>&1; then
          echo "Err:$n file:$dir/ ./ InRelease"
          echo "  The following signatures couldn't be verified because the public key is not available"
          echo "E: The repository 'file:$dir/ ./ InRelease' is not signed." >&2
          return 1
        fi
        if ! grep -q "^ $(sha256sum <"$dir/Packages.gz" | cut -d' ' -f1) [0-9]* Packages.gz$" "$dir/InRelease"; then
          echo "E: Failed to fetch file:$dir/./Packages.gz  Hash Sum mismatch" >&2
          return 1
        fi
        echo "Get:$n file:$dir/ ./ InRelease"
        printf '%s\n' "$dir" >"$SHIM_STATE/nvidia-repo-dir"
        printf '%s\n' "$url" >"$SHIM_STATE/nvidia-repo-url"
        touch "$SHIM_STATE/lists-cuda"
        ;;
      *)
        if [ "${GPUPROV_SHIM_OFFLINE:-}" = 1 ]; then
          local host="${url#*://}"
          echo "Err:$n $url  InRelease"
          echo "  Temporary failure resolving '${host%%/*}'"
          echo "W: Some index files failed to download. They have been ignored, or old ones used instead." >&2
        else
          echo "Hit:$n $url  InRelease"
          touch "$SHIM_STATE/lists-cuda"
        fi
        ;;
    esac
  done <"$list"
}

# shim_local_packages: "package version provides filename sha256" for each stanza of the local repository's
# Packages.gz (shim_apt_update_list), provides "-" when none
shim_local_packages() {
  local dir
  dir="$(cat "$SHIM_STATE/nvidia-repo-dir")"
  gzip -dc "$dir/Packages.gz" | awk '
    function flush() { if (p != "") print p, v, (pr == "" ? "-" : pr), f, h; p = v = pr = f = h = "" }
    /^$/ { flush(); next }
    /^Package: / { p = $2 } /^Version: / { v = $2 } /^Filename: / { f = $2 } /^SHA256: / { h = $2 }
    /^Provides: / { pr = $2; sub(/,$/, "", pr) }
    END { flush() }'
}

# shim_local_deb_ok NAME VERSION: the local repository's file of NAME VERSION has the sha256 its index gives, as apt
# checks it before dpkg sees it; otherwise apt's words, and false
shim_local_deb_ok() {
  local dir row file want got
  [ -s "$SHIM_STATE/nvidia-repo-dir" ] || return 0
  dir="$(cat "$SHIM_STATE/nvidia-repo-dir")"
  row="$(shim_local_packages | awk -v p="$1" -v v="$2" '$1 == p && $2 == v {print $4, $5; exit}')"
  [ -n "$row" ] || return 0
  file="$dir/${row% *}"
  want="${row#* }"
  got="$(sha256sum <"$file" 2>/dev/null | cut -d' ' -f1 || true)"
  [ "$got" = "$want" ] && return 0
  echo "E: Failed to fetch file:$file  Hash Sum mismatch" >&2
  echo "   Hashes of expected file:" >&2
  echo "    - SHA256:$want" >&2
  return 1
}

# "package version provides" for every row the configured repository carries.
shim_repo_rows() {
  local repo distro arch
  if [ -s "$SHIM_STATE/nvidia-repo-dir" ]; then
    shim_local_packages | awk '{print $1, $2, $3}'
    return 0
  fi
  repo="$(shim_nvidia_repo)"
  distro="${repo%/*}"
  arch="${repo#*/}"
  { cat "$SHIM_REPO_DATA" "$SHIM_STATE/nvidia-repo.extra.tsv" 2>/dev/null || true
    if [ -e "$SHIM_STATE/lists-ctk" ]; then cat "$SHIM_HOME/data/ctk-repo.tsv"; fi; } |
    awk -F'\t' -v r="$repo" -v d="$distro" -v a="$arch" '
      /^#/ || /^@/ || NF < 5 {next}
      {
        ok = ($1 == "*")
        n = split($1, parts, ",")
        for (i = 1; i <= n; i++) if (parts[i] == r || parts[i] == d || parts[i] == a) ok = 1
        if (ok) print $2, ($3 == "?" ? "1.0-1" : $3), $4
      }'
}

# shim_repo_versions NAME: NAME's versions in the repository, oldest first.
shim_repo_versions() {
  shim_repo_rows | awk -v p="$1" '$1 == p {print $2}' | sort -V -u
}

# shim_repo_providers NAME: the packages that provide the virtual NAME.
shim_repo_providers() {
  shim_repo_rows | awk -v p="$1" '$3 == p {print $1}' | sort -u
}

# shim_candidate NAME: the version apt would choose: the newest, or, while a pinning package is
# installed (nvidia-driver-pinning-BRANCH or -VERSION), the newest the pin allows when there is one.
shim_candidate() {
  local versions pin pinned
  versions="$(shim_repo_versions "$1")"
  [ -n "$versions" ] || return 1
  pin="$(awk '$1 ~ /^nvidia-driver-pinning-/ {sub(/^nvidia-driver-pinning-/, "", $1); print $1; exit}' "$SHIM_STATE/installed")"
  if [ -n "$pin" ] && [ "${1#nvidia-driver-pinning-}" = "$1" ]; then
    case "$pin" in
      *.*) pinned="$(grep -E "^${pin//./\\.}-" <<<"$versions" || true)" ;;
      *) pinned="$(grep -E "^${pin}\\." <<<"$versions" || true)" ;;
    esac
    if [ -n "$pinned" ]; then versions="$pinned"; fi
  fi
  tail -n 1 <<<"$versions"
}

# GPUPROV_SHIM_DRIVER_PREINSTALLED=VERSION: a driver that came with the image, not from these packages (a
# Deep Learning AMI's): loaded, of that version, while dpkg lists no driver package and no pinning package.
shim_driver_installed() {
  [ -n "${GPUPROV_SHIM_DRIVER_PREINSTALLED:-}" ] || shim_installed nvidia-open || shim_installed cuda-drivers
}

# The installed driver's version: the driver package's, else from the pinning package (exact, or
# the branch's release).
shim_driver_version() {
  local pin v
  if [ -n "${GPUPROV_SHIM_DRIVER_PREINSTALLED:-}" ]; then
    echo "$GPUPROV_SHIM_DRIVER_PREINSTALLED"
    return 0
  fi
  if v="$(shim_pkg_version nvidia-open)" || v="$(shim_pkg_version cuda-drivers)"; then
    echo "${v%%-*}"
    return 0
  fi
  pin="$(awk '$1 ~ /^nvidia-driver-pinning-/ {sub(/^nvidia-driver-pinning-/, "", $1); print $1; exit}' "$SHIM_STATE/installed")"
  case "$pin" in
    "") shim_branch_version 580 ;;
    *.*) echo "$pin" ;;
    *) shim_branch_version "$pin" ;;
  esac
}

# GPUPROV_SHIM_MODULE_LOAD=fail: the installed module never loads (Secure Boot rejects its unsigned key,
# or DKMS built nothing for this kernel): not after a reboot, not through modprobe.
shim_module_loaded() {
  [ "${GPUPROV_SHIM_MODULE_LOAD:-}" != fail ] && shim_driver_installed && [ ! -e "$SHIM_RUN/driver-installed-this-boot" ]
}

shim_unit_enabled() {
  [ -e "$SHIM_STATE/enabled/$1" ]
}

shim_unit_active() {
  [ -e "$SHIM_RUN/active/$1" ] || shim_unit_enabled "$1"
}

# A host that stands for an EC2 instance (`make sandbox`): its GPUs follow the instance type launched at its
# address, as an instance's do. GPUPROV_SHIM_INSTANCE_URL answers, for this host's address, the GPU settings of
# the instance moto has there (`export GPUPROV_SHIM_GPU=...` lines); asked at every shim call, since a stop and a
# start with another type (a resize) changes them. The instance exists before its address is known to anyone,
# so the answer is never late.
# (bash's /dev/tcp: a shim runs hundreds of times in a bootstrap, and a python3 start each time would show.)
shim_instance_settings() {  # http://HOST:PORT/PATH -> the answer's body
  local rest="${1#http://}" hostport path line fd
  hostport="${rest%%/*}"
  path="/${rest#*/}"
  exec {fd}<>"/dev/tcp/${hostport%:*}/${hostport##*:}" || return 0  # a free descriptor: the steps hold locks on theirs
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$hostport" >&"$fd"
  while IFS= read -r line <&"$fd" && [ "${line%$'\r'}" != "" ]; do :; done  # the status line and headers
  while IFS= read -r line <&"$fd"; do
    if [[ $line =~ ^export\ GPUPROV_SHIM_[A-Z_]+=[A-Za-z0-9._-]*$ ]]; then echo "$line"; fi
  done
  exec {fd}<&-
}
if [ -n "${GPUPROV_SHIM_INSTANCE_URL:-}" ]; then
  eval "$(shim_instance_settings "$GPUPROV_SHIM_INSTANCE_URL" 2>/dev/null || true)"
fi

# GPU model from GPUPROV_SHIM_GPU (T4, L4, L40S, A100, A100-80GB, H100, B200, and the Arm hosts' GH200 and T4G;
# catalog names accepted).
shim_gpu_model() {
  case "${GPUPROV_SHIM_GPU:-A100}" in
    T4) echo T4 ;;
    T4G) echo T4G ;;
    GH200) echo GH200 ;;
    A100 | A100-40GB | A100-SXM4-40GB) echo A100 ;;
    A100-80GB | A100-SXM4-80GB) echo A100-80GB ;;
    L40S) echo L40S ;;
    L4) echo L4 ;;
    H100 | H100-80GB) echo H100 ;;
    B200) echo B200 ;;
    *) echo "gpuprov shim: unknown GPUPROV_SHIM_GPU=${GPUPROV_SHIM_GPU}" >&2; return 1 ;;
  esac
}

# The CPU architecture `uname -m` says (tests/shims/bin/uname): GPUPROV_SHIM_ARCH, else aarch64 for the GPUs that
# come only with Arm hosts (GH200 beside Grace, g5g's T4G beside Graviton2), else the machine's own.
shim_arch() {
  if [ -n "${GPUPROV_SHIM_ARCH:-}" ]; then
    echo "$GPUPROV_SHIM_ARCH"
    return
  fi
  case "${GPUPROV_SHIM_GPU:-}" in
    GH200 | T4G) echo aarch64 ;;
    *) command -p uname -m ;;
  esac
}

shim_gpu_count() {
  echo "${GPUPROV_SHIM_GPU_COUNT:-1}"
}

# Kernel modules other than nvidia's (ib_umad, mlx5_ib, nouveau, ...): one empty file per loaded module in
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

# --- what a package lays on the disk (tests/shims/data/packages/NAME: files under the sysroot, as dpkg unpacks
# them, and DEBIAN/postinst, run after the install as dpkg runs the package's own; data/packages/README.md) ---------
shim_lay_payload() {
  local dir="$SHIM_HOME/data/packages/$1"
  [ -d "$dir" ] && [ -n "${GPUPROV_SYSROOT:-}" ] || return 0
  (cd "$dir" && find . -path ./DEBIAN -prune -o -type f -print) | while IFS= read -r f; do
    mkdir -p "$(dirname "$GPUPROV_SYSROOT/${f#./}")"
    cp -f "$dir/$f" "$GPUPROV_SYSROOT/${f#./}"
  done
  if [ -x "$dir/DEBIAN/postinst" ]; then "$dir/DEBIAN/postinst" configure; fi
}

shim_take_payload() {
  local dir="$SHIM_HOME/data/packages/$1"
  [ -d "$dir" ] && [ -n "${GPUPROV_SYSROOT:-}" ] || return 0
  (cd "$dir" && find . -path ./DEBIAN -prune -o -type f -print) | while IFS= read -r f; do
    rm -f "$GPUPROV_SYSROOT/${f#./}"
  done
}
