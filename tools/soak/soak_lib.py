"""The shared machinery of the soak campaigns (tools/soak/soak.py runs them).

A campaign gets one `Soak` object (called `lib` in campaign modules). It offers:

- `lib.rng`: a `random.Random` seeded from --seed (plus the campaign name), so a run repeats;
- `lib.out_of_time()` / `lib.remaining_seconds()`: the --max_minutes wall-clock budget. Every
  campaign checks it between trials and stops cleanly; `Table.stop_early()` records why;
- `lib.binary(label_path)`: a built binary, from Bazel runfiles (under `bazel run //tools/soak`)
  or from --bin_dir (default: the repository's bazel-bin when run from a source tree);
- `lib.run(argv, ...)` and `lib.ckpt(args, ...)`: run a child to completion, with a timeout, and
  get its status, output and peak RSS (`Result`);
- `lib.spawn(argv, ...)`: a long-running child (`Process`), killed by `kill()` / `stop()`;
- `lib.start_store(db_path)`: the checkpoint_store service on 127.0.0.1:0 (`StoreProcess`,
  `.address` = "127.0.0.1:PORT" read from its --port_file);
- `lib.stubs()`: the ckpt.v1 gRPC modules (through clients/python's ckpt_client), for campaigns
  that talk gRPC directly;
- `lib.python`: Debian's /usr/bin/python3 (torch 1.13, grpcio), for helper scripts;
- `lib.work_dir`: a scratch directory for this campaign (--work_dir, or a fresh temporary one).

Every child a campaign starts is reaped with wait4(), so its peak RSS (ru_maxrss) is known; a
campaign attributes it to a row with `row.saw_rss(result.max_rss_mib)` and `lib.max_rss_mib`
is the peak over every child. Children still running when the campaign returns (or raises) are
SIGKILLed and reaped by the driver, so a campaign never leaves processes behind.

Results go in a `Table`: one `Row` per scenario with the standard columns
(trials, detected, silent, crashes, lost, torn, max RSS MiB) and optional extra columns a
campaign names (e.g. "p50 ms"). `row.fail(kind, message)` counts a silent/crash/lost/torn
trial and keeps the message for the report. `table.markdown()` renders it.
"""

import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

STANDARD_COLUMNS = ("trials", "detected", "silent", "crashes", "lost", "torn")
# The columns whose non-zero value fails the campaign.
FAILURE_COLUMNS = ("silent", "crashes", "lost", "torn")
MAX_MESSAGES = 20  # failure messages kept per row for the report.

DEBIAN_PYTHON = "/usr/bin/python3"


class Row:
    """One scenario's counts. Increment the attributes directly or through the helpers."""

    def __init__(self, name, extra_columns):
        self.name = name
        self.trials = 0
        self.detected = 0
        self.silent = 0
        self.crashes = 0
        self.lost = 0
        self.torn = 0
        self.max_rss_mib = 0.0
        self.extra = {column: "" for column in extra_columns}
        self.messages = []
        self._lock = threading.Lock()

    def add(self, column, n=1):
        """Adds n to a standard column (thread-safe)."""
        if column not in STANDARD_COLUMNS:
            raise ValueError(f"unknown column {column!r}; standard columns: {STANDARD_COLUMNS}")
        with self._lock:
            setattr(self, column, getattr(self, column) + n)

    def fail(self, column, message):
        """Counts one silent/crashes/lost/torn event and keeps its message."""
        if column not in FAILURE_COLUMNS:
            raise ValueError(f"{column!r} is not a failure column {FAILURE_COLUMNS}")
        self.add(column)
        with self._lock:
            if len(self.messages) < MAX_MESSAGES:
                self.messages.append(f"{column}: {message}")
        print(f"[{self.name}] {column.upper()}: {message}", file=sys.stderr, flush=True)

    def saw_rss(self, mib):
        if mib is not None:
            with self._lock:
                self.max_rss_mib = max(self.max_rss_mib, mib)

    def failed(self):
        return any(getattr(self, column) for column in FAILURE_COLUMNS)


