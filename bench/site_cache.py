"""One download per site (issue 39 §3): bytes fetched from upstream, and wall time, for 1, 8 and 32 hosts each
fetching one node's downloads, straight from upstream and through the site's proxy, in one run.

    sudo .venv/bin/python bench/site_cache.py [--sizes 1,8,32] [--uplink-mbit 800] [--mib 128] [--repeats]

  upstream  an HTTPS server in the root namespace (a CA of the bench's own, which the proxy is given, not the hosts
            through it) serving an imitation of the sources' layouts: NVIDIA's apt repository (InRelease,
            Packages.gz, .debs), the PyTorch wheel index's simple page of one variant, linking its wheels by absolute
            path as download.pytorch.org does, a PyPI simple page and the uv installer. It counts every byte it
            sends, and shares one token bucket among all its connections: the site's uplink (--uplink-mbit).
  hosts     light clients, one network namespace each on a bridge (prefix gp<NET>sc, subnet 10.240.<NET>), each
            running one shell script of curl fetches in the order a node's steps make them (the apt repository's
            index files and packages, the uv installer, the index page, every wheel it links), checking each file's
            sha256. Not sshd hosts running bootstraps: what is measured is the downloads, and 32 curl clients load
            the 2-core machine far less than 32 bootstraps would; the byte counts are the same either way (each
            host asks for each file once), the wall times are the downloads' alone. Direct, a host trusts the
            upstream's CA as a host trusts the public ones; through the proxy it speaks plain http to the proxy.
  proxy     apt-cacher-ng as `bootstrap --cache-host` runs it: the configuration plan/site_cache.py writes for the
            sources map pointing at the upstream, its own cache folder emptied before each run (a fleet's first
            bootstrap), bound to the bridge; the hosts get the map's layer through it (plain http).

Every host starts at once; a run ends when the last host has its files. Needs root and apt-cacher-ng (without them
it says so and exits 0).
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.testnet import NET  # noqa: E402

from gpuprov.plan import sources  # noqa: E402
from gpuprov.plan.site_cache import SiteCache  # noqa: E402

PREFIX = f"gp{NET}sc"
BRIDGE = f"gpscbr{NET}"
SUBNET = f"10.240.{NET}"
GATEWAY = f"{SUBNET}.1"
UPSTREAM_PORT = 8443
PROXY_PORT = 3142
CHUNK = 16 << 10
BURST = 128 << 10  # what the uplink lets through at once: a TCP window's worth


# --- the upstream ---------------------------------------------------------------------------------------------


class Bucket:
    """One token bucket for every connection: the site's uplink."""

    def __init__(self, bytes_per_second: float) -> None:
        self.rate, self.tokens, self.last = bytes_per_second, 0.0, time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(BURST, self.tokens + (now - self.last) * self.rate)
                self.last = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                wait = (n - self.tokens) / self.rate
            time.sleep(wait)


