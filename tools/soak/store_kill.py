"""store_kill: SIGKILL the checkpoint_store service mid-upload and mid-GC/retention, restart it on
the same database, and check everything every time.

Clients (--clients, 2-4) write while the service is killed:
  0: a gRPC writer (Python) committing to model "solo";
  1: a gRPC writer committing to model "shared";
  2: a `ckpt import` CLI process loop importing small torch.save files into "shared" too;
  3: another gRPC writer on "shared".
A janitor applies retention (keep the newest 3) to both models and runs GC (abandoned-upload grace
0 s, so the partial uploads the kills leave are reclaimed at once) in a loop.

Each gRPC version holds a 1.5 MiB tensor of bytes drawn from its seed plus a 16 x int64 "seed"
tensor; each CLI version holds the tensors of one torch file, whose "seed" tensor is -(file + 1).
Any visible version therefore names its source, and must equal it byte for byte.

Cycles alternate between two scenarios:
  kill mid-upload          the kill falls 0.5-3 commit times after the clients resume;
  kill mid-GC/retention    the kill falls inside the janitor's next retention or GC call (a delay
                           drawn from its measured duration); "hit" counts the kills that really
                           interrupted the call.
After each kill the clients are drained (every reply they got is recorded), the service restarts,
and the check runs:
  - `ckpt verify --store` exits 0 and the Verify problems list is empty (else torn);
  - every listed version downloads whole and equals the source its seed names (else torn);
  - the history's VERSION_COMMITTED events are exactly the listed versions (else torn);
  - every acknowledged version (a commit reply the client received) is listed and equal to its
    source (else lost), unless a retention removed it: the versions an acknowledged retention
    reported deleted, or, for a retention the kill interrupted, versions with at least keep_last
    newer versions (the only ones it may delete).
detected = client calls that failed with an error because of the kill (commits not acknowledged,
CLI imports that exited non-zero, janitor calls cut off). crashes = the service exited by itself or
did not start again, or a CLI died of a signal.
"""

import os
import random
import threading
import time

import soak_lib

DESCRIPTION = "kill -9 the store service mid-upload and mid-GC/retention; check after restarts"
FULL_TRIALS = 1000
SHORT_TRIALS = 30

WEIGHT_BYTES = 1536 << 10
SEED_ELEMENTS = 16
PIECE = 1 << 20  # tensor bytes per upload message.
KEEP_LAST = 3
TORCH_FILES = 4
RPC_TIMEOUT = 30.0

MID_UPLOAD = "kill mid-upload"
MID_GC = "kill mid-GC/retention"


def add_args(parser):
    parser.add_argument("--clients", type=int, default=3,
                        help="concurrent writers, 2-4 (default 3: two gRPC + one ckpt CLI)")
    parser.add_argument("--cli_verify_every", type=int, default=1,
                        help="run `ckpt verify --store` after every Nth restart and the last "
                             "(the Verify RPC, the same check in the service, runs after every "
                             "restart; default 1)")


def weight_bytes(seed):
    return random.Random(seed).randbytes(WEIGHT_BYTES)


def seed_bytes(seed):
    return seed.to_bytes(8, "little", signed=True) * SEED_ELEMENTS


class Oracle:
    """What the clients were told, and what retention may have removed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acked = {}  # (model, version) -> seed
        self.deleted = set()  # (model, version) an acknowledged retention reported deleted
        self.interrupted_retention = {}  # model -> keep_last of a retention cut off by a kill

    def ack(self, model, version, seed):
        with self.lock:
            self.acked[(model, version)] = seed


class Campaign:
    def __init__(self, args, lib):
        self.args = args
        self.lib = lib
        self.pb = lib.stubs()
        self.grpc = __import__("grpc")
        self.table = soak_lib.Table("store_kill", extra_columns=[
            "hit", "commits acked", "versions checked"])
        self.oracle = Oracle()
        self.db = os.path.join(lib.work_dir, "db")
        self.cond = threading.Condition()
        self.generation = 0  # bumped when clients may run against `address`.
        self.address = None
        self.running = 0  # clients currently using the service of this generation.
        self.cli_verifies = 0
        self.kill_time = {}  # generation -> when its service was killed.
        self.done = False
        self.janitor_event = None  # (op, start time) of the janitor call in progress.
        self.op_seconds = {"retention": 0.05, "gc": 0.05}
        self.commit_seconds = []
        self.cycle_detected = 0
        self.cycle_hit = False
        self.rows = {name: self.table.row(name) for name in (MID_UPLOAD, MID_GC)}
        self.commits = {name: 0 for name in self.rows}
        self.checked = {name: 0 for name in self.rows}
        self.current = MID_UPLOAD
        self.torch_sources = {}
        self.history_after = 0
        self.history_commits = set()
        self.history_deletes = set()

    # --- sources -------------------------------------------------------------------------

    def make_torch_files(self):
        """Writes TORCH_FILES small torch.save state dicts and reads back their raw bytes."""
        script = r"""
