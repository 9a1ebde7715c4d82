"""One or two examples at the end of every command's `--help` (params.Command and Subgroup print them).

Imported only when help is printed, so a command that runs pays nothing for the table. Every example fits 80
columns and parses as written (tests/test_help.py).
"""

from __future__ import annotations

import click

# command path (without `gpuprov`) → examples, each `COMMAND  # what it does`
EXAMPLES: dict[str, tuple[str, ...]] = {
    "autostop": ("gpuprov autostop exp1 2h        # stop after 2 h idle", "gpuprov autostop exp1 off"),
    "bench": ("gpuprov bench exp1              # every GPU against NVIDIA's figures",
              "gpuprov bench gpu-box --gpu H100 --json"),
    "bootstrap": ("gpuprov bootstrap ubuntu@10.1.2.3 -p pytorch --accept-new-host-key",
                  "gpuprov bootstrap --inventory hosts.yml --cache-host 10.1.2.10"),
    "bundle": ("gpuprov bundle --offline --gpu H100 --os ubuntu-24.04 -o ./h100",
               "gpuprov bootstrap root@10.1.2.3 --gpu H100 --offline ./h100   # then"),
    "capacity": ("gpuprov capacity list", "gpuprov capacity offers --gpu H100:8 --hours 24"),
    "capacity offers": ("gpuprov capacity offers --gpu H100:8 --nodes 2 --hours 24",),
    "capacity buy": ("gpuprov capacity buy cb-0123456789abcdef0   # asks first: paid up front",),
    "capacity list": ("gpuprov capacity list --json",),
    "check": ("gpuprov check exp1              # a node, by name", "gpuprov check ubuntu@10.1.2.3 --json"),
    "cluster": ("gpuprov cluster list", "gpuprov cluster rm rack"),
    "cluster list": ("gpuprov cluster list --json",),
    "cluster rm": ("gpuprov cluster rm rack          # the hosts keep their files",),
    "completion": ("eval \"$(gpuprov completion bash)\"",
                   "gpuprov completion fish > ~/.config/fish/completions/gpuprov.fish"),
    "config": ("gpuprov config                  # each default and where it came from",
               "gpuprov config --path"),
    "doctor": ("gpuprov doctor ubuntu@10.1.2.3  # nouveau, headers, Secure Boot, module, …",
               "gpuprov doctor ubuntu@10.1.2.3 --sources   # the fastest mirror from there"),
    "down": ("gpuprov down exp1", "gpuprov down --all --yes        # every node of yours"),
    "exec": ("gpuprov exec exp1 -- nvidia-smi -L", "gpuprov exec node-a node-b --sudo -- apt-get update"),
    "facts": ("gpuprov facts", "gpuprov facts --json"),
    "facts refresh": ("gpuprov facts refresh --only torch",),
    "gc": ("gpuprov gc                      # list what is left, delete nothing", "gpuprov gc --yes"),
    "gpus": ("gpuprov gpus", "gpuprov gpus H100 --live --region us-east-1"),
    "image": ("gpuprov image bake base --name a100-stack --yes", "gpuprov image list"),
    "image bake": ("gpuprov image bake base --name a100-stack --yes",),
    "image list": ("gpuprov image list --json",),
    "image rm": ("gpuprov image rm a100-stack --yes",),
    "jupyter": ("gpuprov jupyter exp1            # prints http://127.0.0.1:8888/lab?token=…",),
    "metrics": ("gpuprov metrics serve --file-sd ~/prometheus/gpuprov.json",
                "gpuprov metrics dashboard > gpu.json"),
    "metrics targets": ("gpuprov metrics targets          # every node with --metrics",),
    "metrics serve": ("gpuprov metrics serve --file-sd ~/prometheus/gpuprov.json",),
    "metrics dashboard": ("gpuprov metrics dashboard > gpu.json   # Grafana: Dashboards → Import",),
    "monitor": ("gpuprov monitor exp1", "gpuprov monitor exp1 --once --json"),
    "plan": ("gpuprov plan --gpu A100:8 --spot --hours 10",
             "gpuprov plan --gpu L4 -p containers --json"),
    "render": ("gpuprov render --gpu L4 -p llm-finetune -o ./bundle",),
    "ssh": ("gpuprov ssh exp1", "gpuprov ssh exp1 -- nvidia-smi   # exits with its exit code"),
    "start": ("gpuprov start exp1", "gpuprov start big --gpu L4      # resized first (on-demand)"),
    "state": ("gpuprov state", "gpuprov state push s3://acme-gpu-state/team"),
    "state push": ("gpuprov state push s3://acme-gpu-state/team",),
    "state unlock": ("gpuprov state unlock shared",),
    "state adopt": ("gpuprov state adopt --region us-east-1",),
    "status": ("gpuprov status", "gpuprov status exp1 --timeline"),
    "stop": ("gpuprov stop exp1               # the disk stays; `start` resumes",),
    "sync": ("gpuprov sync ./code exp1:code   # ~/code is a copy of ./code",
             "gpuprov sync exp1:runs ./runs   # and back"),
    "team": ("gpuprov team join", "gpuprov team sync shared"),
    "team join": ("gpuprov team join",),
    "team sync": ("gpuprov team sync shared",),
    "torchrun": ("gpuprov torchrun rack -- code/train.py --epochs 3",),
    "ttl": ("gpuprov ttl exp1 4h             # a deadline 4 h from now", "gpuprov ttl exp1 off"),
    "tunnel": ("gpuprov tunnel exp1 8000        # 127.0.0.1:8000 -> the node's 8000",
               "gpuprov tunnel exp1 0:6006      # any free local port (printed)"),
    "up": ("gpuprov up train --gpu A100:8 --spot --fallback on-demand",
           "gpuprov up exp1 --gpu L40S --jupyter --autostop 30m --budget 50"),
}


def write_examples(ctx: click.Context, formatter: click.HelpFormatter) -> None:
    path = ctx.command_path.split(" ", 1)[1] if " " in ctx.command_path else ""
    lines = EXAMPLES.get(path)
    if lines:
        with formatter.section("Examples"):
            for line in lines:
                formatter.write(f"{'':>{formatter.current_indent}}{line}\n")