class Upstream:
    """The imitation sources over HTTPS, counting what they send."""

    def __init__(self, site: Path, bucket: Bucket, cert: Path, key: Path) -> None:
        self.sent = 0
        self.requests = self.cut = 0
        self.paths: dict[str, int] = {}
        self.lock = threading.Lock()
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path = site / unquote(self.path.split("?")[0]).lstrip("/")
                if self.path.endswith("/"):
                    path = path / "index.html"
                if not path.is_file():
                    self.send_error(404)
                    return
                modified = int(path.stat().st_mtime)
                since = self.headers.get("If-Modified-Since")
                with upstream.lock:
                    upstream.paths[self.path] = upstream.paths.get(self.path, 0) + 1
                if since and parsedate_to_datetime(since).timestamp() >= modified:  # as a CDN answers a proxy
                    self.send_response(304)
                    self.end_headers()
                    return
                size = path.stat().st_size
                # a range asked under If-Range of the date it has (apt-cacher-ng's freshness check): 416 past the
                # end means unchanged, as a CDN answers
                wanted = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                if wanted and self.headers.get("If-Range") == self.date_time_string(modified):
                    start = int(wanted.group(1))
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                else:
                    start = 0
                    self.send_response(200)
                self.send_header("Content-Length", str(size - start))
                if path.name == "index.html":  # a simple-index page, as pip needs it said
                    self.send_header("Content-Type", "text/html")
                self.send_header("Last-Modified", self.date_time_string(modified))
                self.end_headers()
                with path.open("rb") as body:
                    body.seek(start)
                    while chunk := body.read(CHUNK):
                        bucket.take(len(chunk))
                        self.wfile.write(chunk)
                        with upstream.lock:
                            upstream.sent += len(chunk)
                with upstream.lock:
                    upstream.requests += 1

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                with upstream.lock:  # a transfer the proxy cut short: its bytes sent so far are counted
                    upstream.cut += 1

        self.server = Server(("0.0.0.0", UPSTREAM_PORT), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.sent = self.requests = self.cut = 0
            self.paths = {}


def build_site(site: Path, mib: int) -> dict[str, str]:
    """The imitation layouts, `mib` MiB of packages and wheels in all; {path: sha256} of every file a host fetches."""
    files: dict[str, bytes] = {}
    repo = "compute/cuda/repos/ubuntu2404/x86_64"
    debs = {"cuda-keyring_1.1-1_all.deb": 0.01, "nvidia-driver-580_580.95.05-0ubuntu1_amd64.deb": 0.2,
            "cuda-toolkit-12-8_12.8.1-1_amd64.deb": 0.3}
    wheels = {"torch-2.9.0%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl": 0.35,
              "nvidia_cudnn_cu12-9.10.2.21-py3-none-manylinux_2_27_x86_64.whl": 0.14}
    seed = hashlib.sha256(b"gpuprov site cache bench").digest()
    for name, share in {**debs, **wheels}.items():
        size = max(4096, int(mib * share * (1 << 20)))
        block = hashlib.sha256(seed + name.encode()).digest() * 2048  # 64 KiB, distinct per file
        data = (block * (size // len(block) + 1))[:size]
        folder = repo if name.endswith(".deb") else "whl/cu128"
        files[f"{folder}/{name.replace('%2B', '+')}"] = data
    files[f"{repo}/InRelease"] = b"Origin: NVIDIA (imitation)\n"
    files[f"{repo}/Packages.gz"] = b"\x1f\x8b" + os.urandom(200_000)
    links = "".join(f'<a href="/whl/cu128/{n}#sha256={hashlib.sha256(files["whl/cu128/" + n.replace("%2B", "+")]).hexdigest()}">'
                    f"{n.replace('%2B', '+')}</a><br/>\n" for n in wheels)
    files["whl/cu128/torch/index.html"] = f"<html><body>\n{links}</body></html>\n".encode()
    files["simple/jupyterlab/index.html"] = b"<html><body></body></html>\n"
    files["uv/install.sh"] = b"#!/bin/sh\necho uv\n"
    for path, data in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(data)
    return {p: hashlib.sha256(d).hexdigest() for p, d in files.items() if not p.endswith("index.html")}


# --- the hosts ------------------------------------------------------------------------------------------------


def host_script(urls: dict[str, str], sums: dict[str, str], cacert: Path | None) -> str:
    """One host's downloads, in a node's order, each file's sha256 checked; the torch page's links followed."""
    tls = f"--cacert {cacert}" if cacert else ""
    # retried as apt (Acquire::Retries) and pip (--retries) do: apt-cacher-ng answers 503 now and then to hosts
    # asking for one index file in the same second (the file is being replaced)
    lines = ["set -eu", 'out=$(mktemp -d)', "trap 'rm -rf \"$out\"' EXIT",
             f"curl='curl -sSf --retry 3 --retry-all-errors --retry-delay 1 {tls}'",
             "get() { $curl -o \"$out/f\" \"$1\" && echo \"$2  $out/f\" | sha256sum -c --quiet; }"]
    repo = "ubuntu2404/x86_64"
    for path, digest in sums.items():
        if path.startswith("compute/"):
            lines.append(f"get {urls['nvidia']}/{repo}/{path.rsplit('/', 1)[1]} {digest}")
    lines.append(f"get {urls['uv']} {sums['uv/install.sh']}")
    lines.append(f"$curl -o \"$out/page\" {urls['pypi']}/jupyterlab/")
    torch_origin = urls["torch"].split("/whl")[0]
    lines.append(f"$curl -o \"$out/page\" {urls['torch']}/cu128/torch/")
    lines.append("grep -o 'href=\"[^\"]*\"' \"$out/page\" | sed 's/href=\"//; s/\"$//' | while read -r link; do")
    lines.append(f"  get \"{torch_origin}${{link%%#*}}\" \"${{link##*sha256=}}\"")
    lines.append("done")
    return "\n".join(lines) + "\n"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def make_hosts(n: int) -> list[str]:
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    names = []
    for i in range(n):
        ns, veth = f"{PREFIX}{i}", f"gpsc{NET}v{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{10 + i}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        names.append(ns)
    return names


def remove_hosts(n: int) -> None:
    for i in range(n):
        subprocess.run(["ip", "netns", "del", f"{PREFIX}{i}"], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def fetch_all(hosts: list[str], script: Path) -> float:
    start = time.monotonic()
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, "bash", str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for ns in hosts]
    for p, ns in zip(procs, hosts, strict=True):
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"{ns}: the downloads failed: {out.decode(errors='replace')[-500:]}")
    return time.monotonic() - start


# --- the proxy ------------------------------------------------------------------------------------------------


class Proxy:
    def __init__(self, work: Path, upstream_map: sources.Effective, cacert: Path) -> None:
        self.work, self.cacert = work, cacert
        self.cache = SiteCache(GATEWAY, PROXY_PORT)
        (work / "conf").mkdir(parents=True)
        (work / "conf" / "acng.conf").write_text(self.cache.config(upstream_map))
        self.layer = self.cache.layer(upstream_map)[0]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        shutil.rmtree(self.work / "cache", ignore_errors=True)
        for d in ("cache", "log"):
            (self.work / d).mkdir(exist_ok=True)
        w = self.work
        self.proc = subprocess.Popen(
            ["apt-cacher-ng", "-c", str(w / "conf"), "ForeGround=1", f"Port={PROXY_PORT}", f"BindAddress={GATEWAY}",
             f"CacheDir={w / 'cache'}", f"LogDir={w / 'log'}", f"SocketPath={w / 'socket'}", f"PidFile={w / 'pid'}",
             f"CAfile={self.cacert}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/{GATEWAY}/{PROXY_PORT}"], capture_output=True).returncode == 0:
                return
            time.sleep(0.05)
        raise SystemExit("apt-cacher-ng did not start")

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def certificate(work: Path) -> tuple[Path, Path]:
    cert, key = work / "upstream.pem", work / "upstream.key"
    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
       "-subj", "/CN=upstream", "-addext", f"subjectAltName=IP:{GATEWAY},DNS:localhost")
    return cert, key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--uplink-mbit", type=float, default=800.0, help="the site's uplink, shared by all hosts")
    parser.add_argument("--mib", type=int, default=128, help="one host's downloads, MiB")
    parser.add_argument("--repeats", action="store_true", help="name each file the upstream sent more than once")
    args = parser.parse_args()
    if os.geteuid() != 0 or not shutil.which("apt-cacher-ng"):
        print("needs root and apt-cacher-ng (apt-get install apt-cacher-ng)")
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gpuprov-sitecache-"))
    remove_hosts(max(sizes))
    hosts = make_hosts(max(sizes))
    try:
        cert, key = certificate(work)
        site = work / "site"
        sums = build_site(site, args.mib)
        upstream = Upstream(site, Bucket(args.uplink_mbit * 1e6 / 8), cert, key)
        upstream_map, proxy_map = (sources.effective((sources.Sources(
            nvidia=f"{base}/compute/cuda/repos", pypi=f"{base}/simple", torch=f"{base}/whl",
            uv=f"{base}/uv/install.sh"), "bench")) for base in (f"https://{GATEWAY}:{UPSTREAM_PORT}",
                                                                f"https://localhost:{UPSTREAM_PORT}"))
        proxy = Proxy(work / "proxy", proxy_map, cert)
        direct = work / "direct.sh"
        direct.write_text(host_script(upstream_map.urls, sums, cert))
        through = work / "through.sh"
        through.write_text(host_script(proxy.layer.model_dump(), sums, None))
        one_host = sum(len((site / p).read_bytes()) for p in sums) / (1 << 20)
        print(f"one host's downloads: {one_host:.1f} MiB in {len(sums)} files; uplink {args.uplink_mbit:g} Mbit/s; "
              f"load average {os.getloadavg()[0]:.1f}")
        print("| hosts | way | upstream MiB | × one host's | upstream requests (cut short) | wall s |")
        print("| --- | --- | --- | --- | --- | --- |")
        for n in sizes:
            for way in ("direct", "cache"):
                upstream.reset()
                if way == "cache":
                    proxy.start()
                try:
                    wall = fetch_all(hosts[:n], through if way == "cache" else direct)
                finally:
                    proxy.stop()
                mib = upstream.sent / (1 << 20)
                if args.repeats:
                    print("fetched more than once:", {p: c for p, c in upstream.paths.items() if c > 1})
                print(f"| {n} | {way} | {mib:.1f} | {mib / one_host:.2f} | {upstream.requests} ({upstream.cut}) | {wall:.2f} |",
                      flush=True)
    finally:
        remove_hosts(max(sizes))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
