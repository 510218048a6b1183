"""trainer_kill: SIGKILL one trainer rank at random moments; the run restarts its ranks
(--max_restarts), resumes from its latest checkpoint and must end bit-exact with an uninterrupted
run of the same configuration.

One uninterrupted reference run (gloo, CPU, 2 ranks, a small MLP on the synthetic task,
checkpoints every 25 steps) is trained once. Then runs of the same configuration with
--max_restarts=K are each killed K times (--kills_per_run, default 5): wait until the current
incarnation of the ranks is training (a progress line after the last restart), wait a random
0.2-2 s more, SIGKILL a random rank. The launcher must notice, restart all ranks, and they resume
from the latest version. At the end the run's latest version (model + optimizer + scheduler,
exported with `ckpt export --bundle`) is compared with the reference's by compare_bundles.py:
every tensor bitwise and every plain value (steps, lr, scheduler counters, trainer state).

The final state alone cannot tell a resume from the latest checkpoint from a resume from an older
one (or from step 0): training is deterministic, so both end bit-exact. So every restart's resume
point is checked too. Each incarnation of the ranks logs its run id ("trainer: run ID") and where
it starts ("trainer: resuming MODEL@V from step S" or "starting fresh"), and stamps every version
it commits with that run id (lineage.run_id). After the run, the versions the store holds (read
through the checkpoint_store service) say which checkpoints the killed incarnations committed: the
restart must resume from the newest of them, @V at its step S, the last checkpoint acknowledged
before the kill (a commit still in flight at the kill counts once the store holds it).

trials = kills made; detected = restarts the launcher reported for them; silent = runs that ended
with a final state differing from the reference (counted once per run); crashes = runs that did
not exit 0 (or a rank that died of a signal nobody sent, reported by the launcher); lost = runs
that ended without a final version at the last step, and restarts that resumed from another
checkpoint than the last one acknowledged before them (each counted).
"""

import collections
import os
import re
import shutil
import time

import soak_lib

DESCRIPTION = "SIGKILL a trainer rank at random moments; the resumed run must be bit-exact"
FULL_TRIALS = 200
SHORT_TRIALS = 5

MODEL = "mlp-synthetic"
ROW = "SIGKILL a rank (gloo, CPU, 2 ranks)"
RUN_TIMEOUT = 600.0

# The comparison of two bundles, shared with tools/gpu_check.sh: prints "equal N" or "differ ...".
COMPARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare_bundles.py")


def add_args(parser):
    parser.add_argument("--kills_per_run", type=int, default=5,
                        help="kills (and --max_restarts) per killed run (default 5)")
    parser.add_argument("--train_steps", type=int, default=2000,
                        help="optimizer steps of each run (default 2000)")
    parser.add_argument("--zero", type=int, default=0, choices=(0, 1),
                        help="the trainer's --zero (1: ZeRO-1, each rank holds and checkpoints "
                             "its slice of the optimizer state; default 0)")


def config_flags(args, store_dir):
    return ["--backend=gloo", "--device=cpu", "--nproc_per_node=2", f"--steps={args.train_steps}",
            "--checkpoint_every=25", "--log_every=10", "--hidden=64", f"--zero={args.zero}",
            f"--store_dir={store_dir}"]


def children(pid):
    """Pids whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces; fields after its closing parenthesis.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def rank_pids(launcher):
    """{rank: pid} of the launcher's rank processes."""
    ranks = {}
    for pid in children(launcher):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                ranks[int(item[5:])] = pid
    return ranks


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# One start of the ranks, as its log header names it.
Incarnation = collections.namedtuple("Incarnation", "run_id resumed_version resumed_step")

RUN_LINE = re.compile(r"^trainer: run (\S+?)(?:,|$)")
START_LINE = re.compile(r"^trainer: (?:resuming \S+@(\d+)|starting fresh) from step (\d+) to ")


def incarnations(text):
    """Every start of the ranks in a launcher's log, in order: Incarnation(run_id, version it
    resumed from or None, step it started at)."""
    found = []
    run_id = None
    for line in text.splitlines():
        match = RUN_LINE.match(line)
        if match:
            run_id = match.group(1)
            continue
        match = START_LINE.match(line)
        if match and run_id is not None:
            version = int(match.group(1)) if match.group(1) else None
            found.append(Incarnation(run_id, version, int(match.group(2))))
            run_id = None
    return found


