"""`gpuprov config`: the user's defaults in effect, and where each comes from."""

from __future__ import annotations

import json

import click

from gpuprov.cli.common import main, make_console


@main.command("config")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--path", "show_path", is_flag=True, help="Print the config file's path and nothing else.")
def config_cmd(as_json: bool, show_path: bool) -> None:
    """Show the defaults in effect and where each comes from: environment, config file, built-in.

    The file is TOML at the path `gpuprov config --path` prints (~/.config/gpuprov/config.toml, or
    $GPUPROV_CONFIG):

    \b
      region = "us-west-2"         gpu = "L40S"          playbook = "llm-finetune"
      ssh_cidr = "203.0.113.0/24"  key = "~/.ssh/gpu.pem"  autostop = "30m"
      parallel = 64                subnet = "subnet-…"   connect = "private"
      ssh_user = "root"            os = "ubuntu-22.04"   python = "3.11"

    A flag wins over its environment variable (GPUPROV_GPU, GPUPROV_PLAYBOOK, GPUPROV_SSH_CIDR,
    GPUPROV_KEY, GPUPROV_AUTOSTOP, GPUPROV_PARALLEL; AWS_REGION for the region), which wins over the
    file, which wins over the built-in default.
    """
    from gpuprov.cli.fittable import Column, FitTable
    from gpuprov.cloud.providers.aws_region import resolve
    from gpuprov.paths import config_path
    from gpuprov.plan import config

    if show_path:
        click.echo(str(config_path()))
        return
    def region() -> tuple[str, str]:  # neither the environment nor the file sets it: the AWS chain's
        found = resolve(None)
        return found.name, found.source

    rows = config.effective(region)
    if as_json:
        click.echo(json.dumps({"path": str(config_path()), "exists": config_path().exists(), "settings": [
            {"key": k, "value": v, "source": src, "what": what} for k, v, src, what in rows]}, indent=2))
        config.check_effective(rows)  # shown, and then refused: exit 2 naming where the bad value came from
        return
    table = FitTable([Column("key"), Column("value", prose=True), Column("from", prose=True),
                      Column("sets", prose=True, drop=1)],
                     title=f"config file: {config_path()}" + ("" if config_path().exists() else " (none yet)"),
                     title_justify="left")
    for key, value, source, what in rows:
        table.add_row(key, "-" if value is None else str(value), source, what)
    make_console().print(table)
    config.check_effective(rows)


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script: commands, options, node names, GPU names and playbooks.

    \b
    bash:  echo 'eval "$(gpuprov completion bash)"' >> ~/.bashrc
    zsh:   echo 'eval "$(gpuprov completion zsh)"' >> ~/.zshrc
    fish:  gpuprov completion fish > ~/.config/fish/completions/gpuprov.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None  # the Choice above admits only shells Click knows
    click.echo(cls(main, {}, "gpuprov", "_GPUPROV_COMPLETE").source())
