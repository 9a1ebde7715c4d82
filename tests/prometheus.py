"""A real Prometheus (Debian's `prometheus` package, tools/sysdeps.sh) for the metrics tests: started on
127.0.0.1 with a file_sd scrape job reading the list `gpuprov metrics serve --file-sd` writes, queried over its
HTTP API (/api/v1/query)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import skip_or_fail

BINARY = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def need(tool: str = BINARY) -> str:
    if not Path(tool).is_file():
        found = shutil.which(Path(tool).name)
        if found:
            return found
        skip_or_fail(f"needs {Path(tool).name} (the prometheus package; tools/sysdeps.sh installs it as root)")
    return tool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """`with Prometheus(tmp, file_sd) as prom: prom.wait_for('DCGM_FI_DEV_GPU_UTIL', lambda r: ...)`."""

    def __init__(self, folder: Path, file_sd: Path) -> None:
        self.folder, self.file_sd = folder, file_sd
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        binary = need()
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: gpuprov\n"
            f"    file_sd_configs:\n      - files: ['{self.file_sd}']\n        refresh_interval: 1s\n")
        self.log = (self.folder / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={self.folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"prometheus did not start: {(self.folder / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            data = json.loads(r.read())
        assert data["status"] == "success", data
        return list(data["data"]["result"])

    def wait_for(self, expr: str, ok: Any, timeout: float = 60) -> list[dict[str, Any]]:
        """The query's result once `ok(result)` holds (Prometheus scrapes every second); fails with the last one."""
        end = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < end:
            result = self.query(expr)
            if ok(result):
                return result
            time.sleep(0.5)
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/targets", timeout=10).read())
        raise AssertionError(f"{expr}: {result}\ntargets: {json.dumps(targets['data']['activeTargets'], indent=1)[:3000]}")


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics`: Prometheus' own lint of the text exposition format."""
    return subprocess.run([need(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
