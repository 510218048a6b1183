"""ckpt_client against the real checkpoint_store and loader binaries on 127.0.0.1, plaintext and
TLS (a CA and server / client certificates made here with openssl), with versions put in by the
real `ckpt import` from torch.save files made here.

The registry cases (annotate, history, watch) run against the store's AnnotateVersion /
ListHistory / Watch.
"""
import collections
import datetime
import json
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import unittest

import torch
from torch import nn

import ckpt_client

ROOT = os.getcwd()  # the runfiles root (tests/run_python.sh)
STORE_BIN = os.path.join(ROOT, "services/checkpoint_store/checkpoint_store")
LOADER_BIN = os.path.join(ROOT, "services/loader/loader")
CKPT_BIN = os.path.join(ROOT, "tools/ckpt/ckpt")
TMP = os.environ.get("TEST_TMPDIR") or "/tmp/ckpt_client_test"
MODEL = "team-a.net"
TOKEN = "s3cret-token"
# Store restarts in the watch-resume test, and how soon after a move made right after each one the
# watch must see it (RemoteWatch sees it within a fraction of this).
RESTARTS = 2
RESUME_WITHIN = 2.0


class Net(nn.Module):
    """Float weights in two chunks (> 4 MiB), an int64 buffer (BatchNorm) and a scalar."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(1024, 1200)
        self.norm = nn.BatchNorm1d(1200)
        self.head = nn.Linear(1200, 10)
        self.register_buffer("temperature", torch.tensor(0.5))


def run(*args):
    result = subprocess.run(list(args), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n"
                           f"{result.stdout}{result.stderr}")
    return result.stdout


SERVERS = []  # every server started, stopped at the end whatever happened


def _read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


class Server:
    """A service binary on 127.0.0.1 (port 0 unless given), its port from --port_file."""

    def __init__(self, name, binary, flags, port=0):
        self.name, self.binary, self.flags = name, binary, flags
        self.start(port)

    def start(self, port=0):
        port_file = os.path.join(TMP, f"{self.name}.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        self.log = open(os.path.join(TMP, f"{self.name}.log"), "ab")
        self.process = subprocess.Popen(
            [self.binary, f"--listen=127.0.0.1:{port}", f"--port_file={port_file}",
             "--shutdown_grace=1s"] + self.flags, stdout=self.log, stderr=subprocess.STDOUT)
        SERVERS.append(self)
        deadline = time.monotonic() + 30
        while not _read_text(port_file):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                log = _read_text(self.log.name)[-3000:]
                raise RuntimeError(f"{self.name} did not start:\n{log}")
            time.sleep(0.02)
        self.port = int(_read_text(port_file))
        self.address = f"127.0.0.1:{self.port}"

    def stop(self):
        if self in SERVERS:
            SERVERS.remove(self)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def restart(self):
        """Stops and starts again on the same port and data (a store restart clients ride out)."""
        self.stop()
        self.start(self.port)


class CuttingProxy:
    """A TCP forwarder to 127.0.0.1:`port` that closes each of its first `cuts` connections once
    `cut_after` bytes went from the server to the client: a store whose host dies in the middle
    of a stream, as the client sees it. Later connections are forwarded whole."""

    def __init__(self, port, cut_after, cuts=1):
        self.port, self.cut_after, self.cuts_left = port, cut_after, cuts
        self.cut = 0  # connections cut so far
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.port))
            limit = None
            if self.cuts_left > 0:
                self.cuts_left -= 1
                limit = self.cut_after
            self.connections += 1
            threading.Thread(target=self._pump, args=(downstream, upstream, None),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, limit),
                             daemon=True).start()

    def _pump(self, source, destination, limit):
        forwarded = 0
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                if limit is not None and forwarded + len(data) > limit:
                    self.cut += 1
                    break
                destination.sendall(data)
                forwarded += len(data)
        except OSError:
            pass
        finally:
            for end in (source, destination):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def make_certificates(directory):
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    join = lambda name: os.path.join(directory, name)  # noqa: E731
    run("openssl", "req", "-x509", *key, "-keyout", join("ca.key"), "-out", join("ca.pem"),
        "-days", "2", "-subj", "/CN=ckpt-client-test-ca")
    for name, subject, san in (("server", "/CN=ckpt-test-server", "DNS:localhost,IP:127.0.0.1"),
                               ("client", "/CN=team-a", "DNS:team-a.example")):
        with open(join(name + ".ext"), "w") as f:
            f.write(f"subjectAltName={san}\n")
        run("openssl", "req", *key, "-keyout", join(name + ".key"), "-out", join(name + ".csr"),
            "-subj", subject)
        run("openssl", "x509", "-req", "-in", join(name + ".csr"), "-CA", join("ca.pem"),
            "-CAkey", join("ca.key"), "-CAcreateserial", "-days", "2", "-extfile",
            join(name + ".ext"), "-out", join(name + ".pem"))
    return {name: join(name) for name in ("ca.pem", "server.pem", "server.key", "client.pem",
                                          "client.key")}


def read_safetensors(path):
    """A safetensors file parsed by its specification (8-byte little-endian header length, JSON
    header, raw little-endian bytes); Debian has no safetensors package."""
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "F64": torch.float64, "I32": torch.int32}
    with open(path, "rb") as f:
        blob = f.read()
    (header_length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_length])
    data = bytearray(blob[8 + header_length:])
    out = collections.OrderedDict()
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = dtypes[entry["dtype"]]
        chunk = data[begin:end]
        tensor = (torch.frombuffer(chunk, dtype=torch.uint8).view(dtype) if chunk
                  else torch.empty(0, dtype=dtype))
        out[key] = tensor.reshape(entry["shape"]).clone()
    return out


def assert_same(test, state, reference, dtype=None):
    test.assertEqual(list(state), list(reference))
    for key, expected in reference.items():
        if dtype is not None and expected.is_floating_point():
            expected = expected.to(dtype)
        test.assertEqual(state[key].dtype, expected.dtype, key)
        test.assertTrue(torch.equal(state[key].cpu(), expected), key)


def setUpModule():
    try:
        start_everything()
    except BaseException:
        tearDownModule()
        raise


def start_everything():
    global CERTS, PLAIN_STORE, PLAIN_LOADER, TLS_STORE, TLS_LOADER, V1, V2, TOKEN_FILE
    os.makedirs(TMP, exist_ok=True)
    CERTS = make_certificates(TMP)
    TOKEN_FILE = os.path.join(TMP, "token")
    with open(TOKEN_FILE, "w") as f:
        f.write(TOKEN + "\n")
    torch.manual_seed(7)
    first, second = Net(), Net()
    first.norm.num_batches_tracked.fill_(3)  # a non-default int64 buffer
    V1, V2 = first.state_dict(), second.state_dict()
    # Saved as DDP saves: every key under "module.". The store keeps canonical keys.
    files = []
    for index, state in enumerate((V1, V2), 1):
        path = os.path.join(TMP, f"v{index}.pt")
        torch.save(collections.OrderedDict(("module." + k, v) for k, v in state.items()), path)
        files.append(path)

    PLAIN_STORE = Server("plain_store", STORE_BIN, [f"--store_dir={TMP}/plain_db"])
    PLAIN_LOADER = Server("plain_loader", LOADER_BIN, [f"--store={PLAIN_STORE.address}"])
    tls = [f"--tls_cert_file={CERTS['server.pem']}", f"--tls_key_file={CERTS['server.key']}",
           f"--auth_token_file={TOKEN_FILE}"]
    TLS_STORE = Server("tls_store", STORE_BIN, [f"--store_dir={TMP}/tls_db"] + tls)
    TLS_LOADER = Server("tls_loader", LOADER_BIN, tls + [
        f"--tls_client_ca_file={CERTS['ca.pem']}",  # mutual TLS towards clients
        f"--store={TLS_STORE.address}", f"--store_tls_ca_file={CERTS['ca.pem']}",
        f"--store_auth_token_file={TOKEN_FILE}"])
    for store, extra in ((PLAIN_STORE, []), (TLS_STORE, [
            f"--store_tls_ca_file={CERTS['ca.pem']}", f"--store_auth_token_file={TOKEN_FILE}"])):
        run(CKPT_BIN, "import", files[0], "--model", MODEL, "--alias", "production",
            f"--store={store.address}", *extra)
        run(CKPT_BIN, "import", files[1], "--model", MODEL, f"--store={store.address}", *extra)


def tearDownModule():
    for server in reversed(list(SERVERS)):
        server.stop()


def plain_client(**kwargs):
    return ckpt_client.Client(store=PLAIN_STORE.address, loader=PLAIN_LOADER.address, **kwargs)


class LoadTest(unittest.TestCase):
    def test_load_into_module_strict_through_loader_and_store(self):
        with plain_client() as client, \
                ckpt_client.Client(store=PLAIN_STORE.address) as store_only:
            for source in (client, store_only):
                state = source.load_state_dict(f"{MODEL}@production")
                self.assertIsInstance(state, collections.OrderedDict)
                self.assertFalse(any(k.startswith("module.") for k in state))
                assert_same(self, state, V1)
                net = Net()
                net.load_state_dict(state, strict=True)
                self.assertTrue(torch.equal(net.encoder.weight, V1["encoder.weight"]))
                self.assertEqual(net.norm.num_batches_tracked.item(), 3)

    def test_damaged_bytes_in_real_streams_are_caught(self):
        """The servers' own Download and Load messages, one byte flipped on the way: the
        verifier names the tensor (and, with the store's chunk list, the chunk)."""
        from ckpt_client._tensors import StreamAssembler
        with plain_client() as client:
            pb = client.messages
            manifest = client.manifest(f"{MODEL}@1")
            weight = [t for t in manifest.tensors if t.key == "encoder.weight"][0]
            self.assertEqual(len(weight.chunks), 2)  # 4 MiB + the rest
            ref = client.version_ref(f"{MODEL}@1")
            streams = {
                "Download": client._stream("store", "Download",
                                           pb.checkpoint_store_pb2.DownloadRequest(ref=ref)),
                "Load": client._stream("loader", "Load", pb.loader_pb2.LoadRequest(ref=ref)),
            }
            for method, stream in streams.items():
                messages = list(stream)
                header = messages[0].manifest
                index = [t.key for t in header.tensors].index("encoder.weight")
                # A piece of the second chunk (bytes from 4 MiB on) of encoder.weight.
                victim = next(m.data for m in messages[1:] if m.data.tensor_index == index
                              and m.data.offset >= 4 << 20)
                damaged = bytearray(victim.data)
                damaged[100] ^= 0x04
                victim.data = bytes(damaged)
                assembler = StreamAssembler(list(header.tensors), range(len(header.tensors)))
                with self.assertRaises(ckpt_client.IntegrityError, msg=method) as caught:
                    for message in messages[1:]:
                        assembler.add(message.data)
                    assembler.finish()
                self.assertEqual(caught.exception.tensor, "encoder.weight", method)
                if method == "Download":
                    self.assertEqual(caught.exception.chunk, 1)
                    self.assertIn("tensor 'encoder.weight' chunk 1", str(caught.exception))

    def test_refs(self):
        with plain_client() as client:
            assert_same(self, client.load_state_dict(MODEL), V2)  # latest
            assert_same(self, client.load_state_dict(f"{MODEL}@2"), V2)
            assert_same(self, client.load_state_dict(f"{MODEL}@1"), V1)
            self.assertEqual(client.resolve(f"{MODEL}@production"), 1)
            self.assertEqual(client.resolve(MODEL), 2)

    def test_dtype_subset_and_device(self):
        with plain_client() as client, \
                ckpt_client.Client(store=PLAIN_STORE.address) as store_only:
            for source in (client, store_only):
                half = source.load_state_dict(f"{MODEL}@production", dtype=torch.float16)
                assert_same(self, half, V1, dtype=torch.float16)
                self.assertEqual(half["norm.num_batches_tracked"].dtype, torch.int64)
                subset = source.load_state_dict(f"{MODEL}@1", keys=["head.bias"],
                                                prefixes=["norm.running"])
                self.assertEqual(list(subset),
                                 ["norm.running_mean", "norm.running_var", "head.bias"])
                self.assertTrue(torch.equal(subset["head.bias"], V1["head.bias"]))
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
            placed = client.load_state_dict(f"{MODEL}@1", device=device)
            self.assertEqual(placed["encoder.weight"].device, torch.device(device))

    def test_errors_carry_the_server_message(self):
        with plain_client() as client:
            with self.assertRaises(ckpt_client.NotFound) as caught:
                client.load_state_dict("no-such-model@1")
            self.assertIn("no-such-model", str(caught.exception))
            self.assertIsInstance(caught.exception, ckpt_client.CkptError)
            with self.assertRaises(ckpt_client.NotFound):
                client.resolve(f"{MODEL}@no-such-alias")
        with ckpt_client.Client(loader="127.0.0.1:1", timeout=2) as client:
            with self.assertRaises(ckpt_client.Unavailable):
                client.load_state_dict(MODEL)
            with self.assertRaises(ckpt_client.InvalidArgument):
                client.resolve(MODEL)  # needs a store address

    def test_flat_ranges_read_their_elements_across_chunk_boundaries(self):
        """load_flat_range: elements of the flattened tensor (what a resharded resume reads),
        within a chunk, across the boundary between the weight's two chunks, up to its end."""
        with plain_client() as client:
            weight = V1["encoder.weight"].flatten()
            boundary = (4 << 20) // 4  # the first chunk's elements
            for start, stop in ((0, 0), (0, 5), (boundary - 3, boundary + 3),
                                (boundary, weight.numel()), (7, weight.numel())):
                got = client.load_flat_range(f"{MODEL}@1", "encoder.weight", start, stop)
                self.assertEqual(got.dtype, torch.float32)
                self.assertTrue(torch.equal(got, weight[start:stop]), (start, stop))
            steps = client.load_flat_range(f"{MODEL}@1", "norm.num_batches_tracked", 0, 1)
            self.assertTrue(torch.equal(steps, V1["norm.num_batches_tracked"].flatten()))
            with self.assertRaisesRegex(ckpt_client.OutOfRange,
                                        r"bytes 0\.\.44 of tensor 'head.bias' of .*@1: it "
                                        r"holds 40 bytes"):
                client.load_flat_range(f"{MODEL}@1", "head.bias", 0, 11)
            with self.assertRaises(ckpt_client.NotFound):
                client.load_flat_range(f"{MODEL}@1", "no.such", 0, 1)

    def test_export_pt_and_safetensors(self):
        with plain_client() as client:
            path = os.path.join(TMP, "export", "net.pt")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            info = client.export(f"{MODEL}@production", path)
            self.assertEqual(info["version"], f"{MODEL}@1")
            self.assertEqual(info["bytes"], os.path.getsize(path))
            assert_same(self, torch.load(path, weights_only=True), V1)
            path = os.path.join(TMP, "export", "net.safetensors")
            client.export(f"{MODEL}@2", path, format="safetensors", dtype=torch.bfloat16)
            exported = read_safetensors(path)  # a safetensors header is not ordered
            in_order = collections.OrderedDict((k, exported[k]) for k in V2 if k in exported)
            assert_same(self, in_order, V2, dtype=torch.bfloat16)
            self.assertEqual(sorted(exported), sorted(V2))
            self.assertEqual(sorted(os.listdir(os.path.dirname(path))),
                             ["net.pt", "net.safetensors"])  # no temporary file left
            with self.assertRaises(ckpt_client.NotFound):
                client.export("no-such-model", os.path.join(TMP, "export", "missing.pt"))
            self.assertFalse(os.path.exists(os.path.join(TMP, "export", "missing.pt")))
            self.assertEqual(len(os.listdir(os.path.dirname(path))), 2)


    def test_a_store_download_broken_mid_stream_is_read_again_and_arrives_whole(self):
        # A store that dies in the middle of a Download (a failover, as Client(store="A,B")
        # sees it): load_state_dict, load_bundle and load_flat_range start it again, by version.
        torch.manual_seed(11)
        model = nn.Linear(1024, 2048)  # 8 MiB of weight: two store chunks
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(2, 1024)).sum().backward()
        optimizer.step()
        with plain_client() as client:
            saved = client.save("team-a.cut", model, optimizer=optimizer, alias="serving")
        reads = {
            "load_state_dict": lambda client: client.load_state_dict("team-a.cut@serving"),
            "load_bundle": lambda client: client.load_bundle("team-a.cut@serving").model,
            "load_flat_range": lambda client: {"weight": client.load_flat_range(
                "team-a.cut", "weight", 0, 2048 * 1024).view(2048, 1024)},
        }
        for name, read in reads.items():
            with self.subTest(read=name):
                proxy = CuttingProxy(PLAIN_STORE.port, cut_after=1 << 20)
                try:
                    with ckpt_client.Client(store=proxy.address, timeout=20) as client:
                        state = read(client)
                    self.assertEqual(proxy.cut, 1)
                    self.assertGreaterEqual(proxy.connections, 2)
                finally:
                    proxy.close()
                for key, tensor in state.items():
                    self.assertTrue(torch.equal(tensor, model.state_dict()[key]), key)
        self.assertEqual(saved.version, 1)