def check_resumes(starts, versions):
    """Problems with where each restart resumed: `starts` from incarnations(), `versions`
    {version: (run_id, global_step)} as the store holds them. Restart k must resume from the
    newest version an earlier incarnation committed, at that version's step."""
    problems = []
    earlier = set()
    for k, start in enumerate(starts):
        if k > 0:
            committed = [v for v, (run_id, _) in versions.items() if run_id in earlier]
            expected = max(committed) if committed else None
            expected_step = versions[expected][1] if expected is not None else 0
            if start.resumed_version != expected or start.resumed_step != expected_step:
                where = (f"@{start.resumed_version}" if start.resumed_version is not None
                         else "nothing (fresh)")
                last = f"@{expected}" if expected is not None else "none"
                problems.append(f"restart {k} resumed from {where} at step {start.resumed_step}, "
                                f"but the last checkpoint acknowledged before it was {last} at "
                                f"step {expected_step}")
        earlier.add(start.run_id)
    return problems


def export(lib, store_dir, out):
    result = lib.ckpt(["export", f"{MODEL}@latest", out, "--bundle"], store_dir=store_dir,
                      timeout=300)
    return result


class Campaign:
    def __init__(self, args, lib):
        self.args = args
        self.lib = lib
        self.table = soak_lib.Table("trainer_kill",
                                    extra_columns=["runs", "exact runs", "resumes checked"])
        self.row = self.table.row(ROW)
        self.runs = 0
        self.exact = 0
        self.resumes_checked = 0

    def reference(self):
        store = os.path.join(self.lib.work_dir, "reference")
        result = self.lib.run([self.lib.binary("services/trainer/trainer"),
                               *config_flags(self.args, store)], timeout=RUN_TIMEOUT)
        self.row.saw_rss(result.max_rss_mib)
        if not result.ok:
            raise RuntimeError(f"the uninterrupted reference run failed: {result.describe()}")
        out = os.path.join(self.lib.work_dir, "reference.pt")
        exported = export(self.lib, store, out)
        if not exported.ok:
            raise RuntimeError(f"exporting the reference failed: {exported.describe()}")
        self.reference_seconds = result.seconds
        return out

    def stored_versions(self, store):
        """{version: (lineage.run_id, global_step)} of MODEL in the store at `store`, through the
        checkpoint_store service."""
        pb = self.lib.stubs()
        grpc = __import__("grpc")
        service = self.lib.start_store(store)
        versions = {}
        try:
            with grpc.insecure_channel(service.address) as channel:
                stub = pb.checkpoint_store_pb2_grpc.CheckpointStoreStub(channel)
                token = ""
                while True:
                    response = stub.ListVersions(
                        pb.checkpoint_store_pb2.ListVersionsRequest(model=MODEL, page_token=token),
                        timeout=120)
                    for info in response.versions:
                        versions[info.version] = (info.metadata.lineage.run_id,
                                                  info.metadata.global_step)
                    token = response.next_page_token
                    if not token:
                        return versions
        finally:
            service.stop()

    def check_resume_points(self, index, text, restarts, store):
        """Counts a restart that resumed from another checkpoint than the last one acknowledged
        before it as lost."""
        starts = incarnations(text)
        if len(starts) != restarts + 1:
            self.row.fail("crashes", f"run {index}: {restarts} restarts but {len(starts)} starts "
                                     f"of the ranks in the log")
            return
        problems = check_resumes(starts, self.stored_versions(store))
        for problem in problems:
            self.row.fail("lost", f"run {index}: {problem}")
        self.resumes_checked += restarts - len(problems)

    def killed_run(self, index, kills, reference):
        lib, rng, row = self.lib, self.lib.rng, self.row
        store = os.path.join(lib.work_dir, f"run{index}")
        launcher = lib.spawn([lib.binary("services/trainer/trainer"),
                              *config_flags(self.args, store), f"--max_restarts={kills}"],
                             name=f"trainer-run{index}")
        log = launcher.log_path
        made = 0
        try:
            while made < kills:
                # Wait for this incarnation to train: a progress line after the last restart.
                deadline = time.monotonic() + 180
                training = False
                while time.monotonic() < deadline and launcher.poll() is None:
                    text = read(log)
                    restarts = text.count("restarting all ranks")
                    tail = text.split("restarting all ranks")[-1]
                    if restarts == made and re.search(r"step \d+/", tail):
                        training = True
                        break
                    time.sleep(0.05)  # polling another process's log.
                if not training:
                    break
                time.sleep(rng.uniform(0.2, 2.0))
                ranks = rank_pids(launcher.pid)
                if launcher.poll() is not None or not ranks:
                    break
                rank = rng.choice(sorted(ranks))
                try:
                    os.kill(ranks[rank], 9)
                except ProcessLookupError:
                    continue  # it ended on its own just now; draw again.
                made += 1
                row.trials += 1
            status = launcher.wait(RUN_TIMEOUT)
            if status is None:
                launcher.kill_group()
                status = launcher.returncode
        finally:
            if launcher.returncode is None:
                launcher.kill_group()
        row.saw_rss(launcher.max_rss_mib)
        text = read(log)
        restarts = text.count("restarting all ranks")
        row.detected += min(restarts, made)
        self.runs += 1
        if made < kills:
            self.table.note(f"run {index}: the run ended after {made} of {kills} kills "
                            f"(it finished training first)")
        if status != 0:
            row.fail("crashes", f"run {index}: the launcher exited {status} after {made} kills:"
                                f" {text[-600:]}")
            return
        if restarts != made:
            row.fail("crashes", f"run {index}: {made} kills but {restarts} restarts")
        final = re.search(rf"finished at step (\d+) of {self.args.train_steps}", text)
        if not final or int(final.group(1)) != self.args.train_steps:
            row.fail("lost", f"run {index}: did not finish at step {self.args.train_steps}")
            return
        self.check_resume_points(index, text, restarts, store)
        out = os.path.join(lib.work_dir, f"run{index}.pt")
        exported = export(lib, store, out)
        row.saw_rss(exported.max_rss_mib)
        if not exported.ok:
            row.fail("lost", f"run {index}: export failed: {exported.describe()}")
            return
        verdict = lib.run([lib.python, COMPARE, reference, out], timeout=300)
        if not verdict.ok or not verdict.stdout.startswith(("equal", "differ")):
            raise RuntimeError(f"comparing run {index} failed: {verdict.describe()}")
        if verdict.stdout.startswith("equal"):
            self.exact += 1
        else:
            row.fail("silent", f"run {index} ({made} kills) is not bit-identical to the "
                               f"uninterrupted run: {verdict.stdout.strip()}")
        # Keep the scratch small: the stores of finished runs are not needed again.
        os.unlink(out)
        shutil.rmtree(store, ignore_errors=True)

    def run(self):
        args = self.args
        if args.kills_per_run < 1:
            raise ValueError("--kills_per_run must be at least 1")
        reference = self.reference()
        index = 0
        while self.row.trials < args.trials:
            if self.lib.out_of_time():
                self.table.stop_early(f"--max_minutes={args.max_minutes} reached after "
                                      f"{self.row.trials} of {args.trials} kills")
                break
            index += 1
            before = self.row.trials
            self.killed_run(index, min(args.kills_per_run, args.trials - self.row.trials),
                            reference)
            if self.row.trials == before:
                raise RuntimeError(f"run {index} could not be killed even once; "
                                   f"make --train_steps larger")
            print(f"trainer_kill: {self.row.trials} kills in {index} runs, {self.exact} exact, "
                  f"{self.lib.elapsed_seconds():.0f} s", flush=True)
        self.row.extra["runs"] = self.runs
        self.row.extra["exact runs"] = self.exact
        self.row.extra["resumes checked"] = self.resumes_checked
        self.table.note(
            f"Config: {' '.join(config_flags(args, 'DIR'))}; {args.kills_per_run} kills (and "
            f"--max_restarts) per run; the uninterrupted reference took "
            f"{self.reference_seconds:.0f} s. 'exact runs': runs whose final model + optimizer"
            f" + scheduler state is bit-identical to the reference's. 'resumes checked': restarts"
            f" that resumed from the last checkpoint acknowledged before them (lineage.run_id"
            f" of the stored versions).")
        return self.table


def run(args, lib):
    return Campaign(args, lib).run()
