"""Checksums to the consumer, from Python: a real loader server on 127.0.0.1:0
(services/loader:tampering_loader, the loader service with a test hook) flips one bit of one
outgoing byte per stream after it took the checksums; ckpt_client must catch every flip, as
DataLoss naming the tensor (and chunk) of a Load or the file offset of an Export, and write
nothing. Streams with no flip must come through intact.
"""
import os
import random
import subprocess
import sys
import time
import unittest

import torch

import ckpt_client

ROOT = os.getcwd()  # the runfiles root (tests/run_python.sh)
TAMPERING_LOADER = os.path.join(ROOT, "services/loader/tampering_loader")
CKPT_BIN = os.path.join(ROOT, "tools/ckpt/ckpt")
TMP = os.environ.get("TEST_TMPDIR") or "/tmp/ckpt_integrity_test"

WEIGHT = torch.arange(6 << 18, dtype=torch.float32)  # 6 MiB: store chunks of 4 MiB and 2 MiB.
TENSORS = {"enc.weight": WEIGHT, "enc.bias": torch.randn(16), "steps": torch.tensor(3)}
SIZES = [t.numel() * t.element_size() for t in TENSORS.values()]  # in Load's tensor_index order
LOAD_TRIALS = 24
EXPORT_TRIALS = 12


def flips():
    """(stream, tensor index or "file", offset) for each trial: Loads first, then Exports."""
    rng = random.Random(20)
    trials = []
    for stream in range(LOAD_TRIALS):
        index = stream % len(SIZES)
        trials.append((stream, index, rng.randrange(SIZES[index])))
    for stream in range(LOAD_TRIALS, LOAD_TRIALS + EXPORT_TRIALS):
        trials.append((stream, "file", rng.randrange(sum(SIZES))))  # the file is larger.
    return trials


class IntegrityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.makedirs(TMP, exist_ok=True)
        source = os.path.join(TMP, "net.pt")
        torch.save(TENSORS, source)
        store = os.path.join(TMP, "store")
        subprocess.run([CKPT_BIN, "import", source, "--model", "net", f"--store_dir={store}"],
                       check=True, capture_output=True)
        port_file = os.path.join(TMP, "loader.port")
        cls.log = open(os.path.join(TMP, "loader.log"), "wb")
        spec = ",".join(f"{s}:{t}:{o}" for s, t, o in flips())
        cls.server = subprocess.Popen(
            [TAMPERING_LOADER, f"--store_dir={store}", f"--port_file={port_file}",
             f"--flips={spec}"], stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if cls.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tampering_loader did not start: " +
                                   open(cls.log.name).read()[-2000:])
            time.sleep(0.02)
        cls.address = "127.0.0.1:" + open(port_file).read().strip()

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        cls.server.wait(timeout=15)
        cls.log.close()

    def test_every_flip_is_caught_then_clean_streams_pass(self):
        trials = flips()
        keys = list(TENSORS)
        with ckpt_client.Client(loader=self.address, timeout=60) as client:
            for stream, index, offset in trials[:LOAD_TRIALS]:
                with self.assertRaises(ckpt_client.DataLoss, msg=f"load {stream}") as caught:
                    client.load_state_dict("net@1")
                error = caught.exception
                self.assertEqual(error.code.name, "DATA_LOSS")
                self.assertEqual(error.tensor, keys[index])
                self.assertEqual(error.chunk, offset // (4 << 20))
                self.assertIn(f"tensor '{keys[index]}' chunk {error.chunk}", str(error))
            path = os.path.join(TMP, "net.safetensors")
            for number, (stream, _, offset) in enumerate(trials[LOAD_TRIALS:]):
                # Every other one checked with SHA-256 (what Node and browsers have built in).
                checksum = "sha256" if number % 2 else "xxh3"
                with self.assertRaises(ckpt_client.DataLoss, msg=f"export {stream}") as caught:
                    client.export("net@1", path, format="safetensors", checksum=checksum)
                error = caught.exception
                self.assertIn(f"arrived with {checksum} ", str(error))
                self.assertLessEqual(error.offset, offset)
                self.assertIn("damaged between the loader and this client", str(error))
                self.assertFalse(os.path.exists(path))
                self.assertEqual([n for n in os.listdir(TMP) if n.endswith(".partial")], [])
            # Every flip was made (the server logs each), and streams past the list are intact.
            log = open(self.log.name).read()
            self.assertEqual(log.count("tampering_loader: flipped"), len(trials), log[-2000:])
            state = client.load_state_dict("net@1")
            for key, tensor in TENSORS.items():
                self.assertTrue(torch.equal(state[key], tensor), key)
            info = client.export("net@1", path, format="safetensors")
            self.assertEqual(info["bytes"], os.path.getsize(path))
            info = client.export("net@1", path, format="safetensors", checksum="sha256")
            self.assertEqual(info["bytes"], os.path.getsize(path))

    def test_a_missing_xxhash_module_fails_the_export_instead_of_skipping_it(self):
        saved = sys.modules.get("xxhash")
        sys.modules["xxhash"] = None  # import xxhash now raises ImportError
        try:
            with ckpt_client.Client(loader=self.address, timeout=60) as client:
                with self.assertRaises(ckpt_client.FailedPrecondition) as caught:
                    client.export("net@1", os.path.join(TMP, "unchecked.pt"))
                self.assertIn("python3-xxhash", str(caught.exception))
                self.assertFalse(os.path.exists(os.path.join(TMP, "unchecked.pt")))
                # (checksum="sha256" needs no module beyond hashlib: the other test uses it.)
        finally:
            if saved is None:
                del sys.modules["xxhash"]
            else:
                sys.modules["xxhash"] = saved


if __name__ == "__main__":
    unittest.main()