class BundleTest(unittest.TestCase):
    def test_load_bundle_resumes_model_adamw_and_onecyclelr_bit_exactly(self):
        """A training bundle saved by a Python loop (DataParallel keys, AdamW, OneCycleLR, epoch
        and step), put in by `ckpt import`, restores into fresh objects in place; the resumed run
        then steps bit-identically to the uninterrupted one."""
        torch.manual_seed(11)
        data = [(torch.randn(8, 1024), torch.randint(0, 10, (8,))) for _ in range(6)]

        def make():
            model = nn.Sequential(nn.Linear(1024, 64), nn.ReLU(), nn.Linear(64, 10))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=6)
            return model, optimizer, scheduler

        def step(model, optimizer, scheduler, batch):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
            optimizer.step()
            scheduler.step()

        model, optimizer, scheduler = make()
        for batch in data[:3]:
            step(model, optimizer, scheduler, batch)
        path = os.path.join(TMP, "bundle.pt")
        torch.save({"model": collections.OrderedDict(("module." + k, v)
                                                     for k, v in model.state_dict().items()),
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "epoch": 1, "step": 3}, path)
        run(CKPT_BIN, "import", path, "--model", "team-a.bundle",
            f"--store={PLAIN_STORE.address}")

        resumed = make()
        with plain_client() as client:  # through the loader (its Load with every state part)
            bundle = client.load_bundle("team-a.bundle", *resumed)
        direct = make()
        with ckpt_client.Client(store=PLAIN_STORE.address) as store_only:  # the store's Download
            through_store = store_only.load_bundle("team-a.bundle", *direct)
        self.assertEqual(through_store.extra, bundle.extra)
        self.assertEqual(through_store.scheduler.keys(), bundle.scheduler.keys())
        for index, state in resumed[1].state_dict()["state"].items():
            for name, value in state.items():
                self.assertTrue(torch.equal(direct[1].state_dict()["state"][index][name], value))
        self.assertEqual(bundle.version, 1)
        self.assertEqual((bundle.extra["epoch"], bundle.extra["step"]), (1, 3))
        self.assertEqual((bundle.epoch, bundle.step), (1, 3))  # start_epoch = bundle.epoch + 1
        self.assertEqual(sorted(bundle.model), sorted(model.state_dict()))
        restored = resumed[1].state_dict()
        original = optimizer.state_dict()
        self.assertEqual(restored["param_groups"], original["param_groups"])
        for index, state in original["state"].items():
            for name, value in state.items():
                self.assertTrue(torch.equal(restored["state"][index][name], value),
                                f"optimizer state {index}.{name}")
        # OneCycleLR's anneal_func is a bound method: kept as a description, never unpickled;
        # the resumed scheduler keeps its own, and every plain value is restored.
        self.assertIsInstance(bundle.scheduler["anneal_func"], ckpt_client.Opaque)
        self.assertEqual(bundle.scheduler["anneal_func"].class_name, "builtins.getattr")
        plain = lambda d: {k: v for k, v in d.items() if k != "anneal_func"}  # noqa: E731
        self.assertEqual(plain(resumed[2].state_dict()), plain(scheduler.state_dict()))
        self.assertTrue(callable(resumed[2].anneal_func))
        for batch in data[3:]:
            step(model, optimizer, scheduler, batch)
            step(*resumed, batch)
        for (key, a), b in zip(model.state_dict().items(), resumed[0].state_dict().values()):
            self.assertTrue(torch.equal(a, b), f"{key} after resuming")

    def test_load_bundle_of_weights_only_refuses_an_optimizer_restore(self):
        with plain_client() as client:
            model = Net()
            with self.assertRaisesRegex(ckpt_client.FailedPrecondition, "no optimizer state"):
                client.load_bundle(f"{MODEL}@1", model,
                                   torch.optim.SGD(model.parameters(), lr=0.1))
            bundle = client.load_bundle(f"{MODEL}@1", model)
            self.assertIsNone(bundle.optimizer)
            self.assertEqual((bundle.epoch, bundle.step), (0, 0))  # none recorded
            for key, tensor in V1.items():
                self.assertTrue(torch.equal(model.state_dict()[key], tensor), key)


