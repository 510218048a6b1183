"""The clients of the store_failover campaign (store_failover.py), each riding through its
failovers: savers (the Python client's save()), services/trainer runs, reads through
services/loader, and an operator's page on services/console (its API reads and live watch)."""

import json
import threading
import time
import urllib.error
import urllib.request

WEIGHT_ELEMENTS = 16 << 10  # float32: 64 KiB.
# Seconds between saves. A trainer checkpoints minutes apart; one a second keeps a save in flight
# at most faults while the log grows by 3 records a save (the commit and its audit record's two).
SAVE_PAUSE = 1.0
# The alias the first saver moves with every save, which `ckpt sync` and the loader's reader follow.
SYNCED_ALIAS = "serving"


class Committer(threading.Thread):
    """save() of `model` back to back (moving `alias` with each, when given); every acknowledged
    (version, seed) and when it returned."""

    def __init__(self, client, torch, model, alias=None):
        super().__init__(daemon=True)
        self.client = client
        self.torch = torch
        self.model = model
        self.alias = alias
        self.failures_seen = 0  # failures already counted as detected.
        self.lock = threading.Lock()
        self.acks = []  # (monotonic time, version, seed, replayed)
        self.failures = []  # (seed, error text)
        self.next_seed = 1
        self.stopping = threading.Event()
        self.save_started = threading.Condition(self.lock)
        self.saves_started = 0

    def state(self, seed):
        generator = self.torch.Generator().manual_seed(seed)
        return {"weight": self.torch.randn(WEIGHT_ELEMENTS, generator=generator),
                "seed": self.torch.full((4,), seed, dtype=self.torch.int64)}

    def run(self):
        while not self.stopping.is_set():
            seed = self.next_seed
            self.next_seed += 1
            with self.lock:
                self.saves_started += 1
                self.save_started.notify_all()
            try:
                saved = self.client.save(self.model, self.state(seed), step=seed,
                                         alias=self.alias, timeout=30)
                with self.lock:
                    self.acks.append((time.monotonic(), saved.version, seed, saved.replayed))
            except Exception as error:  # noqa: BLE001 - every failure is a row count.
                with self.lock:
                    self.failures.append((seed, f"{type(error).__name__}: {error}"))
            time.sleep(SAVE_PAUSE)

    def wait_for_next_save(self, timeout):
        """Returns once a save has started after the call (False after `timeout` s)."""
        with self.lock:
            started = self.saves_started
            return self.save_started.wait_for(lambda: self.saves_started > started, timeout)

    def acks_after(self, when):
        with self.lock:
            return [ack for ack in self.acks if ack[0] > when]

    def seed_of(self, version):
        """The seed of the acknowledged save that made `version` (None: not acknowledged)."""
        with self.lock:
            return next((seed for _, acked, seed, _ in self.acks if acked == version), None)


class TrainerRuns(threading.Thread):
    """services/trainer against every store (--store=A,B), run after run while the campaign
    lasts, each a new model: one rank, TRAIN_STEPS steps, a checkpoint every CHECKPOINT_EVERY
    (its upload in the background, as by default). Each run's exit status and what it printed."""

    # One epoch (131,072 examples, batch 32), so the checkpoints are the 4 periodic ones and the
    # last; runs 3 s apart. The log grows by 3 records a checkpoint, and a new disk replays all.
    TRAIN_STEPS = 4000
    CHECKPOINT_EVERY = 1000
    PAUSE_SECONDS = 3.0

    def __init__(self, lib, addresses):
        super().__init__(daemon=True)
        self.lib = lib
        self.addresses = addresses
        self.stopping = threading.Event()
        self.runs = []  # (model, Result)

    def run(self):
        while not self.stopping.is_set():
            model = f"trainer-{len(self.runs) + 1}"
            result = self.lib.run(
                [self.lib.binary("services/trainer/trainer"), f"--store={self.addresses}",
                 "--backend=gloo", "--device=cpu", "--nproc_per_node=1",
                 f"--steps={self.TRAIN_STEPS}", f"--checkpoint_every={self.CHECKPOINT_EVERY}",
                 "--synthetic_examples=131072", "--log_every=100000", "--hidden=64",
                 f"--model_name={model}"], timeout=300)
            self.runs.append((model, result))
            self.stopping.wait(self.PAUSE_SECONDS)