import sys, torch
out = sys.argv[1]
for i in range(int(sys.argv[2])):
    g = torch.Generator().manual_seed(1000 + i)
    sd = {"encoder.weight": torch.randn(384, 512, generator=g),
          "encoder.bias": torch.randn(512, generator=g).to(torch.bfloat16),
          "head.weight": torch.randint(-100, 100, (64, 33), generator=g, dtype=torch.int16),
          "seed": torch.full((16,), -(i + 1), dtype=torch.int64)}
    torch.save(sd, f"{out}/src{i}.pt")
    with open(f"{out}/src{i}.raw", "wb") as f:
        for key, t in sd.items():
            b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 \
                else t.contiguous().numpy().tobytes()
            f.write(key.encode() + b"\0" + len(b).to_bytes(8, "little") + b)
"""
        result = self.lib.run([self.lib.python, "-c", script, self.lib.work_dir,
                               str(TORCH_FILES)], timeout=300)
        if not result.ok:
            raise RuntimeError(f"writing the torch sources failed: {result.describe()}")
        for i in range(TORCH_FILES):
            tensors = {}
            with open(os.path.join(self.lib.work_dir, f"src{i}.raw"), "rb") as f:
                data = f.read()
            pos = 0
            while pos < len(data):
                end = data.index(b"\0", pos)
                key = data[pos:end].decode()
                n = int.from_bytes(data[end + 1:end + 9], "little")
                tensors[key] = data[end + 9:end + 9 + n]
                pos = end + 9 + n
            self.torch_sources[-(i + 1)] = tensors

    def expected(self, seed):
        if seed < 0:
            return self.torch_sources.get(seed)
        return {"weight": weight_bytes(seed), "seed": seed_bytes(seed)}

    # --- clients -------------------------------------------------------------------------

    def wait_for_generation(self, seen):
        """Blocks until a generation newer than `seen` (returns it and the address) or the end."""
        with self.cond:
            self.cond.wait_for(lambda: self.generation > seen or self.done)
            if self.done:
                return None, None
            self.running += 1
            return self.generation, self.address

    def client_stopped(self):
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def upload(self, stub, model, seed):
        pb = self.pb.checkpoint_store_pb2
        types = self.pb.types_pb2

        def requests():
            header = pb.UploadRequest()
            header.header.model = model
            manifest = header.header.manifest
            weight = manifest.tensors.add()
            weight.key, weight.dtype = "weight", types.DTYPE_UINT8
            weight.shape.append(WEIGHT_BYTES)
            weight.byte_length = WEIGHT_BYTES
            marker = manifest.tensors.add()
            marker.key, marker.dtype = "seed", types.DTYPE_INT64
            marker.shape.append(SEED_ELEMENTS)
            marker.byte_length = SEED_ELEMENTS * 8
            manifest.metadata.global_step = seed
            yield header
            for index, data in enumerate((weight_bytes(seed), seed_bytes(seed))):
                for offset in range(0, len(data), PIECE):
                    piece = pb.UploadRequest()
                    piece.data.tensor_index = index
                    piece.data.offset = offset
                    piece.data.data = data[offset:offset + PIECE]
                    yield piece
            commit = pb.UploadRequest()
            commit.commit.SetInParent()
            yield commit

        response = stub.Upload(requests(), timeout=RPC_TIMEOUT)
        return response.version.version

    def grpc_writer(self, index, model):
        sequence = 0
        seen = 0
        while True:
            seen, address = self.wait_for_generation(seen)
            if address is None:
                return
            channel = self.grpc.insecure_channel(address)
            stub = self.pb.checkpoint_store_pb2_grpc.CheckpointStoreStub(channel)
            try:
                while True:
                    sequence += 1
                    seed = index * 10_000_000 + sequence
                    start = time.monotonic()
                    try:
                        version = self.upload(stub, model, seed)
                    except self.grpc.RpcError:
                        with self.cond:
                            self.cycle_detected += 1
                        break
                    self.commit_seconds.append(time.monotonic() - start)
                    self.oracle.ack(model, version, seed)
                    with self.cond:
                        self.commits[self.current] += 1
            finally:
                channel.close()
                self.client_stopped()

    def cli_writer(self, model):
        rng = random.Random(self.lib.seed * 7 + 3)
        seen = 0
        while True:
            seen, address = self.wait_for_generation(seen)
            if address is None:
                return
            try:
                while not self.killed_generation(seen):
                    i = rng.randrange(TORCH_FILES)
                    process = self.lib.spawn(
                        [self.lib.ckpt_binary(), "import",
                         os.path.join(self.lib.work_dir, f"src{i}.pt"), f"--model={model}",
                         f"--label=soak_src={i}", f"--store={address}"], name="ckpt-import")
                    # A CLI started just before the kill would wait 10 s to connect to the dead
                    # service: once the kill is 0.5 s old, end it (its import was not
                    # acknowledged, so it is just another failed client).
                    while process.wait(0.05) is None:
                        if self.seconds_since_kill(seen) > 0.5:
                            process.kill()
                    self.rows[self.current].saw_rss(process.max_rss_mib)
                    output = process.log_tail(100_000)
                    if process.returncode != 0:
                        if process.returncode < 0 and not process.killed_by_us:
                            self.rows[self.current].fail(
                                "crashes", f"ckpt import died of signal {-process.returncode}:"
                                           f" {output[-400:]}")
                        with self.cond:
                            self.cycle_detected += 1
                        break
                    version = parse_imported_version(output, model)
                    if version is None:
                        raise RuntimeError(f"cannot find the version in ckpt import's output: "
                                           f"{output!r}")
                    self.oracle.ack(model, version, -(i + 1))
                    with self.cond:
                        self.commits[self.current] += 1
                    os.unlink(process.log_path)
            finally:
                self.client_stopped()

    def killed_generation(self, generation):
        with self.cond:
            return self.kill_time.get(generation) is not None

    def seconds_since_kill(self, generation):
        with self.cond:
            at = self.kill_time.get(generation)
        return 0.0 if at is None else time.monotonic() - at

    def janitor(self):
        seen = 0
        while True:
            seen, address = self.wait_for_generation(seen)
            if address is None:
                return
            channel = self.grpc.insecure_channel(address)
            stub = self.pb.checkpoint_store_pb2_grpc.CheckpointStoreStub(channel)
            try:
                while self.janitor_round(stub):
                    time.sleep(0.02)  # leave the writers most of the service.
            finally:
                channel.close()
                self.client_stopped()

    def janitor_round(self, stub):
        """Retention on both models, then GC. False once a call fails (the service died)."""
        pb = self.pb.checkpoint_store_pb2
        for model in ("solo", "shared"):
            start = self._janitor_start("retention")
            try:
                response = stub.ApplyRetention(pb.ApplyRetentionRequest(
                    model=model, policy=pb.RetentionPolicy(keep_last=KEEP_LAST),
                    reason="soak"), timeout=RPC_TIMEOUT)
            except self.grpc.RpcError as error:
                if error.code() == self.grpc.StatusCode.NOT_FOUND:
                    self._janitor_end("retention", start)
                    continue  # nothing committed to this model yet.
                with self.oracle.lock:
                    self.oracle.interrupted_retention[model] = KEEP_LAST
                self._janitor_cut()
                return False
            self._janitor_end("retention", start)
            with self.oracle.lock:
                for version in response.deleted_versions:
                    self.oracle.deleted.add((model, version))
        start = self._janitor_start("gc")
        try:
            stub.GarbageCollect(pb.GarbageCollectRequest(), timeout=RPC_TIMEOUT)
        except self.grpc.RpcError:
            self._janitor_cut()
            return False
        self._janitor_end("gc", start)
        return True

    def _janitor_start(self, op):
        with self.cond:
            self.janitor_event = (op, time.monotonic())
            self.cond.notify_all()
            return self.janitor_event[1]

    def _janitor_end(self, op, start):
        with self.cond:
            self.op_seconds[op] = 0.7 * self.op_seconds[op] + 0.3 * (time.monotonic() - start)
            self.janitor_event = None

    def _janitor_cut(self):
        with self.cond:
            self.cycle_detected += 1
            if self.janitor_event is not None:
                self.cycle_hit = True
            self.janitor_event = None

    # --- the check -----------------------------------------------------------------------

    def download(self, stub, model, version):
        """{key: bytes} of MODEL@version, or raises RpcError."""
        pb = self.pb.checkpoint_store_pb2
        request = pb.DownloadRequest()
        request.ref.model = model
        request.ref.version = version
        keys, parts = [], {}
        for response in stub.Download(request, timeout=RPC_TIMEOUT):
            if response.HasField("manifest"):
                keys = [t.key for t in response.manifest.tensors]
            else:
                key = keys[response.data.tensor_index]
                got = parts.setdefault(key, bytearray())
                if len(got) != response.data.offset:
                    raise ValueError(f"{key}: data at offset {response.data.offset}, "
                                     f"expected {len(got)}")
                got += response.data.data
        return {key: bytes(parts.get(key, b"")) for key in keys}

    def whole(self, tensors):
        """The seed the tensors decode to if they equal its source exactly, else None."""
        marker = tensors.get("seed")
        if marker is None or len(marker) != SEED_ELEMENTS * 8:
            return None
        seed = int.from_bytes(marker[:8], "little", signed=True)
        expected = self.expected(seed)
        return seed if expected == tensors else None

    def check(self, address, row, cli_verify):
        try:
            self.check_store(address, row, cli_verify)
        except self.grpc.RpcError as error:
            # The restarted service must answer; failing to is not a harness error.
            row.fail("crashes", f"the restarted service failed a call: {error.code()} "
                                f"{error.details()}")

    def check_store(self, address, row, cli_verify):
        pb = self.pb.checkpoint_store_pb2
        if cli_verify:
            verify = self.lib.ckpt(["verify"], store=address, timeout=600)
            row.saw_rss(verify.max_rss_mib)
            self.cli_verifies += 1
            if verify.crashed:
                row.fail("crashes", f"ckpt verify: {verify.describe()}")
            elif not verify.ok:
                row.fail("torn", f"ckpt verify failed: {verify.describe()}")
        channel = self.grpc.insecure_channel(address)
        stub = self.pb.checkpoint_store_pb2_grpc.CheckpointStoreStub(channel)
        try:
            problems = stub.Verify(pb.VerifyRequest(), timeout=600).problems
            for problem in problems:
                row.fail("torn", f"verify: {problem.model}@{problem.version} {problem.message}")
            listed = {}
            for model in ("solo", "shared"):
                try:
                    response = stub.ListVersions(pb.ListVersionsRequest(model=model, page_size=0),
                                                 timeout=RPC_TIMEOUT)
                except self.grpc.RpcError as error:
                    if error.code() == self.grpc.StatusCode.NOT_FOUND:
                        continue
                    raise
                if response.next_page_token:
                    raise RuntimeError("ListVersions paged; the campaign expects few versions")
                for info in response.versions:
                    listed[(model, info.version)] = None
            for key in listed:
                try:
                    tensors = self.download(stub, *key)
                except (self.grpc.RpcError, ValueError) as error:
                    why = error.details() if isinstance(error, self.grpc.RpcError) else error
                    row.fail("torn", f"{key[0]}@{key[1]} is listed but does not download: {why}")
                    continue
                seed = self.whole(tensors)
                if seed is None:
                    row.fail("torn", f"{key[0]}@{key[1]} matches no writer's source")
                listed[key] = seed
                self.checked[self.current] += 1
            self.check_history(stub, set(listed), row)
            with self.oracle.lock:
                acked = dict(self.oracle.acked)
                deleted = set(self.oracle.deleted)
                interrupted = dict(self.oracle.interrupted_retention)
                self.oracle.interrupted_retention.clear()
            latest = {}
            for model, version in listed:
                latest[model] = max(latest.get(model, 0), version)
            for key, seed in acked.items():
                model, version = key
                if key in listed:
                    if listed[key] != seed:
                        row.fail("lost", f"acknowledged {model}@{version} (source {seed}) "
                                         f"now holds source {listed[key]}")
                    continue
                if key in deleted:
                    forget = True
                elif model in interrupted and version <= latest.get(model, 0) - interrupted[model]:
                    forget = True  # the interrupted retention may have deleted it.
                else:
                    forget = False
                    row.fail("lost", f"acknowledged {model}@{version} (source {seed}) is gone")
                if forget:
                    with self.oracle.lock:
                        self.oracle.acked.pop(key, None)
                        self.oracle.deleted.discard(key)
        finally:
            channel.close()

    def check_history(self, stub, listed, row):
        """The history's commits minus its deletions are exactly the listed versions."""
        pb = self.pb.checkpoint_store_pb2
        events = self.pb.registry_pb2.RegistryEvent
        after = self.history_after
        while True:
            page = stub.ListHistory(pb.ListHistoryRequest(after_sequence=after),
                                    timeout=RPC_TIMEOUT)
            for event in page.events:
                self.history_after = max(self.history_after, event.sequence)
                key = (event.model, event.version)
                if event.kind == events.VERSION_COMMITTED:
                    if key in self.history_commits:
                        row.fail("torn", f"the history commits {key[0]}@{key[1]} twice")
                    self.history_commits.add(key)
                elif event.kind == events.VERSION_DELETED:
                    self.history_deletes.add(key)
            if not page.next_after_sequence:
                break
            after = page.next_after_sequence
        alive = self.history_commits - self.history_deletes
        if alive != listed:
            row.fail("torn", f"the history's live versions ({len(alive)}) are not the listed "
                             f"ones ({len(listed)}): only in history "
                             f"{sorted(alive - listed)[:5]}, only listed "
                             f"{sorted(listed - alive)[:5]}")

    # --- the campaign --------------------------------------------------------------------

    def start_store(self, row):
        try:
            return self.lib.start_store(self.db, flags=["--abandoned_upload_grace=0s",
                                                        "--shutdown_grace=0s"])
        except soak_lib.StartError as error:
            row.fail("crashes", f"the service did not start again: {error}")
            return None

    def release_clients(self, address):
        with self.cond:
            self.address = address
            self.generation += 1
            self.cycle_detected = 0
            self.cycle_hit = False
            self.cond.notify_all()

    def drain_clients(self):
        """Waits until every client has noticed the kill and recorded what it was told."""
        with self.cond:
            # Clients of this generation all start, then all stop.
            self.cond.wait_for(lambda: self.running == 0, timeout=RPC_TIMEOUT + 60)
            if self.running:
                raise RuntimeError(f"{self.running} clients still running 90 s after a kill")

    def wait_for_janitor_call(self, timeout):
        with self.cond:
            self.cond.wait_for(lambda: self.janitor_event is not None, timeout=timeout)
            return self.janitor_event

    def run(self):
        args, lib = self.args, self.lib
        if not 2 <= args.clients <= 4:
            raise ValueError("--clients must be 2-4")
        self.make_torch_files()
        threads = [threading.Thread(target=self.grpc_writer, args=(0, "solo"), daemon=True),
                   threading.Thread(target=self.grpc_writer, args=(1, "shared"), daemon=True)]
        if args.clients >= 3:
            threads.append(threading.Thread(target=self.cli_writer, args=("shared",),
                                            daemon=True))
        if args.clients >= 4:
            threads.append(threading.Thread(target=self.grpc_writer, args=(3, "shared"),
                                            daemon=True))
        threads.append(threading.Thread(target=self.janitor, daemon=True))
        for thread in threads:
            thread.start()
        rng = lib.rng
        kills = 0
        server = self.start_store(self.rows[MID_UPLOAD])
        try:
            while kills < args.trials and server is not None:
                if lib.out_of_time():
                    self.table.stop_early(f"--max_minutes={args.max_minutes} reached after "
                                          f"{kills} of {args.trials} kills")
                    break
                self.current = MID_GC if kills % 2 else MID_UPLOAD
                row = self.rows[self.current]
                self.release_clients(server.address)
                if kills == 0:
                    # Calibrate to this machine's speed (it varies tenfold with load): let two
                    # commits land before the first kill.
                    deadline = time.monotonic() + 120
                    while len(self.commit_seconds) < 2 and time.monotonic() < deadline:
                        time.sleep(0.01)
                if self.current == MID_UPLOAD:
                    recent = self.commit_seconds[-20:] or [0.3]
                    per_commit = max(0.02, sorted(recent)[len(recent) // 2])
                    # Anywhere from mid-header to mid-commit of some upload.
                    time.sleep(per_commit * rng.uniform(0.5, 3.0))
                else:
                    # Let the writers get going, then kill inside a janitor call.
                    time.sleep(rng.uniform(0.0, 0.3))
                    with self.cond:
                        self.janitor_event = None  # wait for the start of a fresh call.
                    event = self.wait_for_janitor_call(timeout=10)
                    if event is not None:
                        op, _ = event
                        time.sleep(rng.uniform(0.0, 1.5) * self.op_seconds[op])
                status = server.poll()
                if status is not None:
                    row.fail("crashes", f"the service exited by itself with {status}: "
                                        f"{server.log_tail()}")
                with self.cond:
                    self.kill_time[self.generation] = time.monotonic()
                server.kill()
                row.saw_rss(server.max_rss_mib)
                kills += 1
                row.trials += 1
                # The new service starts (on a new port) while the old clients drain.
                server = self.start_store(row)
                self.drain_clients()
                row.detected += self.cycle_detected
                if self.current == MID_GC and self.cycle_hit:
                    row.extra["hit"] = (row.extra["hit"] or 0) + 1
                if server is None:
                    break
                every = max(1, args.cli_verify_every)
                self.check(server.address, row,
                           cli_verify=kills % every == 0 or kills == args.trials)
                if kills % 50 == 0:
                    print(f"store_kill: {kills} kills, {len(self.oracle.acked)} acknowledged "
                          f"versions live, {lib.elapsed_seconds():.0f} s", flush=True)
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()
            if server is not None:
                server.kill()
            for thread in threads:
                thread.join(timeout=RPC_TIMEOUT + 30)
        for name, row in self.rows.items():
            row.extra["commits acked"] = self.commits[name]
            row.extra["versions checked"] = self.checked[name]
            if row.extra["hit"] == "":
                row.extra["hit"] = "-" if name == MID_UPLOAD else 0
        self.table.note(
            f"{kills} kills with {args.clients} writers ("
            f"gRPC writers on 'solo' and 'shared'" +
            (", a `ckpt import` loop on 'shared'" if args.clients >= 3 else "") +
            (", a second gRPC writer on 'shared'" if args.clients >= 4 else "") +
            f") and a retention (keep_last={KEEP_LAST}) + GC janitor. 'hit': kills that cut a "
            f"janitor call off; 'commits acked': commits acknowledged in that scenario's cycles; "
            f"'versions checked': listed versions downloaded and compared after restarts. "
            f"`ckpt verify --store` ran after {self.cli_verifies} of the {kills} restarts, the "
            f"Verify RPC after every one.")
        return self.table


def parse_imported_version(text, model):
    """The N of "MODEL@N" in ckpt import's output."""
    marker = f"{model}@"
    for line in text.splitlines():
        at = line.find(marker)
        while at >= 0:
            digits = ""
            for ch in line[at + len(marker):]:
                if not ch.isdigit():
                    break
                digits += ch
            if digits:
                return int(digits)
            at = line.find(marker, at + 1)
    return None


def run(args, lib):
    return Campaign(args, lib).run()
