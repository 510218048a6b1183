"""store_failover: take the writer away from two checkpoint_store processes that share one bucket
and a real etcd (issue #53), again and again, while a client commits through both addresses; count
the failovers and check that no acknowledged commit is lost, none lands twice, and nothing the
deposed writer did after its successor started is visible.

Set-up (root: network namespaces): stores "a" and "b" each on a "host" of its own, a network
namespace joined to this one by a veth pair (as tests/multinode_test.cc does), each with its own
directory (its host's disk); Debian's etcd and libs/s3's fake S3 server as the bucket (it honours
`If-None-Match: *` on PUT as radosgw does; tests/store_failover_test.cc and the Ceph DR test run
on the real thing) on this side; `--writer_lease_ttl=2s --follow_interval=100ms
--change_log_snapshot_every=300` (so a new disk loads a snapshot and replays at most 300
records). The set-up is failover_fleet.py, the clients failover_clients.py.

The clients: three savers, threads of one ckpt_client.Client(store="A,B") each calling save()
of a model of its own once a second, each version a 64 KiB tensor drawn from its seed plus
step=seed; the first moves alias "serving" with every save, and `ckpt sync failover-0@serving
DIR --store=A,B` follows it for the whole campaign (row "ckpt sync": still running at the end,
and its CURRENT reaches the alias's version within 30 s, else lost), and a reader loads it
through `services/loader --store=A,B` every half second (row "reads": each read whole and its
seed's bytes, else torn; a read that raised is detected, the loader not riding through).
`services/console --store=A,B` is read as an operator's page reads it (row "services/console"):
the alias's version every half second (its step must be its save's seed, else torn; a failed
read is detected) and one live watch of the alias for the whole campaign (a break is detected;
ending anywhere but the alias's last version is lost).
save() is the code under test: it sends a commit that failed with UNAVAILABLE again, with one
idempotency key, for up to 10 s.
A save that raises anyway is "detected" (the caller was told; its seed may be committed, once).

Beside it, services/trainer runs against both addresses (--store=A,B), one run after another
(1 rank, 4,000 steps, a checkpoint every 1,000 and at the end, uploaded in the background),
3 s apart, each a new model: the
row "trainer runs" counts them; a run must finish (exit 0) through the failovers it meets
(crashes otherwise), every version it says it wrote must be listed (else lost), no step stored
twice (else torn); a checkpoint that failed and was trained past (--max_failed_checkpoints) is
detected.

Trials go round four scenarios:
  kill -9, back on its disk   SIGKILL of the writer; its host restarts on the same directory
                              and port: it catches up from the log and follows.
  kill -9, back on a new disk SIGKILL of the writer; its host restarts on an empty directory:
                              it rebuilds its index from the bucket and follows.
  pause past the lease        SIGSTOP of the writer for TTL + 1.5 s; the follower takes over;
                              SIGCONT: the old writer must step down (fenced by the log) and
                              follow.
  partition past the lease    the writer's veth taken down for TTL + 1.5 s: it runs on, cut off
                              from etcd, the bucket and the clients; the follower takes over;
                              the link back up: the old writer must have stepped down.
Each fault falls 0-80 ms after a save started, so it often catches one in flight. A trial waits
for the other store to take over and for the first save acknowledged after that: the time from
the fault to it is the failover (F1). Then the check, over the new writer:
  - every acknowledged seed of each saver is listed exactly once, at the version its save
    returned (else lost);
  - no seed is listed twice, and every listed version holds its seed's bytes (else torn);
  - the deposed writer steps down within 10 s of coming back (else torn: split brain);
and at the end both stores list the same versions with the same seeds (else torn). crashes = a
store that exited by itself or did not come up.
"""

import os
import signal
import sys
import time

import soak_lib
from failover_clients import (Committer, ConsoleReads, LoaderReads, SYNCED_ALIAS, TrainerRuns,
                              written_versions)
from failover_fleet import LEASE_TTL, Fleet

DESCRIPTION = ("kill -9, pause and partition the writer of two stores on one bucket and etcd "
               "(root: network namespaces); count failovers")
FULL_TRIALS = 120
SHORT_TRIALS = 8

TAKEOVER_TIMEOUT = 20.0
# Three savers, each its own model; the first moves alias "serving" with every save, which a
# `ckpt sync` follows for the whole campaign.
SAVERS = 3