class LoaderReads(threading.Thread):
    """services/loader against every store (--store=A,B), and a reader loading
    failover-0@serving through it every half second, as a serving fleet would: each read's
    outcome, and whether its bytes were the seed's its step names."""

    def __init__(self, lib, loader_address, committer):
        super().__init__(daemon=True)
        self.lib = lib
        self.loader_address = loader_address
        self.committer = committer
        self.stopping = threading.Event()
        self.reads = 0
        self.failures = []  # error text of the reads that raised.
        self.torn = []

    def run(self):
        from ckpt_client import Client  # noqa: E402
        with Client(loader=self.loader_address, timeout=30) as client:
            while not self.stopping.wait(0.5):
                ref = f"failover-0@{SYNCED_ALIAS}"
                try:
                    state = client.load_state_dict(ref)
                except Exception as error:  # noqa: BLE001 - counted, not raised.
                    if "no alias" in str(error) or "no model" in str(error):
                        continue  # nothing saved yet.
                    self.failures.append(f"{type(error).__name__}: {error}")
                    self.reads += 1
                    continue
                self.reads += 1
                seed = int(state["seed"][0])
                expected = self.committer.state(seed)
                if not all(self.committer.torch.equal(state[k], expected[k]) for k in expected):
                    self.torn.append(f"{ref} read as seed {seed} holds other bytes")


class ConsoleReads(threading.Thread):
    """services/console against every store (--store=A,B), as an operator's open page uses it:
    GET .../failover-0/versions/serving every half second (the version's step must be the seed
    its save was acknowledged with, else wrong), and one live watch of the alias (GET
    /api/v1/watch, Server-Sent Events) for the whole campaign, which must never break (the
    console's store client resumes it) and must end at the alias's last version."""

    def __init__(self, console_address, committer):
        super().__init__(daemon=True)
        self.base = f"http://{console_address}/api/v1"
        self.committer = committer
        self.stopping = threading.Event()
        self.reads = 0
        self.failures = []  # reads that failed: an HTTP error or a dropped connection.
        self.wrong = []  # reads whose version held another save's step.
        self.watch_breaks = []  # how each watch stream ended before the campaign did.
        self.watched_version = None  # the alias's version as the watch last told it.
        self.watch_events = 0

    def run(self):
        watcher = threading.Thread(target=self.watch, daemon=True)
        watcher.start()
        url = f"{self.base}/models/failover-0/versions/{SYNCED_ALIAS}"
        while not self.stopping.wait(0.5):
            try:
                with urllib.request.urlopen(url, timeout=30) as response:
                    manifest = json.load(response)
            except urllib.error.HTTPError as error:
                body = error.read().decode(errors="replace")[:300]
                if error.code == 404 and self.committer.seed_of(1) is None:
                    continue  # nothing saved yet.
                self.reads += 1
                self.failures.append(f"HTTP {error.code}: {body}")
                continue
            except (OSError, ValueError) as error:
                self.reads += 1
                self.failures.append(f"{type(error).__name__}: {error}")
                continue
            self.reads += 1
            version = int(manifest["version"])
            step = int(manifest.get("metadata", {}).get("global_step", 0))
            seed = self.committer.seed_of(version)
            if seed is not None and seed != step:
                self.wrong.append(f"failover-0@{version} read through the console as step "
                                  f"{step}, saved as {seed}")

    def watch(self):
        """One watch for the campaign; a stream that ends early is a break, and the watch is
        opened again after its last id (as a page's EventSource would) so the end still counts."""
        after = None
        while not self.stopping.is_set():
            url = f"{self.base}/watch?model=failover-0&alias={SYNCED_ALIAS}"
            if after is not None:
                url += f"&after={after}"
            try:
                with urllib.request.urlopen(url, timeout=60) as stream:
                    for raw in stream:
                        line = raw.decode().rstrip("\n")
                        if line.startswith("id: "):
                            after = line[4:]
                        elif line.startswith("event: error"):
                            self.watch_breaks.append("the console sent an error event")
                        elif line.startswith("data: "):
                            self.on_update(json.loads(line[6:]))
                        if self.stopping.is_set():
                            return
                    if not self.stopping.is_set():
                        self.watch_breaks.append("the stream ended")
            except (OSError, ValueError) as error:
                if self.stopping.is_set():
                    return
                self.watch_breaks.append(f"{type(error).__name__}: {error}")
                time.sleep(0.5)

    def on_update(self, update):
        if "error" in update:
            self.watch_breaks.append(f"error: {update['error']}")
            return
        event = update.get("event")
        if event and event.get("alias") == SYNCED_ALIAS and event.get("kind") == "ALIAS_SET":
            self.watched_version = int(event["version"])
            self.watch_events += 1
        for model in update.get("state", {}).get("models", []):
            if model.get("name") == "failover-0" and SYNCED_ALIAS in model.get("aliases", {}):
                self.watched_version = int(model["aliases"][SYNCED_ALIAS])


def written_versions(stdout_and_err):
    """The versions a trainer run says it wrote ("versions written: @1 @2 ...")."""
    for line in stdout_and_err.splitlines():
        line = line.strip()
        if line.startswith("versions written:"):
            return [int(word[1:]) for word in line.split()[2:] if word.startswith("@")]
    return None
