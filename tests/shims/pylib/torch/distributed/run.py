"""torchrun for the fake torch (`python -m torch.distributed.run`, the env's bin/torchrun).

Takes torchrun's options (static rendezvous: --nnodes, --nproc-per-node, --node-rank, --master-addr,
--master-port; the underscore spellings too; unknown options are refused as argparse does, exit 2),
records its argv in the shim call log ("torchrun ARGS"), and starts --nproc-per-node copies of the
script with the environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...). Like torchrun it exits 1 when a worker fails, and on
SIGINT, SIGTERM or SIGHUP (its terminal hung up) it stops its workers (SIGTERM, then SIGKILL) and exits.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchrun", allow_abbrev=False)
    p.add_argument("--nnodes", default="1")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", default="1")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0)
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=29500)
    p.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default="static")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default="")
    p.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", default="none")
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0)
    p.add_argument("--standalone", action="store_true")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def _record(argv: list[str]) -> None:
    state = os.environ.get("GPUPROV_SHIM_STATE", "/var/lib/gpuprov-shim")
    try:
        with open(os.path.join(state, "calls.log"), "a") as f:
            f.write("torchrun " + shlex.join(argv) + "\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _record(argv)
    args = _parser().parse_args(argv)
    if args.rdzv_backend != "static" or args.standalone:
        print("torchrun (gpuprov test shim): only the static rendezvous (--master-addr/--master-port) is faked",
              file=sys.stderr)
        return 2
    nnodes, nproc = int(args.nnodes), int(args.nproc_per_node)
    if not 0 <= args.node_rank < nnodes:
        print(f"torchrun: error: --node-rank {args.node_rank} is outside 0..{nnodes - 1}", file=sys.stderr)
        return 2
    workers: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, frame: object) -> None:
        for w in workers:
            if w.poll() is None:
                w.terminate()
        end = time.monotonic() + 5
        for w in workers:
            try:
                w.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.kill()
        print(f"torchrun: received signal {signum}; workers stopped", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    world = nnodes * nproc
    for local in range(nproc):
        env = dict(os.environ, RANK=str(args.node_rank * nproc + local), LOCAL_RANK=str(local),
                   WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(args.node_rank),
                   ROLE_RANK=str(args.node_rank * nproc + local), ROLE_WORLD_SIZE=str(world),
                   GROUP_WORLD_SIZE=str(nnodes), MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port),
                   TORCHELASTIC_RUN_ID=args.rdzv_id, TORCHELASTIC_RESTART_COUNT="0",
                   TORCHELASTIC_MAX_RESTARTS=str(args.max_restarts), OMP_NUM_THREADS="1")
        workers.append(subprocess.Popen([sys.executable, args.training_script, *args.training_script_args],
                                        env=env))
    codes = [w.wait() for w in workers]
    failed = [(i, c) for i, c in enumerate(codes) if c != 0]
    if failed:
        local, code = failed[0]
        print(f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: {args.training_script} FAILED "
              f"(local_rank {local}, exitcode {code})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
