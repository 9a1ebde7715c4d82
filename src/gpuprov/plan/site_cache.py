"""One download per site: a caching proxy (apt-cacher-ng) that every host of a bootstrap reads through, so each
large artifact crosses the site's uplink once. Pure: what the proxy is told, and the sources map the hosts get.

The proxy is apt-cacher-ng, not squid: the hosts ask it in plain HTTP for a path under its own address, and it
fetches from the upstream over HTTPS itself, checking the upstream's certificate against its own CA store. Squid
sees only a CONNECT tunnel for an HTTPS URL and caches nothing of it unless it intercepts TLS, which means a CA of
ours on every host. apt-cacher-ng keeps apt's and dnf's repository files by its own patterns; it is told to keep
wheels too (PATTERNS).

Each key of the map is mounted on the proxy at its URL's own path (`Remap-gp_torch: /whl ; https://
download.pytorch.org/whl`): the PyTorch index links its wheels by absolute path (`/whl/cu128/torch-…`), which then
resolves on the proxy to the same mount. A key whose path is empty, or one inside another key's mount, is mounted
at `/gpuprov-<key>` with its path under that. The map the hosts get (`layer`) names every key on the proxy, so the
steps treat the proxy as a mirror: the origins' signing keys and the indexes' sha256s are checked as for any mirror
(plan/sources.py), and nothing the proxy serves can change what is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from gpuprov.plan.sources import KEYS, OS_KEYS, Effective, Sources

PORT = 3142  # apt-cacher-ng's own
# kept as packages are (never fetched again once whole): wheels, and the pinned releases (Miniforge's installer,
# uv's archive, the AWS CLI's)
KEEP = r"(\.whl|Miniforge3-[^/]*\.sh|uv-[^/]*\.tar\.gz|awscli-exe-[^/]*\.zip)$"
# fetched again when stale, as apt's index files are: simple-index pages, repo files, keys
FRESH = r"(/|\.sh|\.repo|\.list|/gpgkey|\.pub|\.gpg)$"
# keys whose URL is one file: mounted at its folder (none now: uv is a release folder, no longer a script)
FILE_KEYS: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mount:
    key: str
    path: str  # on the proxy: /whl
    backend: str  # what it stands for: https://download.pytorch.org/whl
    url: str  # the key's URL through the proxy


@dataclass(frozen=True)
class SiteCache:
    """The proxy as the hosts reach it: `address` (a name or IP they resolve) and `port`."""

    address: str
    port: int = PORT
    where: str = "--cache-host"

    @property
    def base(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def mounts(self, sources: Effective) -> tuple[Mount, ...]:
        """Where each key of `sources` sits on the proxy."""
        out: list[Mount] = []
        taken: list[str] = []
        for key in KEYS:
            # the OS's own archive goes through the proxy only when the map sets it: its rewrite of the host's own
            # source files outlives the proxy
            if key in OS_KEYS and key not in sources.mirrored:
                continue
            url = sources.urls[key]
            parts = urlsplit(url)
            origin_base = f"{parts.scheme}://{parts.netloc}"
            path, leaf = parts.path.rstrip("/"), ""
            if key in FILE_KEYS and "/" in path:
                path, leaf = path.rsplit("/", 1)
                leaf = "/" + leaf
            mount = path
            if not mount or any(_within(mount, t) or _within(t, mount) for t in taken):
                mount = f"/gpuprov-{key}{path}"
            taken.append(mount)
            out.append(Mount(key, mount, origin_base + path, self.base + mount + leaf))
        return tuple(out)

    def config(self, sources: Effective) -> str:
        """apt-cacher-ng's configuration file for `sources`: a Remap per key, the patterns for wheels and pages."""
        lines = ["# written by gpuprov for one bootstrap (plan/site_cache.py)"]
        lines += [f"Remap-gp_{m.key}: {m.path} ; {m.backend}" for m in self.mounts(sources)]
        lines += [f"PfilePatternEx: {KEEP}", f"VfilePatternEx: {FRESH}",
                  # within one bootstrap every file is fetched once, index files too (start() drops them from a
                  # kept cache): apt-cacher-ng checks an index file upstream on each request, and hosts asking for
                  # the same one in the same second then got 503s and cut transfers while it replaced the file
                  "SPfilePatternEx: .*"]
        return "\n".join(lines) + "\n"

    def layer(self, sources: Effective) -> tuple[Sources, str]:
        """The map's layer that sends every key through the proxy, with where it was set."""
        urls = {m.key: m.url for m in self.mounts(sources)}
        return Sources.model_validate(urls), f"{self.where} {self.address}"


def _within(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount + "/")


def effective_for(playbook_name: str, flag: tuple[Sources, str] | None) -> Effective:
    """The map a bootstrap of `playbook_name` uses without the proxy (--sources over the playbook's over the
    config's): what the proxy fetches from."""
    from gpuprov.paths import config_path
    from gpuprov.plan import config, sources
    from gpuprov.plan.spec import load_playbook

    book = load_playbook(playbook_name)
    return sources.effective((config.load().sources, f"{config_path()}: [sources]"),
                             (book.sources, book.where("sources") or f"playbook {book.name}: sources"),
                             flag or (None, ""))
