"""The user's machine is never "a bug": a HOME or GPUPROV_HOME this user cannot read or write, standard output on a
full disk, an endpoint that is not AWS. Each is one `error: <where>: …` line naming what to fix, exit 2, no
traceback and no "gpuprov hit a bug"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import forkcli


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUPROV_", "XDG_"))}
    env.update({"HOME": str(tmp_path / "user"), "GPUPROV_HOME": str(tmp_path / "state"), "NO_COLOR": "1",
                "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"), "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-creds")})
    env.update(extra)
    return {k: v for k, v in env.items() if v}


def _as_a_user(words: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`gpuprov WORDS` subject to file permissions as any user is: root reads every folder, so as root it runs
    without the capabilities that let it (setpriv, util-linux). A fresh interpreter: the fork server's children
    keep the server's."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("as root, setpriv is needed to run without the capabilities that read any folder")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
    return subprocess.run([*prefix, sys.executable, "-m", "gpuprov", *words], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=60)


def _one_line(result: subprocess.CompletedProcess[str], field: str, words: str) -> None:
    err = result.stderr
    assert result.returncode == 2, err
    assert "Traceback" not in err and "hit a bug" not in err, err
    errors = [x for x in err.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {field}: "), err
    assert words in errors[0], err


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody but root may enter."""
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0)
    yield folder
    folder.chmod(0o700)


def test_a_home_this_user_cannot_read_is_named_even_by_plan_and_config(tmp_path: Path, locked: Path) -> None:
    for words in (["plan", "--gpu", "L4"], ["config"]):
        _one_line(_as_a_user(words, _env(tmp_path, HOME=str(locked))), "HOME", f"{locked} cannot be read")
    # with the config file elsewhere, the first read under HOME is another file (AWS's ~/.aws/config)
    config = tmp_path / "config.toml"
    config.write_text('gpu = "L4"\n')
    result = _as_a_user(["plan"], _env(tmp_path, HOME=str(locked), GPUPROV_CONFIG=str(config), AWS_CONFIG_FILE=""))
    _one_line(result, "HOME", f"{locked} cannot be read (Permission denied: {locked}/")


def test_a_gpuprov_home_this_user_cannot_write_is_named(tmp_path: Path, locked: Path) -> None:
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o500)
    _one_line(_as_a_user(["bootstrap", "ubuntu@192.0.2.1"], _env(tmp_path, GPUPROV_HOME=str(read_only))),
              "GPUPROV_HOME", f"{read_only} is not writable by this user")
    _one_line(_as_a_user(["status"], _env(tmp_path, GPUPROV_HOME=str(locked / "state"))),
              "GPUPROV_HOME", f"cannot create {locked}/state: Permission denied")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("words", [["status"], ["gpus"]], ids=["short", "long"])
def test_stdout_on_a_full_disk_is_said_as_such(tmp_path: Path, words: list[str]) -> None:
    """`> /dev/full`: a short output fails only at the exit's flush, a long one in the middle of the table."""
    with open("/dev/full", "w") as full:
        result = forkcli.run([sys.executable, "-m", "gpuprov", *words], stdout=full, stderr=subprocess.PIPE,
                             text=True, env=_env(tmp_path), stdin=subprocess.DEVNULL, timeout=60)
    _one_line(result, "stdout", "No space left on device")


