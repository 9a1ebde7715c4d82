"""Errors a user can act on. The CLI prints them without a traceback.

The lowest floor, with files.py, paths.py and resources.py: every part may import these, and they import no part.
`GpuprovError` is exit 1; `UserInputError` and `StackConflict` are exit 2 (field, problem, a valid alternative). A
`StackConflict` carries `rule`, the stable id of the compatibility rule that refused it (`driver-no-pinning-package`,
`wheel-needs-newer-driver`, `nvcc-torch-major-mismatch`, `wheel-no-sass`, …): tests assert the id, not the wording.

The `gpuprov` command's exit codes, whatever it runs (other programs' own codes are mapped onto these: rsync's 23,
a partial copy, is `sync`'s 1):

  0              done (check, doctor, bootstrap: every host passed)
  1              something failed: a host's check or step, AWS refused, a copy, a `down` that left resources, a bug
  2              bad input or a broken environment, named where it came from: a flag, a file, HOME, stdout
  124            `exec --timeout`: the command was still running when the time was up
  130, 143, 129  interrupted by SIGINT (Ctrl-C), SIGTERM, SIGHUP (cli/signals.py): 128 + the signal's number
  255            `ssh`, `exec`, `sync`: the host could not be reached (ssh's own code); otherwise `ssh` and `exec`
                 pass the remote command's own code through

Every exception class in src/gpuprov, drawn once (tests/test_layout.py fails when one is left out here). The CLI's
group (cli/common.Group) prints a GpuprovError as one `error: <message>` line on stderr and exits with its
`exit_code`; a command over many hosts puts a host's error on that host's row instead. Any other exception that
reaches the CLI is a bug: one `gpuprov hit a bug` line, the traceback saved to a file, exit 1.

  class                     module                       what it means to the user
  Exception
    GpuprovError            errors.py                    exit 1: something went wrong that the user should read about
      UserInputError        errors.py                    exit 2: bad input, named where it came from; nothing made yet
        StackConflict       errors.py                    exit 2: a GPU x driver x CUDA x torch that cannot work (`rule`)
        StateError          state/errors.py              exit 2: the state file cannot be read; it is never replaced
        StateTooNew         state/errors.py              exit 2: a newer gpuprov wrote the state file
        BadObject           state/s3.py                  exit 2: an object in the team's bucket is no record this reads
      StateUnavailable      state/errors.py              exit 1: the records are intact but cannot be written now
        BucketUnavailable   state/s3.py                  exit 1: team state's bucket cannot be read or written now
      Busy                  state/coordinator.py         exit 1: another process holds the lock, and the caller would not wait
        Overdue             state/coordinator.py         exit 1: still held when the caller's patience ran out: names who
      LeaseLost             state/leases.py              exit 1: a teammate broke or took this command's lease: it stopped
      SourceUnreachable     sources/http.py              `facts refresh`: that family's refresh fails, the rest go on
      Changed               sources/offline.py           exit 1: a bundle's download is not what its index says: refused
      HostUnreachable       hosts/remote.py              SSH did not answer: the host's failed row (exec: 255)
      ConnectionLost        hosts/remote.py              the connection dropped mid-command: the host's failed row
        HostLost            hosts/remote.py              keepalives unanswered, or no output for too long: the same
      CommandTimeout        hosts/remote.py              a command ran past its time: the host's failed row (exec: 124)
      ShellRefused          hosts/remote.py              the login's shell runs no command (nologin): the host's failed row
      Ended                 hosts/remote.py              a command ended before its marker line: bootstrap says why
      UnknownHostKey        hosts/hostkeys.py            no pinned key: not connecting (--accept-new-host-key pins it)
      HostKeyChanged        hosts/hostkeys.py            another key than the pinned one: not connecting
      RevokedHostKey        hosts/hostkeys.py            a key @revoked in a known_hosts file: not connecting
      ProbeError            hosts/verify.py              verify's probe printed nothing readable: the check fails
      DoctorError           hosts/doctor_facts.py        the doctor's facts were cut off: that host's doctor fails
      BenchProbeError       hosts/gpubench.py            the bench probe printed nothing readable, or hung
      CacheFailed           hosts/site_cache.py          exit 1: --cache-host's proxy did not start: no host was touched
      AwsError              cloud/providers/aws_base.py  exit 1: AWS refused a call: its code, message, a fix
      NoAnswer              cloud/providers/aws_base.py  AWS did not answer: asked again where safe, else exit 1
      EcsError              cloud/providers/alibaba_base.py exit 1: Alibaba Cloud ECS refused a call: code, message, fix
      EcsNoAnswer           cloud/providers/alibaba_base.py ECS did not answer: asked again where safe, else exit 1
      LaunchError           cloud/providers/base.py      one refused launch: the failover tries the next candidate
      BlockUnknown          cloud/providers/base.py      exit 1: a block purchase's answer was lost, no block listed yet
      NotFound              cloud/providers/base.py      no such resource, settled: gone to teardown and gc
      QuotaExceeded         cloud/launch.py              exit 1: the account's quota is too small, and by how much
      NoCapacity            cloud/launch.py              exit 1: every candidate refused for now (`up --wait` asks again)
      TeardownIncomplete    cloud/teardown.py            exit 1: some resources are left; `down` again finishes
      Refused               cloud/destroy.py             exit 1: the destroy gate left a node: a teammate's, its data unsaved
      NotSaved              cloud/data_save.py           a `when: down` save failed or cannot run: the gate's Refused says it
    WebPage                 endpoints.py                 never: an HTML answer; the call reads it as an unreadable answer
    Taken                   state/leases.py              never: locks.py turns a lease held elsewhere into Busy
    Conflict                state/s3.py                  never: a conditional write that lost is read again and retried
    GpuprovBug              errors.py                    a bug, never bad input: `gpuprov hit a bug`, the traceback saved
      IllegalTransition     state/machine.py             a node state change the table does not allow; nothing written
      StateBug              state/errors.py              SQLite refused a statement gpuprov got wrong; the file is intact
      Unguarded             cloud/destroy.py             a destroy without the lock of what it destroys, or outside the gate
  KeyboardInterrupt
    Interrupted             errors.py                    a signal: `interrupted by SIGTERM`, exit 128 + its number
"""