class Table:
    """A campaign's result: rows in insertion order, notes printed under the table."""

    def __init__(self, campaign, extra_columns=()):
        self.campaign = campaign
        self.extra_columns = list(extra_columns)
        self.rows = {}
        self.notes = []
        self.stopped_early = None

    def row(self, name):
        """The row for scenario `name`, created on first use."""
        if name not in self.rows:
            self.rows[name] = Row(name, self.extra_columns)
        return self.rows[name]

    def note(self, text):
        self.notes.append(text)

    def stop_early(self, reason):
        """Records that the campaign stopped before its trial count (budget, interrupt)."""
        self.stopped_early = reason

    def failed(self):
        return any(row.failed() for row in self.rows.values())

    def markdown(self):
        header = ["scenario", *STANDARD_COLUMNS, "max RSS MiB", *self.extra_columns]
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
        ]
        for row in self.rows.values():
            cells = [row.name] + [str(getattr(row, c)) for c in STANDARD_COLUMNS]
            cells.append(f"{row.max_rss_mib:.0f}")
            cells += [str(row.extra.get(c, "")) for c in self.extra_columns]
            lines.append("| " + " | ".join(cells) + " |")
        text = f"### {self.campaign}\n\n" + "\n".join(lines) + "\n"
        if self.stopped_early:
            text += f"\nStopped early: {self.stopped_early}\n"
        for note in self.notes:
            text += f"\n{note}\n"
        messages = [m for row in self.rows.values() for m in
                    (f"{row.name}: {x}" for x in row.messages)]
        if messages:
            text += "\nFailures (first of each row):\n\n" + "\n".join(
                f"- {m}" for m in messages) + "\n"
        return text


class Result:
    """A finished child: argv, returncode (negative: killed by that signal), stdout, stderr
    (text), seconds, max_rss_mib, timed_out (we SIGKILLed it at its timeout)."""

    def __init__(self, argv, returncode, stdout, stderr, seconds, max_rss_mib, timed_out):
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.seconds = seconds
        self.max_rss_mib = max_rss_mib
        self.timed_out = timed_out

    @property
    def ok(self):
        return self.returncode == 0

    @property
    def crashed(self):
        """Died of a signal we did not send (SIGSEGV, SIGABRT from an assertion, ...), or a
        sanitizer report. A timeout is not a crash (the caller decides what it is)."""
        if self.timed_out:
            return False
        if self.returncode is not None and self.returncode < 0:
            return True
        return "AddressSanitizer" in self.stderr or "runtime error:" in self.stderr

    def describe(self):
        status = ("timed out" if self.timed_out else
                  f"signal {-self.returncode}" if self.returncode < 0 else
                  f"exit {self.returncode}")
        tail = (self.stderr.strip() or self.stdout.strip())[-400:]
        args = " ".join(a if len(a) < 80 else a[:40] + "..." for a in self.argv[1:4])
        return f"{os.path.basename(self.argv[0])} {args}: {status}: {tail}"


def _rss_mib(rusage):
    return rusage.ru_maxrss / 1024.0  # Linux reports KiB.