class SaveTest(unittest.TestCase):
    @staticmethod
    def make():
        model = nn.Sequential(nn.Linear(1024, 64), nn.ReLU(), nn.Linear(64, 10))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=6)
        return model, optimizer, scheduler

    @staticmethod
    def step(model, optimizer, scheduler, batch):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
        optimizer.step()
        scheduler.step()

    def test_save_from_a_python_loop_then_resume_bit_exactly_and_export_the_bundle(self):
        torch.manual_seed(12)
        data = [(torch.randn(8, 1024), torch.randint(0, 10, (8,))) for _ in range(6)]
        model, optimizer, scheduler = self.make()
        wrapped = nn.DataParallel(model)  # keys "module.0.weight", as a DDP/DP job saves them
        for batch in data[:3]:
            self.step(wrapped, optimizer, scheduler, batch)
        with plain_client() as client:
            saved = client.save("team-a.saved", wrapped, optimizer=optimizer, scheduler=scheduler,
                                epoch=1, step=3, extra={"best_acc": 0.5},
                                metrics={"loss": 1.25}, alias="candidate", reason="from python",
                                lineage={"run_id": "run-7", "dataset": "synthetic"})
            self.assertEqual(saved.version, 1)
            self.assertEqual(client.resolve("team-a.saved@candidate"), 1)
            manifest = client.manifest("team-a.saved@1")
            self.assertEqual([t.key for t in manifest.tensors],
                             ["0.weight", "0.bias", "2.weight", "2.bias"])
            self.assertEqual(manifest.tensors[0].original_key, "module.0.weight")
            self.assertEqual(manifest.metadata.key_normalization.stripped_prefix, "module.")
            self.assertEqual((manifest.metadata.epoch, manifest.metadata.global_step), (1, 3))
            self.assertEqual(manifest.metadata.metrics["loss"], 1.25)
            self.assertEqual(manifest.metadata.lineage.run_id, "run-7")
            self.assertEqual(dict(manifest.optimizer_param_names),
                             {0: "0.weight", 1: "0.bias", 2: "2.weight", 3: "2.bias"})

            resumed = self.make()
            bundle = client.load_bundle("team-a.saved@candidate", *resumed)
            self.assertEqual(bundle.extra, {"epoch": 1, "step": 3, "best_acc": 0.5})
            (listed,) = client.versions("team-a.saved")
            self.assertEqual((listed.epoch, listed.step, listed.run_id, listed.metrics,
                              listed.aliases, listed.has_optimizer_state),
                             (1, 3, "run-7", {"loss": 1.25}, ["candidate"], True))
            # The same weights again: the store holds every chunk already.
            again = client.save("team-a.saved", model)
            self.assertEqual((again.version, again.new_bytes), (2, 0))
        for batch in data[3:]:
            self.step(model, optimizer, scheduler, batch)
            self.step(*resumed, batch)
        for (key, a), b in zip(model.state_dict().items(), resumed[0].state_dict().values()):
            self.assertTrue(torch.equal(a, b), f"{key} after resuming")

        # `ckpt export --bundle` gives torch.save's dict back, as the loop would have saved it.
        path = os.path.join(TMP, "saved_bundle.pt")
        run(CKPT_BIN, "export", "team-a.saved@1", path, "--bundle",
            f"--store={PLAIN_STORE.address}")
        exported = torch.load(path)
        self.assertEqual(list(exported), ["model", "optimizer", "scheduler", "epoch", "step",
                                          "best_acc"])
        self.assertEqual(exported["step"], 3)
        # Under canonical keys, as every ckpt export writes them (strict=True into the model).
        self.assertEqual(list(exported["model"]), list(bundle.model))
        fresh = self.make()[0]
        fresh.load_state_dict(exported["model"], strict=True)

    def test_save_async_snapshots_at_the_call_and_surfaces_errors_on_the_next(self):
        model, optimizer, scheduler = self.make()
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        with plain_client() as client:
            future = client.save_async("team-a.async", model, optimizer=optimizer,
                                       scheduler=scheduler, step=1)
            with torch.no_grad():  # the loop steps on while the upload runs
                for parameter in model.parameters():
                    parameter.add_(1.0)
            self.assertEqual(future.result(timeout=60).version, 1)
            stored = client.load_state_dict("team-a.async@1")
            for key, tensor in expected.items():
                self.assertTrue(torch.equal(stored[key], tensor), f"{key}: not the snapshot")
            # An upload that fails raises from its future and from the next call.
            failed = client.save_async("team-a.async", model, extra={"hook": lambda: 1})
            self.assertIsInstance(failed.exception(timeout=60), ckpt_client.InvalidArgument)
            with self.assertRaisesRegex(ckpt_client.InvalidArgument, "extra/hook"):
                client.save_async("team-a.async", model)
            # And then it saves again.
            self.assertEqual(client.save_async("team-a.async", model).result(timeout=60).version,
                             2)
            # CheckFreq-style: the copy runs beside the loop, which waits for it before it
            # changes the weights; the version holds the values of the call.
            expected = {k: v.clone() for k, v in model.state_dict().items()}
            overlapped = client.save_async("team-a.async", model, overlap_snapshot=True)
            client.wait_snapshot()
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(1.0)
            self.assertEqual(overlapped.result(timeout=60).version, 3)
            stored = client.load_state_dict("team-a.async@3")
            for key, tensor in expected.items():
                self.assertTrue(torch.equal(stored[key], tensor), f"{key}: not the snapshot")

    def test_save_refuses_what_it_cannot_store_and_commits_nothing(self):
        model, optimizer, _ = self.make()
        with plain_client() as client:
            with self.assertRaisesRegex(ckpt_client.InvalidArgument, "extra/hook"):
                client.save("team-a.refused", model, optimizer=optimizer,
                            extra={"hook": lambda: 1})
            with self.assertRaisesRegex(ckpt_client.InvalidArgument, r"state\['w'\]"):
                client.save("team-a.refused", {"w": [1.0, 2.0]})
            with self.assertRaises(ckpt_client.NotFound):
                client.resolve("team-a.refused")

    def test_complex_numbers_devices_and_dtypes_in_a_bundle_come_back_as_themselves(self):
        # Data, not code, as torch 2.x's weights-only loader keeps them: through save and
        # load_bundle, and through `ckpt import` and `ckpt export --bundle` of a torch.save file.
        values = {"phase": 1.5 - 2j, "device": torch.device("cuda", 1),
                  "where": torch.device("cpu"), "half": torch.float16}
        with plain_client() as client:
            client.save("team-a.values", nn.Linear(2, 2), extra=values)
            bundle = client.load_bundle("team-a.values")
            for key, value in values.items():
                self.assertEqual(bundle.extra[key], value, key)
                self.assertIs(type(bundle.extra[key]), type(value), key)
        path = os.path.join(TMP, "values.pt")
        torch.save({"model": nn.Linear(2, 2).state_dict(), **values}, path)
        run(CKPT_BIN, "import", path, "--model", "team-a.values-file",
            f"--store={PLAIN_STORE.address}")
        exported = os.path.join(TMP, "values-export.pt")
        run(CKPT_BIN, "export", "team-a.values-file", exported, "--bundle",
            f"--store={PLAIN_STORE.address}")
        back = torch.load(exported)
        for key, value in values.items():
            self.assertEqual(back[key], value, key)

    def test_sparse_tensors_keep_their_layout_through_save_load_import_and_export(self):
        # COO (coalesced, and an uncoalesced hybrid with a dense dim) and CSR with int32 indices,
        # in the model and in a bundle's other state; through the loader and the store.
        hybrid = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1], [1, 1, 2]]),
                                         torch.arange(6.0).reshape(3, 2), (2, 3, 2))
        csr = torch.sparse_csr_tensor(torch.tensor([0, 1, 1, 3], dtype=torch.int32),
                                      torch.tensor([2, 0, 3], dtype=torch.int32),
                                      torch.tensor([1.5, -2.0, 4.0]), (3, 4))
        state = {"coo": torch.eye(4).to_sparse(), "hybrid": hybrid, "csr": csr,
                 "dense": torch.ones(3)}

        def assert_same_sparse(got, want, what):
            self.assertEqual((got.layout, got.dtype, got.shape),
                             (want.layout, want.dtype, want.shape), what)
            if want.layout == torch.sparse_coo:
                self.assertTrue(torch.equal(got._indices(), want._indices()), what)
                self.assertTrue(torch.equal(got._values(), want._values()), what)
            elif want.layout == torch.sparse_csr:
                self.assertEqual(got.crow_indices().dtype, want.crow_indices().dtype, what)
                self.assertTrue(torch.equal(got.crow_indices(), want.crow_indices()), what)
                self.assertTrue(torch.equal(got.col_indices(), want.col_indices()), what)
                self.assertTrue(torch.equal(got.values(), want.values()), what)
            else:
                self.assertTrue(torch.equal(got, want), what)

        with plain_client() as client, \
                ckpt_client.Client(store=PLAIN_STORE.address) as store_only:
            client.save("team-a.sparse", state, extra={"csr": csr})
            for source in (client, store_only):
                back = source.load_state_dict("team-a.sparse")
                self.assertEqual(list(back), list(state))
                for key, tensor in state.items():
                    assert_same_sparse(back[key], tensor, key)
            bundle = store_only.load_bundle("team-a.sparse")
            assert_same_sparse(bundle.extra["csr"], csr, "extra csr")
            with self.assertRaisesRegex(ckpt_client.InvalidArgument, "'coo' .* is sparse"):
                store_only.load_flat_range("team-a.sparse", "coo", 0, 1)
        path = os.path.join(TMP, "sparse.pt")
        torch.save(state, path)
        run(CKPT_BIN, "import", path, "--model", "team-a.sparse-file",
            f"--store={PLAIN_STORE.address}")
        exported = os.path.join(TMP, "sparse-export.pt")
        run(CKPT_BIN, "export", "team-a.sparse-file", exported, f"--store={PLAIN_STORE.address}")
        back = torch.load(exported, weights_only=True)
        for key, tensor in state.items():
            assert_same_sparse(back[key], tensor, key)
        refused = subprocess.run(
            [CKPT_BIN, "export", "team-a.sparse-file", os.path.join(TMP, "sparse.safetensors"),
             f"--store={PLAIN_STORE.address}"], capture_output=True, text=True)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("is a sparse_coo tensor, and safetensors holds dense tensors only",
                      refused.stderr)

    def test_save_to_a_dead_store_is_unavailable(self):
        import socket
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with ckpt_client.Client(store=f"127.0.0.1:{port}", timeout=5) as client:
            with self.assertRaises(ckpt_client.Unavailable):
                client.save("team-a.nowhere", nn.Linear(4, 4))

    def test_a_save_sent_again_with_its_idempotency_key_lands_once(self):
        model = nn.Linear(8, 4)
        with plain_client() as client:
            first = client.save("team-a.keyed", model, step=1, idempotency_key="run-7-step-1")
            self.assertFalse(first.replayed)
            again = client.save("team-a.keyed", model, step=1, idempotency_key="run-7-step-1")
            self.assertTrue(again.replayed)
            self.assertEqual(again.version, first.version)
            self.assertEqual(again.new_bytes, 0)
            self.assertEqual([v.version for v in client.versions("team-a.keyed")],
                             [first.version])
            with torch.no_grad():
                model.weight.add_(1)
            with self.assertRaisesRegex(ckpt_client.AlreadyExists, "other tensors"):
                client.save("team-a.keyed", model, idempotency_key="run-7-step-1")
            with self.assertRaisesRegex(ckpt_client.InvalidArgument, "idempotency key"):
                client.save("team-a.keyed", model, idempotency_key="two words")
            self.assertEqual(len(client.versions("team-a.keyed")), 1)

    def test_a_list_of_stores_reaches_the_one_that_serves(self):
        import socket
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{probe.getsockname()[1]}"
        with ckpt_client.Client(store=f"{dead},{PLAIN_STORE.address}", timeout=20) as client:
            for step in range(3):  # round robin would send every other call to the dead one
                saved = client.save("team-a.listed", nn.Linear(4, 4), step=step)
                self.assertEqual(client.resolve("team-a.listed"), saved.version)
        with self.assertRaisesRegex(ckpt_client.InvalidArgument, "empty entry"):
            ckpt_client.Client(store=f"{PLAIN_STORE.address},")

    def test_a_saver_killed_mid_upload_leaves_no_version_and_the_next_save_sends_only_changes(
            self):
        # 16 tensors of one 4 MiB chunk each; version 1 holds them all.
        state = {f"w{i}": torch.full((1 << 20,), float(i)) for i in range(16)}
        with plain_client() as client:
            first = client.save("team-a.killed", state)
            self.assertEqual((first.version, first.chunks_sent, first.chunks_referenced),
                             (1, 16, 0))
        # The child saves the state with two tensors changed, one tensor at a time and slowly
        # (its host copies are slowed here, in the child only), says when the upload is under
        # way, and is SIGKILLed then.
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sys, time, torch, ckpt_client
            from ckpt_client import _upload
            real = _upload.host_bytes
            def slow(tensor):
                print("uploading", flush=True)
                time.sleep(0.5)
                return real(tensor)
            _upload.host_bytes = slow
            _upload.GROUP_BYTES = 1
            state = {{f"w{{i}}": torch.full((1 << 20,), float(i)) for i in range(16)}}
            state["w3"][7] = -1.0
            state["w9"][0] = -1.0
            with ckpt_client.Client(store={PLAIN_STORE.address!r}) as c:
                c.save("team-a.killed", state)
            print("committed", flush=True)
        """)], stdout=subprocess.PIPE, text=True)
        self.assertEqual(child.stdout.readline().strip(), "uploading")
        time.sleep(2.2)  # header accepted, the first tensors named or sent
        child.kill()
        child.wait()
        state["w3"][7] = -1.0
        state["w9"][0] = -1.0
        with plain_client() as client:
            self.assertEqual(client.resolve("team-a.killed"), 1)
            saved = client.save("team-a.killed", state)
            # Only the two changed chunks travel; the other 14 are named by address.
            self.assertEqual((saved.version, saved.chunks_sent, saved.chunks_referenced),
                             (2, 2, 14))
            self.assertEqual((saved.sent_bytes, saved.new_bytes), (2 * (4 << 20), 2 * (4 << 20)))
            stored = client.load_state_dict("team-a.killed@2")
            for key, tensor in state.items():
                self.assertTrue(torch.equal(stored[key], tensor), key)
            # dedup=False sends every byte and stores the same version contents.
            plain = client.save("team-a.killed", state, dedup=False)
            self.assertEqual((plain.chunks_sent, plain.chunks_referenced, plain.new_bytes),
                             (16, 0, 0))


class TlsTest(unittest.TestCase):
    def client(self, **kwargs):
        options = dict(store=TLS_STORE.address, loader=TLS_LOADER.address,
                       ca_file=CERTS["ca.pem"], cert_file=CERTS["client.pem"],
                       key_file=CERTS["client.key"], token_file=TOKEN_FILE, timeout=20)
        options.update(kwargs)
        return ckpt_client.Client(**options)

    def test_load_over_mutual_tls(self):
        with self.client() as client:
            state = client.load_state_dict(f"{MODEL}@production")
            Net().load_state_dict(state, strict=True)
            assert_same(self, state, V1)
            self.assertEqual(client.resolve(MODEL), 2)
        # The certificate names localhost too: dial the address, check the name.
        with self.client(server_name="localhost") as client:
            assert_same(self, client.load_state_dict(f"{MODEL}@2", keys=["head.bias"]),
                        {"head.bias": V2["head.bias"]})

    def test_refusals(self):
        with self.client(token=None, token_file=None) as client:
            with self.assertRaises(ckpt_client.Unauthenticated):
                client.load_state_dict(MODEL)
            with self.assertRaises(ckpt_client.Unauthenticated):
                client.resolve(MODEL)
        with self.client(token="wrong", token_file=None) as client:
            with self.assertRaises(ckpt_client.Unauthenticated):
                client.resolve(MODEL)
        # Plaintext to a TLS server, and TLS without a client certificate to the mutual-TLS
        # loader, never get through.
        with ckpt_client.Client(store=TLS_STORE.address, token=TOKEN, timeout=3) as client:
            with self.assertRaises(ckpt_client.Unavailable):
                client.resolve(MODEL)
        with self.client(cert_file=None, key_file=None, timeout=3) as client:
            with self.assertRaises(ckpt_client.Unavailable):
                client.load_state_dict(MODEL)


class RegistryTest(unittest.TestCase):
    def test_annotate_and_history(self):
        with plain_client() as client:
            annotations = client.annotate(
                f"{MODEL}@production", metrics={"val_acc": 0.93}, tags={"eval": "imagenet-v2"},
                description="first eval", reason="nightly eval")
            self.assertAlmostEqual(annotations.metrics["val_acc"], 0.93)
            self.assertEqual(annotations.tags["eval"], "imagenet-v2")
            self.assertEqual(annotations.description, "first eval")
            self.assertEqual(client.manifest(f"{MODEL}@1").annotations.tags["eval"],
                             "imagenet-v2")
            kinds = client.messages.registry_pb2.RegistryEvent
            events = client.history(MODEL)
            self.assertEqual([e.kind for e in events if e.kind == kinds.VERSION_COMMITTED],
                             [kinds.VERSION_COMMITTED] * 2)
            annotated = [e for e in events if e.kind == kinds.VERSION_ANNOTATED]
            self.assertEqual(len(annotated), 1)
            self.assertEqual((annotated[0].version, annotated[0].reason), (1, "nightly eval"))
            sequences = [e.sequence for e in events]
            self.assertEqual(sequences, sorted(set(sequences)))
            found = client.versions(MODEL, tags=["eval=imagenet-v2"], where=["val_acc>=0.9"])
            self.assertEqual([v.version for v in found], [1])
            self.assertEqual(client.versions(MODEL, where=["val_acc>=0.95"]), [])
            # Plain Python values, not protobuf messages.
            (first,) = found
            self.assertIsInstance(first, ckpt_client.VersionSummary)
            self.assertEqual((first.model, first.aliases, first.tags, first.description),
                             (MODEL, ["production"], {"eval": "imagenet-v2"}, "first eval"))
            self.assertIs(type(first.metrics), dict)
            self.assertAlmostEqual(first.metrics["val_acc"], 0.93)
            self.assertEqual(first.created.tzinfo, datetime.timezone.utc)
            self.assertLess(abs(first.created - datetime.datetime.now(datetime.timezone.utc)),
                            datetime.timedelta(hours=1))
            self.assertEqual(first.tensor_count, len(V1))
            self.assertFalse(first.has_optimizer_state)
            self.assertEqual(first.message.version, 1)
            self.assertIn("version=1", repr(first))

    def test_watch_across_a_sigterm_restart_with_a_second_watcher_resumes_for_a_move_right_after(
            self):
        """The Python watch across a SIGTERM restart with a second watcher connected (a `ckpt
        sync`) and a move right after the restart (issue #36): every move arrives once, in order,
        and a move made as soon as the store is back arrives within RESUME_WITHIN seconds, as it
        does for RemoteWatch (C++), which waits for its channel before resuming. The watch runs
        with its default backoff, as a serving process would."""
        alias, serving = "serving-36", os.path.join(TMP, "serving-36")
        with plain_client() as client, \
                open(os.path.join(TMP, "sync-36.log"), "ab") as sync_log:
            kinds = client.messages.registry_pb2.RegistryEvent
            client.set_alias(f"{MODEL}@1", alias, reason="serve v1")
            updates = queue.Queue()

            def follow():
                try:
                    for update in client.watch(MODEL, alias=alias):
                        updates.put((time.monotonic(), update))
                except ckpt_client.CkptError as error:  # the client closing ends it
                    updates.put((time.monotonic(), error))

            threading.Thread(target=follow, daemon=True).start()
            _, first = updates.get(timeout=20)
            self.assertIsNotNone(first.state, first)
            self.assertEqual(first.state.models[0].aliases[alias], 1)
            sync = subprocess.Popen([CKPT_BIN, "sync", f"{MODEL}@{alias}", serving,
                                     f"--store={PLAIN_STORE.address}"],
                                    stdout=sync_log, stderr=subprocess.STDOUT)
            self.addCleanup(sync.wait)
            self.addCleanup(sync.terminate)
            current = os.path.join(serving, MODEL, "CURRENT")
            deadline = time.monotonic() + 30
            while _read_text(current) != "1":  # the second watcher is following the alias
                self.assertLess(time.monotonic(), deadline, "ckpt sync never served version 1")
                time.sleep(0.05)

            moves, late, version, previous = [], [], 2, first.resume_token
            for restart in range(RESTARTS):
                PLAIN_STORE.restart()
                # Another client moves the alias at once (a rollback by an operator).
                reason = f"move right after restart {restart}"
                run(CKPT_BIN, "promote", f"{MODEL}@{version}", alias, "--reason", reason,
                    f"--store={PLAIN_STORE.address}")
                made = time.monotonic()
                moves.append((version, reason))
                arrived, update = updates.get(timeout=60)
                self.assertNotIsInstance(update, Exception)
                if arrived - made > RESUME_WITHIN:
                    late.append(f"restart {restart}: {arrived - made:.1f} s")
                self.assertIsNone(update.state, "a second state after a resume")
                event = update.event
                self.assertEqual((event.kind, event.alias, event.version),
                                 (kinds.ALIAS_SET, alias, version))
                self.assertIn(reason, event.reason)
                self.assertGreater(event.sequence, previous, "an event seen twice or out of order")
                previous = event.sequence
                version = 3 - version
            self.assertEqual(late, [], f"the watch saw a move made right after a restart more than "
                             f"{RESUME_WITHIN} s after it was made ({len(moves)} moves)")
            time.sleep(0.5)
            self.assertTrue(updates.empty(), "nothing seen twice, nothing else sent")

    def test_watch_sees_alias_moves_across_a_store_restart(self):
        with plain_client() as client:
            kinds = client.messages.registry_pb2.RegistryEvent
            updates = queue.Queue()

            def follow():
                try:
                    for update in client.watch(MODEL, alias="candidate", max_backoff=0.5):
                        updates.put(update)
                except ckpt_client.CkptError as error:  # the client closing ends it
                    updates.put(error)

            threading.Thread(target=follow, daemon=True).start()
            first = updates.get(timeout=20)
            self.assertIsNotNone(first.state, first)
            (info,) = first.state.models
            self.assertEqual((info.name, info.latest_version, info.aliases["production"]),
                             (MODEL, 2, 1))
            self.assertNotIn("candidate", info.aliases)

            def next_event():
                while True:
                    update = updates.get(timeout=30)
                    self.assertNotIsInstance(update, Exception)
                    if update.event is not None:
                        return update.event

            self.assertEqual(client.set_alias(f"{MODEL}@2", "candidate", reason="canary"), 0)
            client.set_alias(f"{MODEL}@2", "elsewhere")  # filtered out: another alias
            moved = next_event()
            self.assertEqual((moved.kind, moved.alias, moved.version, moved.previous_version,
                              moved.reason), (kinds.ALIAS_SET, "candidate", 2, 0, "canary"))
            PLAIN_STORE.restart()  # the watch stream breaks; the watcher resumes from its token
            deadline = time.monotonic() + 20
            while True:  # the client's channel reconnects to the restarted store
                try:
                    client.set_alias(f"{MODEL}@1", "candidate", reason="rollback")
                    break
                except ckpt_client.Unavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            back = next_event()
            self.assertEqual((back.kind, back.version, back.previous_version, back.reason),
                             (kinds.ALIAS_SET, 1, 2, "rollback"))
            self.assertGreater(back.sequence, moved.sequence)
            time.sleep(1)
            self.assertTrue(updates.empty(), "nothing seen twice, nothing else sent")


if __name__ == "__main__":
    unittest.main(verbosity=2)
