"""The AWS CLI v2's `aws s3 sync` (gpuprov test shim, run by tests/shims/bin/aws), against a real S3 API (moto's,
behind the fault proxy) through boto3, so what it uploads is in the bucket and what it downloads came from there.

What it models, from the AWS CLI reference (s3 sync) and its return codes topic (read 2026-12-02):
  aws s3 sync <LocalPath> <S3Uri> | <S3Uri> <LocalPath> [--no-progress] [--only-show-errors] [--quiet]
      [--size-only] [--exact-timestamps] [--delete]
  an object or file is copied when the other side lacks it, the sizes differ, or (unless --size-only) the source is
  newer; a download gets the object's LastModified as its mtime; each copy prints `download: SRC to DST` /
  `upload: SRC to DST` (not with --only-show-errors or --quiet); --delete removes what the source lacks
  (`delete: X`). Exit 0, 1 when a transfer failed, 252 for an unknown option or a bad argument (with `Unknown
  options: …`), and a service error as `fatal error: An error occurred (Code) when calling the Op operation: …`
  (exit 1). Any other command or option the real CLI has is refused as not modelled (exit 2), never ignored.
  Missing credentials are `fatal error: Unable to locate credentials`, exit 1, not the 253 of the return codes
  topic: an s3 transfer command resolves credentials at its first request, inside its CommandResultRecorder, whose
  __exit__ records any exception as an ErrorResult, and a failed task makes the command's return code 1
  (aws/aws-cli awscli/customizations/s3/results.py and subcommands.py, read 2026-12-02).
Credentials, region and endpoint come from the environment as botocore reads them (AWS_ENDPOINT_URL_S3 included).
"""

from __future__ import annotations

import os
import sys
import tempfile

USAGE = ("usage: aws [options] <command> <subcommand> [<subcommand> ...] [parameters]\n"
         "To see help text, you can run:\n\n  aws help\n  aws <command> help\n  aws <command> <subcommand> help\n")
FLAGS = {"--no-progress", "--only-show-errors", "--quiet", "--size-only", "--exact-timestamps", "--delete"}
# options of the real `aws s3 sync` this shim does not model: refused, never silently ignored
REAL_NOT_MODELLED = {"--dryrun", "--include", "--exclude", "--acl", "--follow-symlinks", "--no-follow-symlinks",
                     "--sse", "--storage-class", "--endpoint-url", "--region", "--profile", "--page-size", "--debug",
                     "--no-overwrite", "--checksum-algorithm", "--checksum-mode", "--request-payer", "--metadata"}


def die(code: int, text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.exit(code)


def split(uri: str) -> tuple[str, str]:
    rest = uri[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        die(252, f"\nParameter validation failed:\nInvalid bucket name \"\": {uri}")
    return bucket, prefix if not prefix or prefix.endswith("/") else prefix + "/"


def main(argv: list[str]) -> None:
    if argv[:2] != ["s3", "sync"]:
        if argv[:1] == ["s3"] or argv[:1] == ["--version"]:
            die(2, f"gpuprov shim: aws {' '.join(argv[:2])} is not modelled (only `aws s3 sync`)")
        die(252, USAGE + f"\naws: error: argument command: Invalid choice: {argv[:1]}")
    args, flags = [], set()
    for a in argv[2:]:
        if a in FLAGS:
            flags.add(a)
        elif a in REAL_NOT_MODELLED:
            die(2, f"gpuprov shim: aws s3 sync {a} is not modelled")
        elif a.startswith("--"):
            die(252, USAGE + f"\nUnknown options: {a}")
        else:
            args.append(a)
    if len(args) != 2:
        die(252, USAGE + "\naws: error: the following arguments are required: paths")
    src, dst = args
    if src.startswith("s3://") == dst.startswith("s3://"):
        die(2, "gpuprov shim: aws s3 sync between two local paths is refused by the CLI, between two buckets not modelled")
    import boto3
    from botocore.exceptions import ClientError, NoCredentialsError

    s3 = boto3.client("s3")
    quiet = bool(flags & {"--only-show-errors", "--quiet"})
    try:
        failed = download(s3, src, dst, flags, quiet) if src.startswith("s3://") else upload(s3, src, dst, flags, quiet)
    except NoCredentialsError:  # found at the first request, inside the transfer: a fatal error like any other
        die(1, "fatal error: Unable to locate credentials")
    except ClientError as exc:
        err = exc.response.get("Error", {})
        die(1, f"fatal error: An error occurred ({err.get('Code')}) when calling the {exc.operation_name} operation: "
               f"{err.get('Message')}")
    sys.exit(1 if failed else 0)


def objects(s3, bucket: str, prefix: str) -> dict[str, dict]:
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix):]] = o
    return out