@pytest.fixture
def web_page() -> Iterator[str]:
    """A web server that is not AWS, answering every request with a well-formed HTML page (status 200): botocore
    parses it as XML, to an answer with nothing in it."""
    from tests.webpage import serving

    with serving(b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head><body>It works</body></html>") as url:
        yield url


NO_SSH = ("--ssh-cidr", "198.51.100.7/32", "--yes", "--no-bootstrap", "--no-wait")


def _said(result: Any, field: str, words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "hit a bug" not in result.output, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith(f"error: {field}: ") and words in line, result.stderr


def test_an_endpoint_that_answers_with_a_web_page_is_named(gp_home: Path, web_page: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from gpuprov.cli import main
    from gpuprov.state import open_store

    for key, value in _env(gp_home.parent, GPUPROV_HOME=str(gp_home), AWS_ENDPOINT_URL=web_page,
                           AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y", AWS_MAX_ATTEMPTS="1",
                           AWS_REGION="us-east-1", GPUPROV_FACTS_DIR=str(gp_home / "facts")).items():
        monkeypatch.setenv(key, value)
    store = open_store()  # a node for `status --refresh` to ask EC2 about
    store.create_node("n1", "aws", "us-east-1", zone="us-east-1a", gpu="T4", gpu_count=1, instance_type="g4dn.xlarge",
                      market="on-demand", state="ready", address="203.0.113.9", ssh_user="ubuntu")
    store.add_resource("n1", "instance", "us-east-1", "i-0123456789abcdef0")
    for words in (["gpus", "--live"], ["status", "--refresh"], ["up", "n2", "--gpu", "T4", *NO_SSH]):
        result = CliRunner().invoke(main, words, prog_name="gpuprov")
        _said(result, "AWS_ENDPOINT_URL", f"{web_page} did not answer Describe")
        assert "as AWS does (an HTML page)" in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) <= 3, result.stderr  # region, the line, its hint


def test_a_team_bucket_behind_an_endpoint_that_answers_with_a_web_page_is_named(
        gp_home: Path, web_page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The team bucket's client refuses an HTML page as EC2's does: `status` of team state names the variable."""
    from click.testing import CliRunner

    from gpuprov.cli import main

    for key, value in _env(gp_home.parent, GPUPROV_HOME=str(gp_home), AWS_ENDPOINT_URL=web_page,
                           AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y", AWS_MAX_ATTEMPTS="1",
                           AWS_REGION="us-east-1", GPUPROV_STATE="s3://team-bucket/gp").items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(main, ["status"], prog_name="gpuprov")
    _said(result, "AWS_ENDPOINT_URL", f"{web_page} did not answer S3 for s3://team-bucket/gp")
    assert "as AWS does (an HTML page)" in result.stderr, result.stderr


def test_up_without_credentials_offline_says_the_credentials(fake_cloud: Any, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """No credentials, and no internet (a proxy that is not there: the public address cannot be learnt): the
    credentials are what to fix first, whether EC2's instance types are read now or were kept today."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    words = ("up", "n1", "--gpu", "T4", "--yes", "--no-bootstrap", "--no-wait")
    _said(fake_cloud.gp(*words), "AWS credentials", "none found")  # the instance types kept today
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(tmp_path / "no-facts-yet"))
    result = fake_cloud.gp(*words)
    _said(result, "AWS credentials", "none found")
    assert "--ssh-cidr" not in result.stderr and "instance types from the catalog" not in result.stderr


def _at_the_prompt(tmp_path: Path, then: Any) -> tuple[int | None, str]:
    """`up` on a terminal (a pty) up to its `Launch …? [y/N]` prompt, then `then(process, leader)`; its exit code
    (None: still running 10 s later, killed) and all it printed. EC2 is an endpoint that refuses connections: the
    plan falls back to the shipped catalog, and nothing is launched."""
    import pty
    import select
    import time

    env = _env(tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:9", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y",
               AWS_MAX_ATTEMPTS="1", AWS_REGION="us-east-1")
    leader, follower = pty.openpty()
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "up", "n1", "--gpu", "T4", *NO_SSH[:2], "--no-bootstrap",
                          "--no-wait"], stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out, deadline, acted, closed = b"", time.monotonic() + 30, False, False
    try:
        while time.monotonic() < deadline:
            if not acted and b"[y/N]" in out:
                acted, deadline = True, time.monotonic() + 10
                closed = then(proc, leader)  # True: it closed the terminal
                if closed:
                    break
            if not select.select([leader], [], [], 0.2)[0]:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process and its terminal are gone
                break
            if not chunk:
                break
            out += chunk
        try:
            code: int | None = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    finally:
        if not closed:
            os.close(leader)
    return code, out.decode(errors="replace")


def test_each_signal_at_the_prompt_says_its_name_and_code_and_never_hangs(tmp_path: Path) -> None:
    """SIGINT, SIGTERM and SIGHUP at `Launch …? [y/N]`, each a few times and at a few instants after the prompt is
    shown (a signal landing just before the read waited for a key): 130, 143, 129, and the line naming it."""
    import signal
    import time

    for sig, name in ((signal.SIGINT, "SIGINT (Ctrl-C)"), (signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")):
        for delay in (0.0, 0.02):
            def send(proc: Any, _leader: int, sig: int = sig, delay: float = delay) -> bool:
                time.sleep(delay)
                proc.send_signal(sig)
                return False

            code, out = _at_the_prompt(tmp_path, send)
            assert code == 128 + sig, (name, delay, out)
            assert out.rstrip().splitlines()[-1] == f"error: interrupted by {name}", (name, delay, out)


def test_a_terminal_that_hangs_up_at_the_prompt_ends_as_sighup(tmp_path: Path) -> None:
    """The terminal closes under the prompt (its reads end, its writes fail): 129 as for its SIGHUP, whichever
    comes first, not a "no" (exit 1), a bug or a death by the signal's default action."""
    def hang_up(_proc: Any, leader: int) -> bool:
        os.close(leader)
        return True

    code, _ = _at_the_prompt(tmp_path, hang_up)
    assert code == 129


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_an_interrupted_bootstrap_ends_with_the_command_that_finishes_it(gp_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         as_json: bool) -> None:
    """SIGTERM (its Interrupted, raised where the signal lands) while the hosts' steps run: the last line says the
    steps done are kept and which command resumes the rest."""
    import signal

    from click.testing import CliRunner

    from gpuprov.cli import main
    from gpuprov.errors import Interrupted
    from gpuprov.hosts import bootstrap as engine

    def stopped(*_args: Any, **_kwargs: Any) -> None:
        raise Interrupted(signal.SIGTERM, "SIGTERM")

    monkeypatch.setattr(engine, "bootstrap", stopped)
    words = ["bootstrap", "ubuntu@192.0.2.7", "root@192.0.2.8:2222", "--gpu", "T4", *(["--json"] if as_json else [])]
    result = CliRunner().invoke(main, words, prog_name="gpuprov")
    assert result.exit_code == 143, result.output
    assert result.stderr.rstrip().splitlines()[-1] == (
        "error: interrupted by SIGTERM: the bootstrap of 192.0.2.7, 192.0.2.8:2222 stopped where it was; "
        "the steps done are kept: run `gpuprov bootstrap ubuntu@192.0.2.7 root@192.0.2.8:2222` again, with the "
        "same options, to finish"), result.stderr