from __future__ import annotations


class GpuprovError(Exception):
    """Something went wrong that the user should read about; exit code 1."""

    exit_code = 1


class UserInputError(GpuprovError):
    """Bad input: names the field, says what is wrong and what would work. Exit code 2.

    Raised before anything is created, so the user can fix the input and run again.
    """

    exit_code = 2

    def __init__(self, field: str, problem: str, hint: str = "") -> None:
        self.field = field
        self.problem = problem
        self.hint = hint
        text = f"{field}: {problem}"
        if hint:
            text += f"\n  {hint}"
        super().__init__(text)


class StackConflict(UserInputError):
    """A GPU x driver x CUDA x torch combination that cannot work.

    `rule` is a stable id of the compatibility rule that refused it (e.g. "driver-no-pinning-package"),
    so callers and tests can tell one refusal from another without reading the wording.
    """

    def __init__(self, field: str, problem: str, hint: str = "", rule: str = "") -> None:
        super().__init__(field, problem, hint)
        self.rule = rule


class Interrupted(KeyboardInterrupt):
    """A termination signal (SIGINT, SIGTERM, SIGHUP), raised in the main thread wherever it is: every signal
    a terminal, `kill`, `timeout`, a CI runner or systemd sends ends a command as Ctrl-C does (cli/signals.py).
    A KeyboardInterrupt, so everything that takes back work on Ctrl-C does it for each of them.
    `note`: what the take-back left, for the last line (set by cloud/launch.take_back)."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(name)
        self.signum = signum
        self.name = name
        self.note: str | None = None


class GpuprovBug(Exception):
    """A mistake in gpuprov's own code, never the user's input nor the machine's state: deliberately no
    GpuprovError, so the CLI says "gpuprov hit a bug" and keeps the traceback, and no `except GpuprovError` that
    carries on past a failing cloud or disk swallows it."""
