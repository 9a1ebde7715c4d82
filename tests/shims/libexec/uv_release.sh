#!/usr/bin/env bash
# uv_release.sh ARCH: the stand-in for uv's release archive uv-ARCH-unknown-linux-musl.tar.gz, on stdout: its uv runs
# tests/shims/libexec/uv through gpuprov-shim-uv on PATH. Byte for byte the same on every call and wherever the shims
# are (sorted names, fixed times and owners, gzip without a name or time, no path inside), so that tests/conftest.py
# can pin its sha256 as data/sources.yaml pins the real one's.
set -euo pipefail
arch="${1:?uv_release.sh ARCH}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
top="uv-$arch-unknown-linux-musl"
mkdir "$dir/$top"
printf '#!/bin/sh\n# uv (gpuprov test shim): tests/shims/libexec/uv\nexec gpuprov-shim-uv "$@"\n' >"$dir/$top/uv"
printf '#!/bin/sh\necho "uvx is not modelled by the gpuprov test shims" >&2\nexit 2\n' >"$dir/$top/uvx"
chmod 0755 "$dir/$top" "$dir/$top/uv" "$dir/$top/uvx"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir" -cf - "$top" | gzip -n
