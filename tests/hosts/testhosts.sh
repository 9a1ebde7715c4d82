#!/usr/bin/env bash
# testhosts.sh: fake "machines" for SSH tests. Each host is a real OpenSSH server on port 22 in its own
# network + UTS + mount namespace, run by a tiny supervisor loop (this same script, mode _host).
#
#   BASE=/var/tmp/x PUBKEY=/var/tmp/x/id_ed25519.pub testhosts.sh up N
#   BASE=/var/tmp/x testhosts.sh down          # safe to run twice; kills by PID, removes netns/veths/bridge
#
# Env:
#   BASE    (required) state folder. Per host: $BASE/<ns>/ with ssh_host_ed25519_key{,.pub}, sshd_config,
#           sshd.log, supervisor.log, supervisor.pid, ctl/ (see protocol). $BASE/hosts.txt has one line per
#           host: "<name> <ip> <hostkey_pub_path>".
#   PUBKEY  (required for up) public key file authorized for root.
#   OFFSET  host i (1..N) gets $SUBNET.(OFFSET+i); default 10. SUBNET default 10.200.0 (bridge gets .1/24).
#   BRIDGE  bridge name, default gpbr0.   PREFIX  namespace/host name prefix, default gph (hosts gph1..gphN).
#   SUDO_USERS optional "user user": may `sudo -n` to root without a password on every host (needs SHIMS)
#   HOST_ENV optional "KEY=VALUE KEY=VALUE": extra variables every ssh session gets (sshd SetEnv; needs SHIMS)
#   SHIMS   optional folder; bind-mounted read-only at /usr/local/gpuprov-shims inside every host, and
#           /usr/local/gpuprov-shims/bin is put FIRST on PATH for ssh sessions (sshd SetEnv PATH, plus
#           /root/.profile for login shells) and first in sudo's secure_path (per-host /etc/sudoers copy).
#   REBOOT_DELAY  seconds a rebooting host stays without sshd; default 1.
#
# Inside every host (private mount namespace; everything else, e.g. /etc, /usr, /home, is the real machine's):
#   tmpfs: /tmp, /root, /var/lib/gpuprov, /var/lib/gpuprov-shim (shim call logs), /run/gpuprov-shim (volatile)
#   bind:  /etc/hosts, /etc/hostname (per host; sudo needs its own name resolvable), /etc/sudoers (if SHIMS),
#          /proc/sys/kernel/random/boot_id (a per-host file that changes at every simulated reboot),
#          /run/gpuprov-host = $BASE/<ns>/ctl (the control folder, shared with the test process).
#   No default route: a host reaches only $SUBNET.0/24.
#   The empty mount-point folders (/var/lib/gpuprov, /var/lib/gpuprov-shim, /run/gpuprov-shim,
#   /run/gpuprov-host, /usr/local/gpuprov-shims) are created on the real machine and left there.
#
# Control protocol (folder /run/gpuprov-host inside the host == $BASE/<ns>/ctl outside):
#   Drop one of these files (content ignored) and the supervisor (polls every 0.1 s) acts on it:
#     reboot-request   kill EVERY process of the host (sshd and all sessions: the client sees the connection
#                      drop), empty /run/gpuprov-shim, new boot_id, wait REBOOT_DELAY s, start sshd again with
#                      the same host key. tmpfs /var/lib/gpuprov, /var/lib/gpuprov-shim, /tmp, /root survive.
#     stop-request     kill every process of the host and do not restart sshd (host "powered off").
#     restart-request  restart only the sshd listener (re-reads host key/config; open sessions survive);
#                      also starts sshd after a stop.
#   The supervisor writes, in the same folder: supervisor.pid, sshd.pid, boots (count of sshd starts by boot),
#   boot_id, and state = "up <boots> <sshd pid>" | "rebooting" | "stopped".
#   The shim tests/shims/bin/reboot just does:  : > /run/gpuprov-host/reboot-request
#
# If `ip netns add` is not permitted, `up` prints a line saying so and exits 3.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
BRIDGE=${BRIDGE:-gpbr0}
PREFIX=${PREFIX:-gph}
OFFSET=${OFFSET:-10}
SUBNET=${SUBNET:-10.200.0}
REBOOT_DELAY=${REBOOT_DELAY:-1}
SHIMS=${SHIMS:-}
SHIM_MNT=/usr/local/gpuprov-shims
SITE=${SITE:-}  # optional: the tests' Python site-packages, bind-mounted read-only at $SITE_MNT (shims that use boto3)
SITE_MNT=/usr/local/gpuprov-site
PRIVATE=${PRIVATE:-}  # optional: more existing folders each host gets an empty one of its own (the sandbox's /work)
CTL_IN=/run/gpuprov-host
VOLATILE=/run/gpuprov-shim
STD_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