class Process:
    """A child started with Soak.spawn. Its stdout/stderr go to log files under the work dir."""

    def __init__(self, soak, argv, log_path, env=None, cwd=None):
        self._soak = soak
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                      start_new_session=True)
        self.pid = self.popen.pid
        self.returncode = None
        self.max_rss_mib = None
        self.killed_by_us = False
        soak._register(self)

    def poll(self):
        """The exit status if it has ended (reaping it), else None."""
        if self.returncode is None:
            pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
            if pid == self.pid:
                self._reaped(status, rusage)
        return self.returncode

    def _reaped(self, status, rusage):
        self.returncode = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                           else os.WEXITSTATUS(status))
        self.popen.returncode = self.returncode  # so Popen does not try to reap it again.
        self.max_rss_mib = _rss_mib(rusage)
        self._soak._reaped(self)
        self._log.close()

    def wait(self, timeout=None):
        """Waits for the exit; returns the status, or None at the timeout (still running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.01)  # polling a child's exit; wait4 without WNOHANG cannot time out.
        return self.returncode

    def signal(self, signum):
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self):
        """SIGKILL (the process only, not its children) and reap. Returns the status."""
        if self.returncode is None:
            self.killed_by_us = True
            self.signal(signal.SIGKILL)
            pid, status, rusage = os.wait4(self.pid, 0)
            self._reaped(status, rusage)
        return self.returncode

    def kill_group(self):
        """SIGKILL the process and everything in its session (launchers with rank children)."""
        if self.returncode is None:
            self.killed_by_us = True
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.kill()

    def stop(self, grace=10.0):
        """SIGTERM, then SIGKILL after `grace` seconds. Returns the status."""
        self.signal(signal.SIGTERM)
        if self.wait(grace) is None:
            return self.kill()
        return self.returncode

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


class StoreProcess(Process):
    """The checkpoint_store service on 127.0.0.1:0. `address` is set once it serves."""

    address = None
    port = None


class StartError(Exception):
    """A service did not come up (it exited, or did not write its port file in time)."""


class Soak:
    """Everything a campaign needs; see the module docstring."""

    def __init__(self, args, campaign):
        self.args = args
        self.campaign = campaign
        self.short = bool(getattr(args, "short", False))
        seed = getattr(args, "seed", 1)
        self.seed = seed
        self.rng = random.Random(f"{campaign}:{seed}")
        self.started = time.monotonic()
        self.max_minutes = getattr(args, "max_minutes", None)
        self.deadline = (None if not self.max_minutes else
                         self.started + 60.0 * float(self.max_minutes))
        self.python = DEBIAN_PYTHON
        self.repo_root = _repo_root()
        self.bin_dir = getattr(args, "bin_dir", None)
        base = getattr(args, "work_dir", None)
        if base:
            os.makedirs(base, exist_ok=True)
            self.work_dir = tempfile.mkdtemp(prefix=f"{campaign}-", dir=base)
        else:
            self.work_dir = tempfile.mkdtemp(prefix=f"soak-{campaign}-")
        self.max_rss_mib = 0.0
        self._children = {}
        self._lock = threading.Lock()
        self._spawned = 0

    # --- time budget ---------------------------------------------------------------------

    def remaining_seconds(self):
        if self.deadline is None:
            return float("inf")
        return self.deadline - time.monotonic()

    def out_of_time(self):
        return self.remaining_seconds() <= 0

    def elapsed_seconds(self):
        return time.monotonic() - self.started

    # --- binaries -------------------------------------------------------------------------

    def binary(self, path):
        """A built binary by its workspace path, e.g. "tools/ckpt/ckpt"."""
        candidates = []
        if self.bin_dir:
            candidates.append(os.path.join(self.bin_dir, path))
        runfiles = os.environ.get("RUNFILES_DIR")
        if runfiles:
            candidates.append(os.path.join(runfiles, "ckpt", path))
        # Under `bazel run` this file sits in the runfiles tree beside the data deps.
        candidates.append(os.path.join(self.repo_root, path))
        candidates.append(os.path.join(self.repo_root, "bazel-bin", path))
        for candidate in candidates:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return os.path.abspath(candidate)
        raise FileNotFoundError(
            f"{path} is not built: looked in {', '.join(candidates)}; build it (bazel build "
            f"//{os.path.dirname(path)}) or pass --bin_dir=BAZEL_BIN")

    def ckpt_binary(self):
        return self.binary("tools/ckpt/ckpt")

    # --- children -------------------------------------------------------------------------

    def _register(self, process):
        with self._lock:
            self._children[process.pid] = process

    def _reaped(self, process):
        with self._lock:
            self._children.pop(process.pid, None)
            if process.max_rss_mib:
                self.max_rss_mib = max(self.max_rss_mib, process.max_rss_mib)

    def log_path(self, name):
        with self._lock:
            self._spawned += 1
            n = self._spawned
        return os.path.join(self.work_dir, f"{name}.{n}.log")

    def spawn(self, argv, name=None, env=None, cwd=None):
        """Starts a long-running child; its output goes to WORK_DIR/NAME.N.log."""
        name = name or os.path.basename(argv[0])
        return Process(self, list(argv), self.log_path(name), env=env, cwd=cwd)

    def run(self, argv, timeout=120.0, env=None, cwd=None, input_bytes=None):
        """Runs a child to completion (its session SIGKILLed at `timeout` s); returns a Result."""
        argv = list(argv)
        start = time.monotonic()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                tempfile.TemporaryFile() as stdin:
            if input_bytes:
                stdin.write(input_bytes)
                stdin.seek(0)
            # Output goes to files and the child is reaped with wait4 (not Popen.wait, which
            # drops the rusage), so its peak RSS is known.
            popen = subprocess.Popen(argv, stdout=out, stderr=err, stdin=stdin, env=env,
                                     cwd=cwd, start_new_session=True)
            with self._lock:
                self._children[popen.pid] = popen
            timed_out = False
            delay = 0.001
            while True:
                pid, status, rusage = os.wait4(popen.pid, os.WNOHANG)
                if pid == popen.pid:
                    break
                if time.monotonic() - start > timeout and not timed_out:
                    timed_out = True
                    try:
                        os.killpg(popen.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(delay)
                delay = min(0.02, delay * 2)
            returncode = (-os.WTERMSIG(status) if os.WIFSIGNALED(status) else
                          os.WEXITSTATUS(status))
            popen.returncode = returncode
            rss = _rss_mib(rusage)
            with self._lock:
                self._children.pop(popen.pid, None)
                self.max_rss_mib = max(self.max_rss_mib, rss)
            out.seek(0)
            err.seek(0)
            return Result(argv, returncode, out.read().decode("utf-8", "replace"),
                          err.read().decode("utf-8", "replace"), time.monotonic() - start, rss,
                          timed_out)

    def ckpt(self, args, store=None, store_dir=None, timeout=120.0):
        """Runs the ckpt CLI against a service (`store`="HOST:PORT") or a directory."""
        argv = [self.ckpt_binary(), *args]
        if store:
            argv.append(f"--store={store}")
        if store_dir:
            argv.append(f"--store_dir={store_dir}")
        return self.run(argv, timeout=timeout)

    def start_store(self, db_path, flags=(), start_timeout=60.0, wrapper=()):
        """Starts checkpoint_store on 127.0.0.1:0 over `db_path` and waits until it serves.
        `wrapper` goes before the binary (e.g. `ip netns exec NS`, which execs it: the pid is
        the store's).

        Raises StartError (with its log) if it exits or does not write its port file."""
        port_file = os.path.join(self.work_dir, f"store.port.{time.monotonic_ns()}")
        argv = [*wrapper, self.binary("services/checkpoint_store/checkpoint_store"),
                f"--store_dir={db_path}", "--listen=127.0.0.1:0", f"--port_file={port_file}",
                *flags]
        process = StoreProcess(self, argv, self.log_path("checkpoint_store"))
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    process.port = int(text)
                    process.address = f"127.0.0.1:{process.port}"
                    os.unlink(port_file)
                    return process
            except FileNotFoundError:
                pass
            if process.poll() is not None:
                raise StartError(f"checkpoint_store exited with {process.returncode} during "
                                 f"start-up: {process.log_tail()}")
            if time.monotonic() > deadline:
                process.kill()
                raise StartError(f"checkpoint_store wrote no port file in {start_timeout:.0f} s:"
                                 f" {process.log_tail()}")
            time.sleep(0.005)  # polling a file the child writes atomically.

    # --- gRPC -----------------------------------------------------------------------------

    def stubs(self):
        """The generated ckpt.v1 modules (types_pb2, checkpoint_store_pb2, ..._pb2_grpc)."""
        client_dir = os.path.join(self.repo_root, "clients", "python")
        if client_dir not in sys.path:
            sys.path.insert(0, client_dir)
        from ckpt_client import _stubs  # pylint: disable=import-outside-toplevel
        return _stubs.load()

    def cleanup(self):
        """Kills and reaps every child still running (the driver calls it at the end)."""
        with self._lock:
            children = list(self._children.values())
        for child in children:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                if isinstance(child, Process):
                    child.kill()
                # A lib.run child is reaped by its own (timed) loop.
            except ChildProcessError:
                pass


def _repo_root():
    # tools/soak/soak_lib.py -> the repository (or the runfiles' workspace directory).
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def percentile(values, fraction):
    """The nearest-rank percentile of `values` (fraction in [0, 1]); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]