KILL_SAME_DISK = "kill -9, back on its disk"
KILL_NEW_DISK = "kill -9, back on a new disk"
PAUSE = "pause past the lease"
PARTITION = "partition past the lease"
SCENARIOS = (KILL_SAME_DISK, PAUSE, KILL_NEW_DISK, PARTITION)
TRAINER_ROW = "trainer runs (through the failovers)"
SYNC_ROW = "ckpt sync of failover-0@serving (the whole campaign)"
LOADER_ROW = "reads of failover-0@serving through services/loader"
CONSOLE_ROW = "services/console: reads of failover-0@serving, one live watch"


def _poll_until(read, expected, deadline):
    """Calls `read` every 0.2 s until it returns `expected` or `deadline` (monotonic) passes;
    its last value (None when it raised: a store still starting, a file not yet written)."""
    while True:
        try:
            value = read()
        except Exception:  # noqa: BLE001 - not there yet.
            value = None
        if value == expected or time.monotonic() >= deadline:
            return value
        time.sleep(0.2)


class Campaign:
    def __init__(self, args, lib):
        self.args = args
        self.lib = lib
        self.table = soak_lib.Table("store_failover", extra_columns=[
            "failover p50 s", "failover p99 s", "failover max s", "commits acked",
            "replayed saves"])
        self.rows = {name: self.table.row(name) for name in SCENARIOS}
        self.trainer_row = self.table.row(TRAINER_ROW)
        self.sync_row = self.table.row(SYNC_ROW)
        self.loader_row = self.table.row(LOADER_ROW)
        self.console_row = self.table.row(CONSOLE_ROW)
        self.failover_seconds = {name: [] for name in SCENARIOS}
        self.fleet = Fleet(lib)
        self.checked = {}  # version -> seed, verified once.
        self.trainer_checkpoints = 0
        self.failures_seen = 0

    def run(self):
        try:
            return self.run_trials()
        finally:
            self.fleet.hosts.delete()  # the namespaces outlive their processes otherwise.

    def run_trials(self):
        client_dir = os.path.join(self.lib.repo_root, "clients", "python")
        if client_dir not in sys.path:
            sys.path.insert(0, client_dir)
        import torch  # noqa: E402  (Debian's torch 1.13, as the client needs)
        from ckpt_client import Client  # noqa: E402
        self.torch = torch
        fleet = self.fleet
        fleet.start_services()
        fleet.start("a")
        if not fleet.wait_for_role("a", "writer", TAKEOVER_TIMEOUT):
            raise soak_lib.StartError(f"store a never became the writer: "
                                      f"{fleet.stores['a'].log_tail()}")
        fleet.start("b")
        if not fleet.wait_for_role("b", "follower", TAKEOVER_TIMEOUT):
            raise soak_lib.StartError(f"store b never followed: {fleet.stores['b'].log_tail()}")
        self.client = Client(store=fleet.addresses(), timeout=30)
        self.committers = [Committer(self.client, torch, f"failover-{i}",
                                     SYNCED_ALIAS if i == 0 else None) for i in range(SAVERS)]
        # The first saver's saves are the ones the faults are timed against.
        self.committer = self.committers[0]
        for committer in self.committers:
            committer.start()
        self.trainer = TrainerRuns(self.lib, fleet.addresses())
        self.trainer.start()
        self.loader, loader_address = self.start_service("services/loader/loader", "loader")
        self.loader_reads = LoaderReads(self.lib, loader_address, self.committers[0])
        self.loader_reads.start()
        self.console, console_address = self.start_service(
            "services/console/console", "console", ["--web_dir=none"])
        self.console_reads = ConsoleReads(console_address, self.committers[0])
        self.console_reads.start()
        self.sync_dir = os.path.join(self.lib.work_dir, "serving")
        self.sync = self.lib.spawn(
            [self.lib.ckpt_binary(), "sync", f"failover-0@{SYNCED_ALIAS}", self.sync_dir,
             f"--store={fleet.addresses()}"], name="ckpt-sync")
        try:
            for trial in range(self.args.trials):
                if self.lib.out_of_time():
                    self.table.stop_early(f"--max_minutes reached after {trial} trials")
                    break
                scenario = SCENARIOS[trial % len(SCENARIOS)]
                if not self.trial(scenario, self.rows[scenario]):
                    self.table.stop_early(f"trial {trial + 1} left no writer to go on with")
                    break
        finally:
            for committer in self.committers:
                committer.stopping.set()
            self.trainer.stopping.set()
            self.loader_reads.stopping.set()
            for committer in self.committers:
                committer.join(60)
            self.trainer.join(330)
            self.loader_reads.join(60)
        self.final_check()
        self.check_sync()
        self.check_loader_reads()
        self.check_console()
        self.check_trainer_runs()
        self.summarize()
        self.client.close()
        return self.table

    def start_service(self, path, name, flags=()):
        """services/NAME against every store (--store=A,B) on 127.0.0.1:0: (its Process, its
        address)."""
        port_file = os.path.join(self.lib.work_dir, f"{name}.port")
        process = self.lib.spawn(
            [self.lib.binary(path), f"--store={self.fleet.addresses()}", "--listen=127.0.0.1:0",
             f"--port_file={port_file}", *flags], name=name)
        deadline = time.monotonic() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise soak_lib.StartError(f"the {name} did not start: {process.log_tail()}")
            time.sleep(0.05)
        return process, f"127.0.0.1:{open(port_file).read().strip()}"

    def writer(self):
        for name in sorted(self.fleet.stores):
            if self.fleet.role(name) == "writer" and self.fleet.stores[name].poll() is None:
                return name
        return None

    def trial(self, scenario, row):
        fleet = self.fleet
        old = self.writer()
        if old is None:
            row.fail("crashes", "no store says it is the writer")
            return False
        successor = "b" if old == "a" else "a"
        # At least one commit through the writer before the fault.
        before = time.monotonic()
        if not self.wait_for_ack_after(before, 15):
            row.fail("crashes", f"no commit acknowledged by writer {old} within 15 s")
            return False
        # The fault falls 0-80 ms into a save (a 64 KiB save takes tens of ms): often while it
        # is in flight, sometimes between its log record and its answer.
        self.committer.wait_for_next_save(10)
        time.sleep(self.lib.rng.uniform(0.0, 0.08))
        row.add("trials")
        fault = time.monotonic()
        if scenario == PAUSE:
            fleet.stores[old].signal(signal.SIGSTOP)
        elif scenario == PARTITION:
            fleet.hosts.cut(old)
        else:
            fleet.stores[old].kill()
            row.saw_rss(fleet.stores[old].max_rss_mib)
        took_over = fleet.wait_for_role(successor, "writer", TAKEOVER_TIMEOUT)
        # Only a save acknowledged once the successor said it writes is surely its own: the old
        # writer may have answered one in the moment between `fault` and the signal landing.
        # (The successor's log is polled every 20 ms, so F1 may be over-stated by up to the gap
        # to the next save; never under-stated.)
        acked = self.wait_for_ack_after(time.monotonic(), TAKEOVER_TIMEOUT)
        if not took_over or not acked:
            if scenario == PAUSE:
                fleet.stores[old].signal(signal.SIGCONT)
            elif scenario == PARTITION:
                fleet.hosts.heal(old)
            row.fail("crashes", f"{scenario}: {successor} took over: {took_over}, a commit "
                                f"acknowledged after the fault: {acked is not None}: "
                                f"{fleet.stores[successor].log_tail(600)}")
            return False
        self.failover_seconds[scenario].append(acked[0] - fault)
        if scenario in (PAUSE, PARTITION):
            # Past the lease whatever the failover took; then the old writer wakes up, or its
            # link comes back.
            time.sleep(max(0.0, fault + LEASE_TTL + 1.5 - time.monotonic()))
            if scenario == PAUSE:
                fleet.stores[old].signal(signal.SIGCONT)
            else:
                fleet.hosts.heal(old)
            if not fleet.wait_for_role(old, "follower", 10):
                row.fail("torn", f"split brain: the deposed writer {old} ({scenario}) did not "
                                 f"step down within 10 s of coming back: "
                                 f"{fleet.stores[old].log_tail(600)}")
        else:
            try:
                fleet.start(old, new_disk=scenario == KILL_NEW_DISK)
            except soak_lib.StartError as error:
                row.fail("crashes", f"{old} did not come back: {error}")
                return False
            if not fleet.wait_for_role(old, "follower", TAKEOVER_TIMEOUT):
                row.fail("crashes", f"{old} came back but never followed: "
                                    f"{fleet.stores[old].log_tail(600)}")
        self.count_detected(row)
        self.check(row, successor)
        return True

    def wait_for_ack_after(self, when, timeout):
        """The first save any saver got acknowledged after `when` (None after `timeout` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            acks = [ack for c in self.committers for ack in c.acks_after(when)]
            if acks:
                return min(acks)
            time.sleep(0.01)
        return None

    def count_detected(self, row):
        for committer in self.committers:
            with committer.lock:
                failures = committer.failures[committer.failures_seen:]
                committer.failures_seen = len(committer.failures)
            for seed, error in failures:
                row.add("detected")
                print(f"[store_failover] save of {committer.model} seed {seed} raised: {error}",
                      flush=True)

    def listing(self, name, model):
        """{version: seed} of `model` on store `name`, through its address alone."""
        from ckpt_client import Client  # noqa: E402
        with Client(store=self.fleet.address(name), timeout=30) as direct:
            return {info.version: direct.manifest(f"{model}@{info.version}").metadata.global_step
                    for info in direct.versions(model)}

    def listings(self, name):
        return {c.model: self.listing(name, c.model) for c in self.committers}

    def check(self, row, writer):
        for committer in self.committers:
            self.check_saver(row, writer, committer)

    def check_saver(self, row, writer, committer):
        model = committer.model
        # The acknowledgements first: a save acknowledged after the listing is not in it.
        with committer.lock:
            acks = list(committer.acks)
        try:
            listed = self.listing(writer, model)
        except Exception as error:  # noqa: BLE001
            row.fail("crashes", f"listing {model} on the writer {writer} failed: {error}")
            return
        by_seed = {}
        for version, seed in listed.items():
            by_seed.setdefault(seed, []).append(version)
        for seed, versions in by_seed.items():
            if len(versions) > 1:
                row.fail("torn", f"{model}: seed {seed} is committed {len(versions)} times: "
                                 f"{versions}")
        for _, version, seed, _ in acks:
            if listed.get(version) != seed:
                row.fail("lost", f"save of seed {seed} was acknowledged as {model}@{version}, "
                                 f"which holds {listed.get(version)}")
        for version, seed in sorted(listed.items()):
            if (model, version) in self.checked:
                continue
            state = self.client.load_state_dict(f"{model}@{version}")
            expected = committer.state(seed)
            if not all(self.torch.equal(state[key], expected[key]) for key in expected):
                row.fail("torn", f"{model}@{version} does not hold seed {seed}'s bytes")
            self.checked[(model, version)] = seed

    def final_check(self):
        row = self.rows[SCENARIOS[0]]
        writer = self.writer()
        if writer is None:
            row.fail("crashes", "no writer at the end")
            return
        follower = "b" if writer == "a" else "a"
        self.check(row, writer)  # the saves acknowledged since the last trial's check too.
        expected = self.listings(writer)
        deadline = time.monotonic() + 20
        followed = _poll_until(lambda: self.listings(follower), expected, deadline)
        if followed != expected:
            row.fail("torn", f"the follower {follower} and the writer {writer} never listed the "
                             f"same versions: {len(expected['failover-0'])} of failover-0 on "
                             f"the writer")
        for name, store in self.fleet.stores.items():
            if store.poll() is not None and not store.killed_by_us:
                row.fail("crashes", f"store {name} exited by itself: {store.log_tail(600)}")

    def check_sync(self):
        """`ckpt sync` followed the alias through every failover: still running, and within 30 s
        of the last save its CURRENT names the version the alias points at."""
        row = self.sync_row
        row.add("trials")
        writer = self.writer()
        if self.sync.poll() is not None:
            row.fail("crashes", f"ckpt sync exited with {self.sync.returncode}: "
                                f"{self.sync.log_tail(600)}")
            return
        expected = self.last_synced_version()
        if expected is None:
            return
        current = os.path.join(self.sync_dir, "failover-0", "CURRENT")

        def read_current():
            with open(current) as f:
                return int(f.read().strip())

        seen = _poll_until(read_current, expected, time.monotonic() + 30)
        if seen != expected:
            row.fail("lost", f"ckpt sync's CURRENT says {seen}, the alias is at {expected}: "
                             f"{self.sync.log_tail(600)}")
        self.sync_row.extra["commits acked"] = f"synced @{seen}"
        self.sync.stop()
        row.saw_rss(self.sync.max_rss_mib)

    def check_loader_reads(self):
        """Every read through the loader returned the alias's version whole (torn otherwise);
        reads that raised are detected: the loader's own retries did not ride through."""
        row = self.loader_row
        row.add("trials", self.loader_reads.reads)
        row.add("detected", len(self.loader_reads.failures))
        for failure in self.loader_reads.failures[:5]:
            print(f"[store_failover] a read through the loader raised: {failure}", flush=True)
        for torn in self.loader_reads.torn:
            row.fail("torn", torn)
        if self.loader.poll() is not None:
            row.fail("crashes", f"the loader exited with {self.loader.returncode}: "
                                f"{self.loader.log_tail(600)}")
        else:
            self.loader.stop()
        row.saw_rss(self.loader.max_rss_mib)

    def last_synced_version(self):
        """The version failover-0@serving points at, as the writer says (None: no writer)."""
        writer = self.writer()
        if writer is None:
            return None
        from ckpt_client import Client  # noqa: E402
        with Client(store=self.fleet.address(writer), timeout=30) as direct:
            return direct.resolve(f"failover-0@{SYNCED_ALIAS}")

    def check_console(self):
        """Every read through the console named the step its version was saved with (torn
        otherwise); reads that failed and watch streams that broke are detected; the watch ends
        at the alias's last version (lost otherwise: an operator's page left behind)."""
        row = self.console_row
        reads = self.console_reads
        expected = self.last_synced_version()
        if expected is not None:
            _poll_until(lambda: reads.watched_version, expected, time.monotonic() + 30)
        reads.stopping.set()
        reads.join(60)
        row.add("trials", reads.reads)
        row.add("detected", len(reads.failures) + len(reads.watch_breaks))
        for failure in (reads.failures + reads.watch_breaks)[:5]:
            print(f"[store_failover] through the console: {failure}", flush=True)
        for wrong in reads.wrong:
            row.fail("torn", wrong)
        if expected is not None and reads.watched_version != expected:
            row.fail("lost", f"the console's watch of failover-0@{SYNCED_ALIAS} ended at "
                             f"{reads.watched_version}, the alias is at {expected}")
        row.extra["commits acked"] = f"watched {reads.watch_events} moves"
        if self.console.poll() is not None:
            row.fail("crashes", f"the console exited with {self.console.returncode}: "
                                f"{self.console.log_tail(600)}")
        else:
            self.console.stop()
        row.saw_rss(self.console.max_rss_mib)

    def check_trainer_runs(self):
        """Every run finished (exit 0) through the failovers it met; each checkpoint it says it
        wrote is listed once, at its own step; none is listed twice."""
        row = self.trainer_row
        from ckpt_client import Client  # noqa: E402
        writer = self.writer()
        for model, result in self.trainer.runs:
            row.add("trials")
            row.saw_rss(result.max_rss_mib)
            output = result.stdout + result.stderr
            if not result.ok:
                row.fail("crashes", f"trainer run {model} did not finish: {result.describe()}")
                continue
            for line in output.splitlines():
                if "failed checkpoints (trained past):" in line:
                    row.add("detected", int(line.rsplit(":", 1)[1].split()[0]))
            written = written_versions(output)
            if written is None:
                row.fail("crashes", f"trainer run {model} printed no versions: {output[-400:]}")
                continue
            if writer is None:
                continue
            with Client(store=self.fleet.address(writer), timeout=30) as direct:
                steps = {info.version: direct.manifest(f"{model}@{info.version}")
                         .metadata.global_step for info in direct.versions(model)}
            for version in written:
                if version not in steps:
                    row.fail("lost", f"{model}@{version}, which the trainer wrote, is not listed")
            if len(set(steps.values())) != len(steps):
                row.fail("torn", f"{model} holds a step twice: {sorted(steps.values())}")
            self.trainer_checkpoints += len(steps)

    def summarize(self):
        acks = []
        for committer in self.committers:
            with committer.lock:
                acks += committer.acks
        replayed = sum(1 for ack in acks if ack[3])
        for name, row in self.rows.items():
            seconds = self.failover_seconds[name]
            if seconds:
                row.extra["failover p50 s"] = f"{soak_lib.percentile(seconds, 0.5):.2f}"
                row.extra["failover p99 s"] = f"{soak_lib.percentile(seconds, 0.99):.2f}"
                row.extra["failover max s"] = f"{max(seconds):.2f}"
        every = [s for name in SCENARIOS for s in self.failover_seconds[name]]
        first = self.rows[SCENARIOS[0]]
        first.extra["commits acked"] = str(len(acks))
        first.extra["replayed saves"] = str(replayed)
        self.trainer_row.extra["commits acked"] = str(self.trainer_checkpoints)
        if every:
            self.table.note(
                f"F1 over all {len(every)} failovers (lease TTL {LEASE_TTL:g} s): p50 "
                f"{soak_lib.percentile(every, 0.5):.2f} s, p99 "
                f"{soak_lib.percentile(every, 0.99):.2f} s, max {max(every):.2f} s. "
                f"{len(acks)} saves acknowledged ({SAVERS} savers), {replayed} of them answered "
                f"from the "
                f"idempotency key (an attempt whose answer was lost had committed); "
                f"{len(self.checked)} versions checked byte for byte.")


def run(args, lib):
    return Campaign(args, lib).run()