die() { echo "testhosts: $*" >&2; exit 2; }
ip_of() { echo "$SUBNET.$((OFFSET + $1))"; }

our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+\$" || true
}

# "gone" also when only a zombie is left: PID 1 in this sandbox reaps orphans slowly
wait_gone() {
  local pid=$1 st
  for _ in $(seq 1 100); do
    st=$(ps -o stat= -p "$pid" 2>/dev/null || true)
    [[ -z $st || $st == Z* ]] && return 0
    sleep 0.05
  done
  return 1
}

up() {
  local n=${1:?usage: testhosts.sh up N}
  if ! [[ $n =~ ^[0-9]+$ ]] || (( n < 1 )); then die "N must be a positive integer"; fi
  [[ -n ${BASE:-} ]] || die "BASE is required"
  [[ -n ${PUBKEY:-} && -r $PUBKEY ]] || die "PUBKEY (readable public key file) is required"
  (( OFFSET + n <= 254 )) || die "too many hosts for $SUBNET.0/24 (OFFSET+N must be <= 254)"
  [[ -z $SHIMS || -d $SHIMS ]] || die "SHIMS=$SHIMS is not a folder"
  [[ $(id -u) == 0 ]] || { echo "testhosts: network namespaces not permitted: must run as root" >&2; exit 3; }
  local probe="${PREFIX}probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "testhosts: network namespaces not permitted here ('ip netns add' failed); use the loopback fallback" >&2
    exit 3
  fi
  ip netns del "$probe"
  if [[ -n $(our_namespaces) ]]; then  # another run's hosts: exit 4 so the caller leaves them alone
    echo "testhosts: namespaces ${PREFIX}* already exist (another test run?); run 'testhosts.sh down' first" >&2
    exit 4
  fi

  BASE=$(readlink -f "$BASE"); mkdir -p "$BASE"; chmod 755 "$BASE"
  [[ -z $SHIMS ]] || SHIMS=$(readlink -f "$SHIMS")
  mkdir -p /run/sshd && chmod 0755 /run/sshd     # root sshd refuses to start without it
  mkdir -p /var/lib/gpuprov /var/lib/gpuprov-shim "$VOLATILE" "$CTL_IN" "$SHIM_MNT" "$SITE_MNT"   # mount points
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  local hosts_tmp=$BASE/hosts.txt.tmp
  : > "$hosts_tmp"
  local i
  for i in $(seq 1 "$n"); do
    local ns=$PREFIX$i ip d
    ip=$(ip_of "$i"); d=$BASE/$ns
    mkdir -p "$d/ctl"; chmod 755 "$d"
    rm -f "$d/ctl/"*-request "$d/ctl/state" "$d/ctl/sshd.pid" "$d/ctl/supervisor.pid"
    ip netns add "$ns"
    ip link add "v$ns" type veth peer name eth0 netns "$ns"
    ip link set "v$ns" master "$BRIDGE" up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    [[ -f $d/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N '' -C "$ns" -f "$d/ssh_host_ed25519_key"
    install -m 644 "$PUBKEY" "$d/authorized_keys"   # sshd reads it as the target user
    printf '127.0.0.1 localhost\n%s %s\n' "$ip" "$ns" > "$d/hosts"
    echo "$ns" > "$d/hostname"
    local path=$STD_PATH setenv=""
    if [[ -n $SHIMS ]]; then
      path=$SHIM_MNT/bin:$STD_PATH
      setenv="SetEnv PATH=$path${HOST_ENV:+ $HOST_ENV}"
      sed -E "s#^(Defaults[[:space:]]+secure_path=\"?)#\\1$SHIM_MNT/bin:#" /etc/sudoers > "$d/sudoers"
      # SUDO_USERS log in as themselves and become root with `sudo -n`, as `ubuntu` does on EC2; the
      # session's HOST_ENV (the test sysroot) survives sudo's env_reset
      for u in ${SUDO_USERS:-}; do printf '%s ALL=(ALL) NOPASSWD: ALL\n' "$u" >> "$d/sudoers"; done
      if [[ -n ${HOST_ENV:-} ]]; then
        printf 'Defaults env_keep += "%s"\n' "$(for kv in $HOST_ENV; do printf '%s ' "${kv%%=*}"; done)" >> "$d/sudoers"
      fi
      visudo -cqf "$d/sudoers" || die "the per-host sudoers for $ns does not parse"
      chmod 440 "$d/sudoers"
    fi
    printf 'PATH=%s\nexport PATH\n' "$path" > "$d/profile"
    cat > "$d/sshd_config" <<CFG
Port 22
ListenAddress $ip
HostKey $d/ssh_host_ed25519_key
PidFile $d/sshd.pid
AuthorizedKeysFile $d/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxStartups 100:30:200
MaxSessions 50
Subsystem sftp internal-sftp
LogLevel VERBOSE
$setenv
CFG
    # ip netns exec and unshare exec, so $! is the supervisor's own PID
    BASE=$BASE SHIMS=$SHIMS SITE=$SITE PRIVATE=$PRIVATE REBOOT_DELAY=$REBOOT_DELAY \
      ip netns exec "$ns" unshare --uts --mount --propagation private \
      "$SELF" _host "$ns" "$d" </dev/null >"$d/supervisor.log" 2>&1 &
    echo $! > "$d/supervisor.pid"
    echo "$ns $ip $d/ssh_host_ed25519_key.pub" >> "$hosts_tmp"
  done
  mv "$hosts_tmp" "$BASE/hosts.txt"
  for i in $(seq 1 "$n"); do     # wait until every sshd accepts TCP (20 s at most)
    local ok=0
    for _ in $(seq 1 400); do
      if (exec 3<>"/dev/tcp/$(ip_of "$i")/22") 2>/dev/null; then ok=1; break; fi
      sleep 0.05
    done
    (( ok )) || die "host $PREFIX$i ($(ip_of "$i")) did not come up; see $BASE/$PREFIX$i/supervisor.log and sshd.log"
  done
}

down() {
  [[ -n ${BASE:-} ]] || die "BASE is required"
  local ns pid pids=() d
  for ns in $(our_namespaces); do
    d=$BASE/$ns
    if [[ -f $d/supervisor.pid ]]; then
      pid=$(cat "$d/supervisor.pid")
      kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    fi
  done
  for pid in "${pids[@]}"; do wait_gone "$pid" || kill -KILL "$pid" 2>/dev/null || true; done
  for ns in $(our_namespaces); do
    # anything still inside (started by us: supervisor, sshd, sessions), by PID
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true     # removes its veth pair too
    rm -f "$BASE/$ns/supervisor.pid" "$BASE/$ns/sshd.pid" "$BASE/$ns/ctl/supervisor.pid" "$BASE/$ns/ctl/sshd.pid"
  done
  for _ in $(seq 1 100); do ip -o link show type veth 2>/dev/null | grep -q " v${PREFIX}[0-9]*@" || break; sleep 0.05; done
  ip link del "$BRIDGE" 2>/dev/null || true
}

# ---- supervisor: runs inside the host's namespaces (netns + uts + private mount ns) ----
_host() {
  set +e
  local ns=$1 d=$2
  local ctl=$d/ctl stage=/run/gpuprov-testhosts-stage/$ns
  hostname "$ns"
  # keep $d reachable even if BASE lies under /tmp or /root, which get their own tmpfs below
  mkdir -p "$stage" && mount --bind "$d" "$stage" || exit 1
  if [[ -n $SHIMS ]]; then  # before /tmp gets its own tmpfs: the checkout itself may lie under /tmp
    mount --bind "$SHIMS" "$SHIM_MNT" && mount -o remount,bind,ro "$SHIM_MNT" || exit 1
  fi
  if [[ -n $SITE ]]; then  # the same: a virtualenv may lie under /tmp or /root
    mount --bind "$SITE" "$SITE_MNT" && mount -o remount,bind,ro "$SITE_MNT" || exit 1
  fi
  mount -t tmpfs -o mode=1777,size=256m tmpfs /tmp || exit 1
  mount -t tmpfs -o mode=700,size=64m tmpfs /root || exit 1
  mount -t tmpfs -o mode=755,size=256m tmpfs /var/lib/gpuprov || exit 1
  mount -t tmpfs -o mode=755,size=64m tmpfs /var/lib/gpuprov-shim || exit 1
  mount -t tmpfs -o mode=755,size=16m tmpfs "$VOLATILE" || exit 1
  for p in $PRIVATE; do
    mount -t tmpfs -o mode=755,size=256m tmpfs "$p" || exit 1
  done
  mkdir -p "$d" && mount --move "$stage" "$d" || exit 1
  rmdir "$stage" 2>/dev/null
  mount --bind "$ctl" "$CTL_IN" || exit 1
  mount --bind "$d/hosts" /etc/hosts || exit 1
  mount --bind "$d/hostname" /etc/hostname || exit 1
  if [[ -n $SHIMS ]]; then
    mount --bind "$d/sudoers" /etc/sudoers || exit 1
  fi
  cat /proc/sys/kernel/random/uuid > "$ctl/boot_id"
  mount --bind "$ctl/boot_id" /proc/sys/kernel/random/boot_id 2>/dev/null || echo "boot_id bind failed" >&2
  install -m 644 "$d/profile" /root/.profile
  echo $$ > "$ctl/supervisor.pid"
  mkfifo "$ctl/.tick" 2>/dev/null
  exec 3<>"$ctl/.tick"          # never written: `read -t` on it is a fork-free sleep
  rm -f "$ctl/.tick"

  local sshd_pid=0 boots=0 stopped=0
  start_sshd() {
    /usr/sbin/sshd -D -e -f "$d/sshd_config" </dev/null >>"$d/sshd.log" 2>&1 &
    sshd_pid=$!
    echo "$sshd_pid" > "$ctl/sshd.pid"
    echo "up $boots $sshd_pid" > "$ctl/state"
  }
  kill_all() {   # every process of this host except the supervisor: sshd, sessions, background jobs
    local p pid me=/proc/$$/ns/mnt killed=1 passes=0
    # sshd's listener first. A client whose session drops reconnects at once (gpuprov after a reboot step, every
    # 0.25 s); while the scan below was still going (slow on a loaded machine; /proc in name order, not pid
    # order), the listener accepted it and forked a session the scan had already passed, which outlived the
    # "reboot" and saw its emptied /run and new boot id before the new sshd was up
    if (( sshd_pid )); then kill -KILL "$sshd_pid" 2>/dev/null; wait "$sshd_pid" 2>/dev/null; fi
    while (( killed && passes < 50 )); do   # again until a scan finds none left: a session may fork meanwhile
      killed=0; passes=$((passes + 1))
      for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [[ $pid == "$$" ]] && continue
        [[ $p/ns/mnt -ef $me ]] && kill -KILL "$pid" 2>/dev/null && killed=1
      done
    done
    sshd_pid=0
    rm -f "$ctl/sshd.pid"
  }
  trap 'kill_all; echo stopped > "$ctl/state"; exit 0' TERM INT

  boots=1; echo "$boots" > "$ctl/boots"
  start_sshd
  while :; do
    if [[ -e $ctl/reboot-request ]]; then
      rm -f "$ctl/reboot-request"
      echo rebooting > "$ctl/state"
      kill_all
      find "$VOLATILE" -mindepth 1 -delete
      cat /proc/sys/kernel/random/uuid > "$ctl/boot_id.new"
      cat "$ctl/boot_id.new" > "$ctl/boot_id"; rm -f "$ctl/boot_id.new"   # same inode: the bind stays valid
      read -r -t "$REBOOT_DELAY" -u 3 _
      boots=$((boots + 1)); echo "$boots" > "$ctl/boots"
      stopped=0
      start_sshd
    elif [[ -e $ctl/stop-request ]]; then
      rm -f "$ctl/stop-request"
      kill_all
      stopped=1
      echo stopped > "$ctl/state"
    elif [[ -e $ctl/restart-request ]]; then
      rm -f "$ctl/restart-request"
      if (( sshd_pid )); then kill -TERM "$sshd_pid" 2>/dev/null; wait "$sshd_pid" 2>/dev/null; fi
      stopped=0
      start_sshd
    elif (( ! stopped )) && ! kill -0 "$sshd_pid" 2>/dev/null; then
      echo "sshd exited; restarting" >&2
      wait "$sshd_pid" 2>/dev/null
      read -r -t 0.5 -u 3 _
      start_sshd
    fi
    read -r -t 0.1 -u 3 _
  done
}

case ${1:-} in
  up) up "${2:-}" ;;
  down) down ;;
  _host) shift; _host "$@" ;;
  *) echo "usage: testhosts.sh up N | down   (env: BASE, PUBKEY, OFFSET, BRIDGE, PREFIX, SHIMS)" >&2; exit 2 ;;
esac
