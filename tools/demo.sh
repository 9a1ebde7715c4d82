#!/usr/bin/env bash
# make demo: the offline commands, then the whole lifecycle against a local AWS endpoint + SSH host.
set -euo pipefail
bash "$(dirname "$0")/sysdeps.sh"
exec .venv/bin/python "$(dirname "$0")/demo.py"
