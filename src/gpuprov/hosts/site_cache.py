"""`bootstrap --cache-host HOST`: run the site's caching proxy (apt-cacher-ng, plan/site_cache.py) on one host of
the site for the length of a bootstrap, over SSH, and take it away after.

`start` installs apt-cacher-ng there if it is missing (with the host's apt or dnf, remembered so that `stop` removes
it again), writes its configuration under FOLDER, and starts an instance of gpuprov's own on its own port, apart
from any apt-cacher-ng the host runs as a service. `stop` ends that instance and removes the folder with its cache,
and the package when `start` installed it; with `keep`, the instance and its cache stay for the next bootstrap
(a later `start` replaces the instance and keeps the cache).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuprov.errors import GpuprovError
from gpuprov.plan.site_cache import SiteCache

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings, Remote
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.sources import Effective, Sources

FOLDER = "/var/lib/gpuprov/site-cache"

_START = r"""set -eu
d={folder}
if [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then kill -KILL "$(cat "$d/pid")"; sleep 0.2; fi
mkdir -p "$d/conf" "$d/cache" "$d/log"
# a kept cache (--keep-cache) keeps its packages; its index files and pages are fetched anew
find "$d/cache" -type f | grep -Ev '(\.deb|\.rpm|\.whl|/Miniforge3-[^/]*\.sh)(\.head)?$' | tr '\n' '\0' | xargs -0r rm -f
if ! command -v apt-cacher-ng >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    # the package's own service is not wanted: gpuprov runs its own instance
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d.gpuprov && chmod +x /usr/sbin/policy-rc.d.gpuprov
    [ -e /usr/sbin/policy-rc.d ] || ln -s policy-rc.d.gpuprov /usr/sbin/policy-rc.d
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q apt-cacher-ng >"$d/log/install" 2>&1 || rc=$?
    [ "$(readlink /usr/sbin/policy-rc.d 2>/dev/null)" = policy-rc.d.gpuprov ] && rm -f /usr/sbin/policy-rc.d
    rm -f /usr/sbin/policy-rc.d.gpuprov
    [ "${{rc:-0}}" = 0 ] || {{ tail -3 "$d/log/install" >&2; exit 3; }}
    echo apt > "$d/installed"
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y -q apt-cacher-ng >"$d/log/install" 2>&1 || {{ tail -3 "$d/log/install" >&2; exit 3; }}
    echo dnf > "$d/installed"
  else
    echo "no apt-cacher-ng, and no apt-get or dnf to install it with" >&2; exit 3
  fi
fi
printf '%s' {conf} > "$d/conf/acng.conf"
setsid apt-cacher-ng -c "$d/conf" ForeGround=1 Port={port} CacheDir="$d/cache" LogDir="$d/log" \
  SocketPath="$d/socket" </dev/null >"$d/log/out" 2>&1 &
echo $! > "$d/pid"
for _ in $(seq 100); do
  if (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; then echo started; exit 0; fi
  kill -0 "$(cat "$d/pid")" 2>/dev/null || break
  sleep 0.1
done
tail -3 "$d/log/out" >&2; exit 4
"""

_STOP = r"""d={folder}
# apt-cacher-ng does not always end on SIGTERM while a transfer is open: KILL after 5 s
if [ -f "$d/pid" ] && pid=$(cat "$d/pid") && kill "$pid" 2>/dev/null; then
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
fi
case "$(cat "$d/installed" 2>/dev/null)" in
  apt) DEBIAN_FRONTEND=noninteractive apt-get purge -y -q apt-cacher-ng >/dev/null 2>&1 ;;
  dnf) dnf remove -y -q apt-cacher-ng >/dev/null 2>&1 ;;
esac
rm -rf "$d"
rmdir /var/lib/gpuprov 2>/dev/null
echo stopped
"""


class CacheFailed(GpuprovError):
    """The site's cache could not be started on its host."""


@dataclass
class Running:
    """The proxy started on `target`, as the hosts reach it."""

    target: Target
    cache: SiteCache
    remote: Remote
    layer: tuple[Sources, str]  # the map's layer that sends every key through it


def start(target: Target, settings: HostSettings, sources: Effective, port: int) -> Running:
    """The proxy on `target`, configured for `sources`; its address is the one SSH reached the host at."""
    from gpuprov.hosts.remote import HostUnreachable, Remote

    remote = Remote(target, settings)
    try:
        remote.open()
    except HostUnreachable as exc:
        raise CacheFailed(f"--cache-host {target.name}: {exc}") from None
    cache = SiteCache(str(remote.conn.host), port, where="--cache-host")
    script = _START.format(folder=FOLDER, port=port, conf=shlex.quote(cache.config(sources)))
    try:
        result = remote.run(f"bash -c {shlex.quote(script)}", sudo=True, timeout=600)
    except BaseException:
        remote.close()
        raise
    if not result.ok:
        remote.close()
        said = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
        raise CacheFailed(f"--cache-host {target.name}: apt-cacher-ng did not start (exit {result.exited}): "
                          f"{said[-1][:300]}")
    return Running(target, cache, remote, cache.layer(sources))


def stop(running: Running, keep: bool = False) -> str | None:
    """End the proxy and remove what `start` put there, unless `keep`. Never raises for the host: the bootstrap's
    own outcome stands; what went wrong is returned, for the caller to say (the connection held since `start` is
    tried, then a new one)."""
    from gpuprov.hosts.remote import Remote

    command = f"bash -c {shlex.quote(_STOP.format(folder=FOLDER))}"
    problem = None
    try:
        if not keep:
            for remote in (running.remote, None):
                try:
                    if remote is None:
                        remote = Remote(running.target, running.remote.settings)
                        remote.open()
                    result = remote.run(command, sudo=True, timeout=120)
                    if result.ok:
                        return None
                    problem = (result.stderr or result.stdout).strip()[-300:] or f"exit {result.exited}"
                    break  # it answered: another connection would not do better
                except GpuprovError as exc:
                    problem = str(exc)
                finally:
                    if remote is not running.remote and remote is not None:
                        remote.close()
    finally:
        running.remote.close()
    return problem and (f"the cache on {running.target.name} was not removed: {problem}; remove it with "
                        f"`gpuprov exec {running.target.name} --sudo -- sh -c 'pkill -F {FOLDER}/pid; "
                        f"rm -rf {FOLDER}'`")
