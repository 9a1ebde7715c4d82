"""A stand-in of ECS's instance metadata service (100.100.100.200) for one instance, on a loopback port in a thread.

What it serves, as Alibaba documents it ("Detect and respond to spot instance interruption events",
alibabacloud.com/help/ja/ecs/user-guide/best-practices-for-preemptible-instances, updated 2026-04-02, read 2026-12-04):
  - PUT /latest/api/token with X-aliyun-ecs-metadata-token-ttl-seconds answers a token; a GET carrying it as
    X-aliyun-ecs-metadata-token is answered, one without it refused 401, as in the metadata's hardened mode (the TTL's
    range, 1 to 21600 s, is assumed to be IMDSv2's: unverified);
  - /latest/meta-data/instance/spot/termination-time answers 404 while no reclaim is scheduled, then the UTC time of
    the reclaim, 2015-01-05T18:02:00Z;
  - /latest/meta-data/instance/instance-type answers the instance's type (ecs.gn7i-c8g1.2xlarge); instance-id and
    region-id the instance's id and region;
  - /latest/meta-data/ram/security-credentials/ names the instance's RAM role (404 without one), and
    .../security-credentials/ROLE answers its STS credentials as JSON {AccessKeyId, AccessKeySecret, SecurityToken,
    Expiration, LastUpdated, Code: "Success"} ("Obtain a temporary authorization token", help.aliyun.com/zh/ecs/
    user-guide/obtain-a-temporary-authorization-token, read 2026-12-04: the token's TTL 1 to 21600 s, the answer's
    fields; the `Code` field is the credentials libraries' reading, unverified there).
`reclaim(at)` schedules the reclaim, as ECS does five minutes before it releases a spot instance; `attach_role` gives
the instance a RAM role with its credentials.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "ecs-token-1"
PREFIX = "/latest/meta-data/"


class EcsMetadata:
    def __init__(self, host: str = "127.0.0.1", instance_type: str = "ecs.gn7i-c8g1.2xlarge") -> None:
        self.instance_type = instance_type
        self.instance_id = "i-bp1imitation0001"
        self.region_id = "cn-hangzhou"
        self.role: str | None = None
        self.credentials: dict[str, str] = {}
        self.termination_time: str | None = None
        self.puts = 0
        self.gets: list[tuple[str, int]] = []  # (path, status) of each GET
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: str = "") -> None:
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self) -> None:
                ttl = self.headers.get("X-aliyun-ecs-metadata-token-ttl-seconds") or ""
                if self.path != "/latest/api/token" or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._send(400, "bad token request")
                meta.puts += 1
                self._send(200, TOKEN)

            def do_GET(self) -> None:
                path = self.path.removeprefix(PREFIX)
                answers = {"instance/instance-type": meta.instance_type,
                           "instance/spot/termination-time": meta.termination_time,
                           "instance-id": meta.instance_id, "region-id": meta.region_id,
                           "ram/security-credentials/": meta.role}
                if meta.role is not None:
                    answers[f"ram/security-credentials/{meta.role}"] = json.dumps(meta.credentials)
                if self.headers.get("X-aliyun-ecs-metadata-token") != TOKEN:
                    code, body = 401, ""
                elif answers.get(path) is None:
                    code, body = 404, "Not Found"
                else:
                    code, body = 200, str(answers[path])
                meta.gets.append((path, code))
                self._send(code, body)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def reclaim(self, at: str) -> None:
        """ECS has scheduled the reclaim at `at` (UTC, ...Z): the notice the node reads."""
        self.termination_time = at

    def attach_role(self, role: str, key_id: str, secret: str, token: str) -> None:
        """The instance has the RAM role `role`: its STS credentials are these."""
        self.role = role
        self.credentials = {"AccessKeyId": key_id, "AccessKeySecret": secret, "SecurityToken": token,
                            "Expiration": "2026-12-04T12:00:00Z", "LastUpdated": "2026-12-04T06:00:00Z",
                            "Code": "Success"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
