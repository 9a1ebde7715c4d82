#!/usr/bin/env bash
# The offline half of a user's day: what can I get, and what exactly would gpuprov do.
set -euo pipefail
gp() { printf '\n\033[1m$ gpuprov %s\033[0m\n' "$*"; .venv/bin/gpuprov "$@"; }
gp gpus
gp plan --gpu A100 --spot
gp plan --gpu V100 --torch-cuda cu130 || echo "(exit code $? — an impossible stack is refused before anything is created)"
out=$(mktemp -d)
gp render --gpu L4 -p llm-finetune -o "$out/bundle"
printf '\n\033[1m$ head %s\033[0m\n' "$out/bundle/manifest.json"
head -n 12 "$out/bundle/manifest.json"
rm -rf "$out"