def files(root: str) -> dict[str, os.stat_result]:
    out = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root).replace(os.sep, "/")] = os.stat(path)
    return out


def _newer(a: float, b: float) -> bool:
    return int(a) > int(b)


def download(s3, src: str, dst: str, flags: set[str], quiet: bool) -> int:
    bucket, prefix = split(src)
    have = files(dst) if os.path.isdir(dst) else {}
    failed = 0
    for rel, o in sorted(objects(s3, bucket, prefix).items()):
        if not rel or rel.endswith("/"):
            continue
        mtime = o["LastModified"].timestamp()
        st = have.get(rel)
        if st is not None and st.st_size == o["Size"] and ("--size-only" in flags or not (
                _newer(mtime, st.st_mtime) or ("--exact-timestamps" in flags and int(mtime) != int(st.st_mtime)))):
            continue
        path = os.path.join(dst, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".")
        try:
            with os.fdopen(fd, "wb") as f:
                s3.download_fileobj(bucket, o["Key"], f)
            os.utime(tmp, (mtime, mtime))
            os.replace(tmp, path)
        except Exception as exc:  # a failed transfer: a line and exit 1, as the CLI
            os.unlink(tmp)
            sys.stderr.write(f"download failed: s3://{bucket}/{o['Key']} to {path} {exc}\n")
            failed += 1
            continue
        if not quiet:
            print(f"download: s3://{bucket}/{o['Key']} to {path}", flush=True)
    if "--delete" in flags:
        keys = objects(s3, bucket, prefix)
        for rel in sorted(set(have) - set(keys)):
            path = os.path.join(dst, *rel.split("/"))
            os.unlink(path)
            if not quiet:
                print(f"delete: {path}", flush=True)
    return failed


def upload(s3, src: str, dst: str, flags: set[str], quiet: bool) -> int:
    bucket, prefix = split(dst)
    if not os.path.exists(src):
        die(255, f"\nThe user-provided path {src} does not exist.")
    have = objects(s3, bucket, prefix)
    failed = 0
    local = files(src)
    for rel, st in sorted(local.items()):
        o = have.get(rel)
        if o is not None and o["Size"] == st.st_size and ("--size-only" in flags or
                                                         not _newer(st.st_mtime, o["LastModified"].timestamp())):
            continue
        path = os.path.join(src, *rel.split("/"))
        try:
            s3.upload_file(path, bucket, prefix + rel)
        except Exception as exc:
            sys.stderr.write(f"upload failed: {path} to s3://{bucket}/{prefix}{rel} {exc}\n")
            failed += 1
            continue
        if not quiet:
            print(f"upload: {path} to s3://{bucket}/{prefix}{rel}", flush=True)
    if "--delete" in flags:
        for rel in sorted(set(have) - set(local)):
            s3.delete_object(Bucket=bucket, Key=prefix + rel)
            if not quiet:
                print(f"delete: s3://{bucket}/{prefix}{rel}", flush=True)
    return failed


if __name__ == "__main__":
    main(sys.argv[1:])
