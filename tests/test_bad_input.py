"""What a newcomer types wrong, through the real CLI: exit 2, one `error: <field>: …` line (plus at most
a hint line), never a traceback, and fast. Each row is a command line as typed; `{d}` is a folder
holding the files made below."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import forkcli

BOMB = "\n".join(["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(9)]) + "\n"


def make_files(d: Path) -> None:
    (d / "binary.yml").write_bytes(bytes(range(256)) * 16)
    (d / "loop.yml").write_text("a: &a [*a]\n")
    (d / "bomb.yml").write_text(BOMB)
    (d / "huge.yml").write_text("name: huge\ndescription: '" + "x" * (2 << 20) + "'\n")
    (d / "deep.yml").write_text("name: " + "[" * 100_000 + "]" * 100_000 + "\n")
    (d / "utf16-bad.yml").write_bytes("name: x\nbogus: 1\n".encode("utf-16"))
    (d / "nul.yml").write_text("name: x\x00\n")
    (d / "afile").write_text("")
    (d / "full").mkdir()
    (d / "full" / "notes.txt").write_text("mine\n")
    (d / "dupes.yml").write_text("hosts:\n  - {host: 10.0.0.1, name: a}\n  - {host: 10.0.0.2, name: a}\n")
    (d / "same-host.yml").write_text("hosts:\n  - host: 10.0.0.1\n  - host: 10.0.0.1\n")
    (d / "inv-gpu.yml").write_text("hosts:\n  - {host: 10.0.0.1, gpu: rtx9999}\n")
    (d / "home-file").write_text("")
    (d / "corrupt").mkdir()
    (d / "corrupt" / "state.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 64)
    (d / "garbage").mkdir()
    (d / "garbage" / "state.sqlite").write_bytes(b"not a database at all\n" * 100)
    # values that come from elsewhere than the command line
    (d / "cfg-key.toml").write_text('parallel = 8\nkey = "/nonexistent/gpu.pem"\n')
    (d / "cfg-gpu.toml").write_text('gpu = "H1000"\n')
    (d / "cfg-region.toml").write_text('# mine\nregion = "mars-1"\n')
    (d / "cfg-parallel.toml").write_text('parallel = 8\n')
    (d / "pins.yml").write_text("name: pinned\npins:\n  driver: '550'\n")
    (d / "inv-key.yml").write_text("hosts:\n  - {host: 10.0.0.1, name: trainer-b, key: /nonexistent/key.pem}\n")
    (d / "inv-user.yml").write_text("hosts:\n  - {host: 10.0.0.1, user: 'root -oProxyCommand=id'}\n")
    (d / "inv-os.yml").write_text("hosts:\n  - {host: 10.0.0.1, os: windows-11}\n")
    (d / "inv-jump.yml").write_text("hosts:\n  - {host: 10.0.0.1, name: gpu-box, proxy_jump: no-such-bastion.invalid}\n")
    (d / "inv-jump-opt.yml").write_text("hosts:\n  - {host: 10.0.0.1, proxy_jump: '-oProxyCommand=id'}\n")


# (command line, the field the error names, words the message must contain)
CASES = [
    # playbooks and inventories that are not what they should be
    ("plan --gpu t4 -p {d}/binary.yml", "--playbook", "not text"),
    ("plan --gpu t4 -p {d}/loop.yml", "--playbook", "loop"),
    ("plan --gpu t4 -p {d}/bomb.yml", "--playbook", "aliases expand"),
    ("plan --gpu t4 -p {d}/huge.yml", "--playbook", "larger than 1 MiB"),
    ("plan --gpu t4 -p {d}/deep.yml", "--playbook", "nest"),
    ("plan --gpu t4 -p {d}/utf16-bad.yml", "--playbook", "unknown field 'bogus'"),  # UTF-16 is read, then judged
    ("plan --gpu t4 -p {d}/nul.yml", "--playbook", "not text"),
    ("plan --gpu t4 -p {d}", "--playbook", "not a file"),
    ("render --gpu t4 -p {d}/loop.yml -o {d}/out", "--playbook", "loop"),
    ("check --inventory {d}/binary.yml", "--inventory", "not text"),
    ("check --inventory {d}/bomb.yml", "--inventory", "aliases expand"),
    ("bootstrap --inventory {d}/loop.yml", "--inventory", "loop"),
    ("check --inventory {d}/dupes.yml", "--inventory", "two hosts are called 'a'"),
    ("check --inventory {d}/same-host.yml", "--inventory", "two hosts are called '10.0.0.1'"),
    ("check --inventory {d}/inv-gpu.yml", "--inventory", "unknown GPU 'rtx9999'"),
    ("check 10.0.0.1 10.0.0.1", "HOST", "named twice"),
    # render -o
    ("render --gpu t4 -o {d}/afile", "--output", "is a file"),
    ("render --gpu t4 -o {d}/afile/sub", "--output", "which is a file"),
    ("render --gpu t4 -o /proc/gpuprov-bundle", "--output", "cannot write /proc/gpuprov-bundle"),
    ("render --gpu t4 -o ''", "--output", "empty path"),
    ("render --gpu t4 -o {d}/full", "--output", "not empty"),
    # values checked before any connection or launch
    ("plan --gpu a100:8 --count 4", "--count", "conflicts with --gpu a100:8"),
    ("plan --gpu a100 --count 0", "--count", "not in the range 1 to 64"),
    ("plan --gpu a100 --hours 0", "--hours", "not in the range"),
    ("plan --gpu nope", "--gpu", "unknown GPU"),
    ("gpus rtx9999", "GPU", "unknown GPU 'rtx9999'"),
    ("plan --gpu t4 -p minimal --jupyter", "--jupyter", "needs an `env`"),
    ("plan", "--gpu", "required"),
    ("plan --gpu t4 --bogus", "--bogus", "no such option"),
    ("check --gpu rtx9999 10.0.0.1", "--gpu", "unknown GPU 'rtx9999'"),
    ("bootstrap --gpu rtx9999 10.0.0.1", "--gpu", "unknown GPU 'rtx9999'"),
    ("check --connect-timeout -1 10.0.0.1", "--connect-timeout", "not in the range"),
    ("bootstrap --connect-timeout 0 10.0.0.1", "--connect-timeout", "not in the range"),
    ("up --gpu t4 --spot --max-price 0 --dry-run", "--max-price", "not in the range 0 < x"),
    ("up --gpu t4 --fallback sometimes", "--fallback", "'on-demand'"),
    ("check", "HOST", "no host"),
    # where gpuprov keeps its state
    ("GPUPROV_HOME={d}/home-file status", "GPUPROV_HOME", "is a file"),
    ("GPUPROV_HOME={d}/afile/sub status", "GPUPROV_HOME", "cannot create"),
    ("GPUPROV_HOME={d}/corrupt status", "state", "not a readable SQLite database"),
    ("GPUPROV_HOME={d}/garbage down --all --yes", "state", "not a readable SQLite database"),
    # every number is finite and in the range its help states (issue 23): nan, inf, negatives, out of range
    ("plan --gpu t4 --budget nan", "--budget", "'nan' is not a finite number"),
    ("plan --gpu t4 --budget inf", "--budget", "'inf' is not a finite number"),
    ("plan --gpu t4 --budget -5", "--budget", "-5 is not in the range 0 < x ≤ 10_000_000"),
    ("plan --gpu t4 --hours nan", "--hours", "'nan' is not a finite number"),
    ("plan --gpu t4 --count nan", "--count", "'nan' is not a finite number"),
    ("plan --gpu t4 --count 2.5", "--count", "'2.5' is not a whole number"),
    ("plan --gpu t4 --nodes inf", "--nodes", "'inf' is not a finite number"),
    ("check --connect-timeout nan 10.0.0.1", "--connect-timeout", "'nan' is not a finite number"),
    ("check --connect-timeout inf 10.0.0.1", "--connect-timeout", "'inf' is not a finite number"),
    ("exec --connect-timeout 1e999 10.0.0.1 -- true", "--connect-timeout", "not a finite number"),
    ("monitor --interval nan 10.0.0.1", "--interval", "'nan' is not a finite number"),
    ("monitor --interval 0 10.0.0.1", "--interval", "0 is not in the range 0.2 to 3600"),
    ("exec --timeout nan 10.0.0.1 -- true", "--timeout", "'nan' is not a finite number"),
    ("up --gpu t4 --max-hourly nan --dry-run", "--max-hourly", "'nan' is not a finite number"),
    ("up --gpu t4 --max-hourly -1 --dry-run", "--max-hourly", "not in the range"),
    ("up --gpu t4 --spot --max-price inf --dry-run", "--max-price", "'inf' is not a finite number"),
    ("up --gpu t4 --disk nan --dry-run", "--disk", "'nan' is not a finite number"),
    ("up --gpu t4 --disk 1e6 --dry-run", "--disk", "1_000_000 is not in the range 20 to 16384"),
    ("bootstrap --reboot-timeout -5 10.0.0.1", "--reboot-timeout", "-5 is not in the range 1 to 86400"),
    ("bootstrap --reboot-timeout nan 10.0.0.1", "--reboot-timeout", "'nan' is not a finite number"),
    ("bootstrap --step-silence nan 10.0.0.1", "--step-silence", "'nan' is not a finite number"),
    ("bootstrap --step-silence -1 10.0.0.1", "--step-silence", "not in the range 0 to 604_800"),
    ("bench --seconds nan 10.0.0.1", "--seconds", "'nan' is not a finite number"),
    ("doctor --min-free-gb nan 10.0.0.1", "--min-free-gb", "'nan' is not a finite number"),
    ("check --cluster --port-timeout nan train", "--port-timeout", "'nan' is not a finite number"),
    ("torchrun --grace nan train -- x.py", "--grace", "'nan' is not a finite number"),
    ("jupyter --port -1 10.0.0.1", "--port", "-1 is not in the range 0 to 65535"),
    ("GPUPROV_PARALLEL=nan check 10.0.0.1", "GPUPROV_PARALLEL", "'nan' is not a finite number"),
    ("GPUPROV_PARALLEL=0 exec 10.0.0.1 -- true", "GPUPROV_PARALLEL", "0 is not in the range 1 to 1024"),
    # a budget a guard can enforce: a minute at least, 90 days at most (at the list price)
    ("plan --gpu t4 --budget 0.001", "--budget", "under the 1m a guard can enforce"),
    ("plan --gpu t4 --budget 1e6", "--budget", "past the 90-day cap"),
    # the AWS environment, named by its variable before any AWS call
    ("AWS_ACCESS_KEY_ID=AKIAEXAMPLE gpus --live --region us-east-1", "AWS_SECRET_ACCESS_KEY",
     "not set, though AWS_ACCESS_KEY_ID is"),
    ("AWS_MAX_ATTEMPTS=abc gpus --live --region us-east-1", "AWS_MAX_ATTEMPTS", "'abc' is not in the range 1 to 100"),
    ("AWS_MAX_ATTEMPTS=0 gc", "AWS_MAX_ATTEMPTS", "'0' is not in the range 1 to 100"),
    ("AWS_RETRY_MODE=bogus gpus --live --region us-east-1", "AWS_RETRY_MODE", "'bogus' is not a retry mode"),
    ("AWS_ENDPOINT_URL=not-a-url gpus --live --region us-east-1", "AWS_ENDPOINT_URL", "'not-a-url' is not an endpoint URL"),
    ("AWS_ENDPOINT_URL_EC2=ftp://x status --refresh", "AWS_ENDPOINT_URL_EC2", "is not an endpoint URL"),
    # errors name where the value came from: the variable, the config key (file:line), the playbook's field
    ("GPUPROV_GPU=H1000 plan", "GPUPROV_GPU", "unknown GPU 'H1000'"),
    ("AWS_REGION=mars-1 plan --gpu t4", "AWS_REGION", "unknown AWS region 'mars-1'"),
    ("GPUPROV_CONFIG={d}/cfg-gpu.toml plan", "{d}/cfg-gpu.toml:1: gpu", "unknown GPU 'H1000'"),
    ("GPUPROV_CONFIG={d}/cfg-region.toml plan --gpu t4", "{d}/cfg-region.toml:2: region", "unknown AWS region"),
    ("GPUPROV_CONFIG={d}/cfg-key.toml check 10.0.0.1", "{d}/cfg-key.toml:2: key", "no such key file"),
    ("GPUPROV_CONFIG={d}/cfg-parallel.toml GPUPROV_PARALLEL=nan check 10.0.0.1", "GPUPROV_PARALLEL", "not a finite"),
    ("GPUPROV_CONFIG={d}/cfg-gpu.toml config", "{d}/cfg-gpu.toml:1: gpu", "unknown GPU 'H1000'"),
    ("GPUPROV_GPU=H1000 config", "GPUPROV_GPU", "unknown GPU 'H1000'"),
    ("AWS_REGION=mars-1 config", "AWS_REGION", "unknown AWS region 'mars-1'"),
    ("GPUPROV_CONFIG={d}/no-such.toml plan --gpu t4", "GPUPROV_CONFIG", "no such file"),
    ("plan --gpu h100 -p {d}/pins.yml", "{d}/pins.yml:3: pins.driver", "R550 cannot be installed"),
    ("up --gpu t4 --min-nodes 1 --dry-run", "--min-nodes", "applies to a cluster"),
    ("up --gpu t4 --wait soon --dry-run", "--wait", "'soon' is not a duration"),
    ("GPUPROV_TEST_WAIT_BACKOFF_SECONDS=nan up --gpu t4 --wait 1h --dry-run", "GPUPROV_TEST_WAIT_BACKOFF_SECONDS",
     "expected seconds (a number > 0), got 'nan'"),
    # checked before any connection
    ("check --inventory {d}/inv-key.yml", "{d}/inv-key.yml: trainer-b.key", "no such key file"),
    ("check --inventory {d}/inv-user.yml", "--inventory", "is not a login name"),
    ("check --inventory {d}/inv-os.yml", "--inventory", "'windows-11' is not an OS gpuprov supports"),
    ("check --inventory {d}/inv-jump.yml", "{d}/inv-jump.yml: gpu-box.proxy_jump", "does not resolve"),
    ("check --inventory {d}/inv-jump-opt.yml", "--inventory", "proxy_jump"),
    ("check 10.0.0.1 --ssh-config {d}/no-such-config", "--ssh-config", "does not exist"),
    ("sync {d}/no-such-folder exp1:code", "SRC", "no such file or folder here"),
    ("autostop trian 2h", "HOST", "no node called 'trian'"),
    ("ttl trian 4h", "HOST", "no node called 'trian'"),
    ("gc --all-regions --region us-east-1", "--region", "cannot be given with --all-regions"),
    ("up x --gpu T4 --ssh-user 'root;ls' --yes", "--ssh-user", "'root;ls' is not a login name"),
    ("plan --gpu T4 --spot --persistent --autostop-action terminate", "--autostop-action",
     "EC2 would open the request again and launch a replacement"),
    ("AWS_PROFILE=no-such-profile gc --all-regions", "AWS_PROFILE", "no AWS profile called 'no-such-profile'"),
    ("AWS_PROFILE=no-such-profile gc", "AWS_PROFILE", "no AWS profile called 'no-such-profile'"),
    # messages
    ("stauts", "stauts", "no such command (did you mean status"),
    ("plan --gpu t4 --gpu a100", "--gpu", "given more than once"),
]


# rows whose command looks for a system package's program before it reads the value (tests/lanes.py)
NEEDS_RSYNC = {"sync {d}/no-such-folder exp1:code"}
ROWS = [pytest.param(*c, id=c[0], marks=[pytest.mark.heavy] if c[0] in NEEDS_RSYNC else []) for c in CASES]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad-input")
    make_files(d)
    forkcli.warm()  # the cases time their command: not the fork server's start
    return d


def _split(line: str, d: Path, home: Path) -> tuple[list[str], dict[str, str]]:
    """The command's words and its environment: no AWS settings of the machine's, and none that could reach AWS
    (the rows that ask for it are refused first); a row's leading NAME=value words go into it."""
    import shlex

    words = shlex.split(line.format(d=d))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUPROV_"))}
    env.update({"GPUPROV_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "100", "XDG_CONFIG_HOME": str(d / "xdg"),
                "AWS_CONFIG_FILE": str(d / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(d / "no-aws-creds"),
                "AWS_EC2_METADATA_DISABLED": "true"})
    while words and "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return words, env


def run_cli(line: str, d: Path, home: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    words, env = _split(line, d, home)
    start = time.monotonic()
    result = forkcli.run([sys.executable, "-m", "gpuprov", *words], capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, timeout=60)
    return result, time.monotonic() - start


def run_in_process(line: str, d: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """The same command through Click's CliRunner in this process: the environment is the row's alone (CliRunner
    sets it for the call and puts the test's back), standard input empty."""
    from click.testing import CliRunner

    from gpuprov.cli import main

    words, env = _split(line, d, home)
    unset: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    result = CliRunner().invoke(main, words, env={**unset, **env}, prog_name="gpuprov", input="")
    return subprocess.CompletedProcess(["gpuprov", *words], result.exit_code, result.stdout, result.stderr)


def judge(result: subprocess.CompletedProcess[str], field: str, words: str, d: Path) -> None:
    """Exit 2, one `error: <field>: ` line holding `words`, at most a hint line after it, no traceback."""
    err = result.stderr
    assert "Traceback" not in err + result.stdout
    assert result.returncode == 2, err
    errors = [x for x in err.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1, err
    assert errors[0].startswith(f"error: {field.format(d=d)}: "), err
    assert words in err, err
    lines = [x for x in err.splitlines() if not x.startswith("region ")]
    assert len(lines) <= 2 and all(x.startswith("  ") for x in lines[1:]), err  # the line, then at most a hint


@pytest.mark.parametrize(("line", "field", "words"), ROWS)
def test_bad_input_is_exit_2_with_one_line_naming_the_field(line: str, field: str, words: str, files: Path,
                                                            tmp_path: Path) -> None:
    result, seconds = run_cli(line, files, tmp_path / "home")
    judge(result, field, words, files)
    assert seconds < 10  # alias bombs and huge files are refused before they are expanded (≈ 0.5 s each)


@pytest.mark.parametrize(("line", "field", "words"), ROWS)
def test_bad_input_in_process_is_the_same_one_line(line: str, field: str, words: str, files: Path,
                                                   tmp_path: Path) -> None:
    """Each row again through `main` in this process (the fast lane's way to every `error:` path): what the
    message says must not depend on the executable's own exit (cli.run) or on a fresh interpreter."""
    judge(run_in_process(line, files, tmp_path / "home"), field, words, files)


def test_alias_bomb_and_huge_file_are_refused_in_well_under_a_second(files: Path) -> None:
    from gpuprov.errors import UserInputError
    from gpuprov.plan.spec import load_playbook

    for name in ("bomb.yml", "loop.yml", "huge.yml", "deep.yml"):
        start = time.monotonic()
        with pytest.raises(UserInputError):
            load_playbook(str(files / name))
        assert time.monotonic() - start < 0.5, name


def test_utf16_and_bom_playbooks_are_read(tmp_path: Path) -> None:
    text = "name: mine\nsteps:\n  - name: hello\n    run: echo hello\n"
    for encoding in ("utf-16", "utf-8-sig"):
        path = tmp_path / f"{encoding}.yml"
        path.write_bytes(text.encode(encoding))
        result, _ = run_cli(f"plan --gpu t4 -p {path} --json", tmp_path, tmp_path / "home")
        assert result.returncode == 0, result.stderr
        assert '"name": "hello"' in result.stdout


def test_render_into_its_own_folder_replaces_only_the_scripts_its_manifest_listed(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    home = tmp_path / "home"
    assert run_cli(f"render --gpu t4 -o {out}", tmp_path, home)[0].returncode == 0
    assert (out / "07-verify.sh").exists() and (out / "06-pytorch.sh").exists()
    (out / "README.mine").write_text("kept\n")
    result, _ = run_cli(f"render --gpu t4 -p minimal -o {out}", tmp_path, home)
    assert result.returncode == 0, result.stderr
    left = sorted(p.name for p in out.iterdir())
    assert left == ["01-kernel-headers.sh", "02-nouveau-off.sh", "03-nvidia-driver.sh", "04-persistence.sh",
                    "05-verify.sh", "README.mine", "manifest.json"]  # no stale 06-pytorch.sh / 07-verify.sh


def test_a_manifest_cannot_make_render_delete_files_outside_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    victim = tmp_path / "precious.sh"
    victim.write_text("keep me\n")
    (out / "manifest.json").write_text('{"steps": [{"file": "../precious.sh"}, {"file": "/etc/passwd"}]}')
    assert run_cli(f"render --gpu t4 -o {out}", tmp_path, tmp_path / "home")[0].returncode == 0
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize("planted", ["01-kernel-headers.sh", "manifest.json"])
def test_render_never_writes_through_a_symlink_planted_in_its_folder(tmp_path: Path, planted: str) -> None:
    """A folder an earlier render wrote, with a link planted at a name this render writes (a script the old
    manifest did not list, or the manifest itself): the file outside is neither overwritten nor chmod'ed."""
    out = tmp_path / "bundle"
    home = tmp_path / "home"
    assert run_cli(f"render --gpu t4 -p minimal -o {out}", tmp_path, home)[0].returncode == 0
    victim = tmp_path / "precious"
    victim.write_text('{"steps": []}\n')  # valid as a manifest too, so reading it through the link is no refusal
    victim.chmod(0o600)
    (out / planted).unlink()
    (out / planted).symlink_to(victim)
    if planted != "manifest.json":  # the old manifest no longer lists it: it is not this render's to remove
        (out / "manifest.json").write_text('{"steps": []}\n')
    before = sorted(p.name for p in out.iterdir())
    result, _ = run_cli(f"render --gpu t4 -p minimal -o {out}", tmp_path, home)
    assert victim.read_text() == '{"steps": []}\n' and oct(victim.stat().st_mode & 0o7777) == "0o600"
    assert result.returncode == 2, result.stderr
    errors = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --output: {out / planted} is a symbolic link"), errors
    assert str(victim) in result.stderr
    assert sorted(p.name for p in out.iterdir()) == before and (out / planted).is_symlink()  # nothing changed


def test_a_link_planted_after_renders_check_is_replaced_not_followed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the up-front check cannot close: a link planted at a script's name just before that file is
    written. Each file is a new one renamed over the name, so the link goes and the file outside stays."""
    from gpuprov.plan import render
    from gpuprov.plan.plan import make_host_plan
    from gpuprov.plan.stack import StackPins

    playbook = tmp_path / "two.yml"
    playbook.write_text("name: two\nstack: none\nenv: null\nsteps:\n  - name: a\n    run: 'true'\n"
                        "  - name: b\n    run: 'true'\n")
    bundle = make_host_plan(None, str(playbook), "ubuntu-24.04", StackPins()).bundle()
    victim = tmp_path / "precious"
    victim.write_text("keep\n")
    victim.chmod(0o600)
    real = render.write_atomic

    def plant_then_write(path: Path, *args: object, **kwargs: object) -> None:
        path.unlink(missing_ok=True)
        path.symlink_to(victim)
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(render, "write_atomic", plant_then_write)
    out = tmp_path / "bundle"
    written = bundle.write(out)
    assert victim.read_text() == "keep\n" and oct(victim.stat().st_mode & 0o7777) == "0o600"
    assert written and not any(p.is_symlink() for p in written)
    assert all(p.read_text() == s.text for p, s in zip(written[:-1], bundle.scripts, strict=True))  # manifest last


def test_a_corrupt_state_file_is_left_as_it_was(files: Path, tmp_path: Path) -> None:
    before = (files / "corrupt" / "state.sqlite").read_bytes()
    result, _ = run_cli("GPUPROV_HOME={d}/corrupt status", files, tmp_path)
    assert result.returncode == 2
    assert "mv " in result.stderr and "gc --all-regions" in result.stderr  # how to recover
    assert (files / "corrupt" / "state.sqlite").read_bytes() == before
    assert sorted(p.name for p in (files / "corrupt").iterdir()) == ["state.sqlite"]


def test_a_damaged_page_in_a_real_state_file_is_reported(tmp_path: Path) -> None:
    home = tmp_path / "home"
    from gpuprov.state.sqlite import SqliteStore

    SqliteStore(home / "state.sqlite").close()  # a real state file (`status` makes none where there is none)
    db = home / "state.sqlite"
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=DELETE")
    con.executemany("INSERT INTO events (node, at, kind, message) VALUES ('n', 0, 'k', ?)", [("x" * 500,)] * 200)
    con.commit()
    con.close()
    data = bytearray(db.read_bytes())
    data[4096 * 2:4096 * 2 + 64] = b"\xff" * 64  # a b-tree page's header
    db.write_bytes(bytes(data))
    result, _ = run_cli("status", tmp_path, home)
    assert "Traceback" not in result.stderr
    assert result.returncode == 2 and "error: state: " in result.stderr, result.stderr


def test_a_broken_known_hosts_line_is_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "known_hosts").write_text("10.0.0.1 ssh-ed25519 AAAAC3Nza root@vm\n")
    for command in ("check 10.0.0.1", "exec 10.0.0.1 -- true", "bootstrap 10.0.0.1 -p minimal --os ubuntu-24.04"):
        result, _ = run_cli(command, tmp_path, home)
        assert "Traceback" not in result.stderr
        assert result.returncode == 2 and "error: known_hosts: " in result.stderr and "AAAAC3Nza" in result.stderr


def test_a_bug_is_one_line_and_a_saved_traceback(tmp_path: Path) -> None:
    """Whatever goes wrong inside, the user sees one line and where the traceback went (a simulated bug)."""
    env = {**os.environ, "GPUPROV_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    code = ("import sys, gpuprov.plan.plan as p\n"
            "def boom(*a, **k): raise RuntimeError('simulated bug')\n"
            "p.make_plan = boom\n"
            "from gpuprov.cli import main\n"
            "sys.argv = ['gpuprov', 'plan', '--gpu', 't4']\n"
            "main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "error: gpuprov hit a bug: RuntimeError: simulated bug" in result.stderr
    saved = result.stderr.split("the traceback is in ")[1].split(";")[0]
    assert "RuntimeError: simulated bug" in Path(saved).read_text()
    Path(saved).unlink()


@pytest.fixture
def not_aws() -> Iterator[str]:
    """A page that is not even well-formed XML (botocore's parser refuses it)."""
    from tests.webpage import serving

    with serving(b"<!DOCTYPE HTML>\n<html><head><title>Welcome</title></head><body><p>Sign in<br></body></html>\n") as url:
        yield url


@pytest.mark.parametrize("run", ["executable", "in-process"])
def test_an_endpoint_that_is_not_aws_is_named_by_its_variable(not_aws: str, files: Path, tmp_path: Path,
                                                                run: str) -> None:
    """AWS_ENDPOINT_URL at a web server that is not AWS: botocore cannot parse its answer, which is the user's
    variable to fix (exit 2, naming it), not a bug."""
    line = (f"AWS_ENDPOINT_URL={not_aws} AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=y AWS_MAX_ATTEMPTS=1 "
            "gpus --live --region us-east-1")
    result = run_cli(line, files, tmp_path / "home")[0] if run == "executable" else \
        run_in_process(line, files, tmp_path / "home")
    judge(result, "AWS_ENDPOINT_URL", f"{not_aws} did not answer DescribeInstanceTypes as AWS does", files)
