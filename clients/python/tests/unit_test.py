"""ckpt_client without servers: references, metric conditions, the stream verifier (real chunk
and content hashes, tampered bytes), and generating the gRPC modules from the .proto files."""
import collections
import hashlib
import inspect
import os
import subprocess
import sys
import tempfile
import time
import typing
import unittest

import torch

import ckpt_client
from ckpt_client import _retry, _stubs
from ckpt_client._tensors import (CHUNK_BYTES, RangeAssembler, StreamAssembler,
                                  check_chunk_layout, chunks_covering, to_tensor, torch_dtypes)
from ckpt_client.client import _parse_condition

PB = _stubs.load()
TYPES = PB.types_pb2


def meta_for(key, tensor, chunks=True, content_hash="scheme"):
    """The TensorMeta a store would send for `tensor`: 4 MiB chunks with their SHA-256s, or only
    a content hash ("scheme": over the chunk digests, "legacy": over the bytes, None)."""
    data = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    meta = TYPES.TensorMeta(key=key, dtype=TYPES.DTYPE_FLOAT32, shape=list(tensor.shape),
                            byte_length=len(data))
    digests = []
    for start in range(0, len(data), CHUNK_BYTES):
        piece = data[start:start + CHUNK_BYTES]
        digests.append((hashlib.sha256(piece).digest(), len(piece)))
    if chunks:
        for digest, length in digests:
            meta.chunks.add(sha256=digest, length=length)
    if content_hash == "scheme":
        meta.content_hash = hashlib.sha256(
            b"".join(d + n.to_bytes(8, "little") for d, n in digests)).digest()
    elif content_hash == "legacy":
        meta.content_hash = hashlib.sha256(data).digest()
    return meta, data


def tensor_data(data, tensor_index, size=(1 << 20) + 7):
    """TensorData messages of `data` in `size` pieces (not aligned with chunks on purpose)."""
    # TensorData lives in checkpoint_store.proto.
    message = PB.checkpoint_store_pb2.TensorData
    return [message(tensor_index=tensor_index, offset=offset, data=data[offset:offset + size])
            for offset in range(0, len(data), size)]


class RefTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(ckpt_client.parse_ref("resnet"), ("resnet", None, "latest"))
        self.assertEqual(ckpt_client.parse_ref("team-a/resnet@7"), ("team-a/resnet", 7, None))
        self.assertEqual(ckpt_client.parse_ref("resnet@production"),
                         ("resnet", None, "production"))
        for bad in ("", "@7", "resnet@", "a@b@c", "resnet@0", None):
            with self.assertRaises(ckpt_client.InvalidArgument, msg=repr(bad)):
                ckpt_client.parse_ref(bad)

    def test_conditions(self):
        self.assertEqual(_parse_condition("val_acc>=0.9"), ("val_acc", 0.9, None))
        self.assertEqual(_parse_condition("loss <= 0.25"), ("loss", None, 0.25))
        self.assertEqual(_parse_condition("epoch==3"), ("epoch", 3.0, 3.0))
        for bad in ("val_acc>0.9", ">=1", "acc>=high"):
            with self.assertRaises(ckpt_client.InvalidArgument, msg=bad):
                _parse_condition(bad)


class TypeHintsTest(unittest.TestCase):
    def test_every_public_method_is_annotated_and_its_hints_resolve(self):
        # The package ships py.typed: a hint that names nothing would break its users' checkers.
        for name, method in inspect.getmembers(ckpt_client.Client, inspect.isfunction):
            if name.startswith("_") and name not in ("__init__", "__enter__", "__exit__"):
                continue
            hints = typing.get_type_hints(method)
            self.assertIn("return", hints, f"Client.{name} has no return annotation")
            for parameter in inspect.signature(method).parameters.values():
                if parameter.name == "self":
                    continue
                self.assertIn(parameter.name, hints, f"Client.{name}({parameter.name}) is bare")
        self.assertIn("return", typing.get_type_hints(ckpt_client.parse_ref))
        self.assertTrue(os.path.isfile(os.path.join(os.path.dirname(ckpt_client.__file__),
                                                    "py.typed")))


class ValuesTest(unittest.TestCase):
    def test_decodes_every_kind_keeping_int_keys_order_tuples_and_tensors(self):
        from ckpt_client._values import decode_value
        pb = _stubs.load().types_pb2
        tensor = torch.arange(3.0)
        value = pb.Value(dict_value=pb.ValueDict(ordered=True, entries=[
            pb.DictEntry(int_key=0, value=pb.Value(tensor_value=pb.TensorRef(key="t"))),
            pb.DictEntry(string_key="none", value=pb.Value(none_value=pb.NoneValue())),
            pb.DictEntry(string_key="flag", value=pb.Value(bool_value=False)),
            pb.DictEntry(string_key="betas", value=pb.Value(tuple_value=pb.ValueList(items=[
                pb.Value(float_value=0.9), pb.Value(int_value=2)]))),
            pb.DictEntry(string_key="list", value=pb.Value(list_value=pb.ValueList(items=[
                pb.Value(string_value="s"), pb.Value(bytes_value=b"b")]))),
            pb.DictEntry(string_key="fn", value=pb.Value(opaque_value=pb.OpaqueObject(
                class_name="builtins.getattr"))),
        ]))
        decoded = decode_value(value, {"t": tensor})
        self.assertIsInstance(decoded, collections.OrderedDict)
        self.assertEqual(list(decoded), [0, "none", "flag", "betas", "list", "fn"])
        self.assertIs(decoded[0], tensor)
        self.assertIsNone(decoded["none"])
        self.assertIs(decoded["flag"], False)
        self.assertEqual(decoded["betas"], (0.9, 2))
        self.assertEqual(decoded["list"], ["s", b"b"])
        self.assertEqual(decoded["fn"], ckpt_client.Opaque("builtins.getattr", None, None))
        with self.assertRaisesRegex(ckpt_client.ProtocolError, "tensor 'missing'"):
            decode_value(pb.Value(tensor_value=pb.TensorRef(key="missing")), {})


class BackoffTest(unittest.TestCase):
    """The same cases as libs/io/backoff_test.cc: the two must pace retries alike."""

    def test_doubles_up_to_the_cap_and_jitter_takes_a_fraction_off(self):
        self.assertEqual([_retry.delay(0.1, 1.0, 2.0, 0.0, n, 0.5) for n in (0, 1, 3, 4, 10**6)],
                         [0.1, 0.2, 0.8, 1.0, 1.0])
        self.assertAlmostEqual(_retry.delay(0.1, 10.0, 2.0, 1.0, 3, 0.5), 0.4)
        self.assertEqual(_retry.delay(0.1, 10.0, 2.0, 1.0, 3, 1.0), 0.0)
        self.assertAlmostEqual(_retry.delay(0.1, 10.0, 2.0, 0.2, 0, 1.0), 0.08)
        self.assertEqual(_retry.delay(-1.0, 1.0, 2.0, 0.0, 3, 0.0), 0.0)
        self.assertEqual(_retry.delay(0.1, 1.0, 0.5, 0.0, 3, 0.0), 0.1)

    def test_next_reset_and_deadline(self):
        backoff = _retry.Backoff(0.01, 0.04, jitter=0.0, uniform01=lambda: 0.0)
        self.assertEqual([backoff.next() for _ in range(4)], [0.01, 0.02, 0.04, 0.04])
        backoff.reset()
        self.assertEqual(backoff.next(), 0.01)
        late = _retry.Backoff(30.0, 60.0, deadline=time.monotonic() + 1.0)
        start = time.monotonic()
        self.assertFalse(late.wait())
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertEqual(late.retries, 0)


class UploaderTest(unittest.TestCase):
    def test_names_the_chunks_the_store_holds_and_sends_the_others_in_pieces(self):
        from ckpt_client._upload import Uploader
        pb = PB.checkpoint_store_pb2
        big = torch.arange((9 << 20) // 4, dtype=torch.float32)  # chunks of 4, 4 and 1 MiB
        small = torch.ones(3)
        data = big.view(torch.uint8).numpy().tobytes()
        held = hashlib.sha256(data[:CHUNK_BYTES]).digest()
        asked = []

        def find_missing(addresses):
            asked.extend(addresses)
            return [a for a in addresses if a != held]

        uploader = Uploader(pb, pb.UploadHeader(model="m"), [big, small], ["best"], find_missing)
        messages = list(uploader.requests())
        self.assertEqual(len(asked), 4)  # three chunks of big, one of small, each once
        self.assertEqual(messages[0].WhichOneof("part"), "header")
        self.assertEqual(messages[1].stored_chunk, pb.StoredChunk(
            tensor_index=0, offset=0, sha256=held, length=CHUNK_BYTES))
        pieces = [m.data for m in messages[2:-1]]
        self.assertEqual([(p.tensor_index, p.offset, len(p.data)) for p in pieces],
                         [(0, (4 + i) << 20, 1 << 20) for i in range(5)] + [(1, 0, 12)])
        self.assertEqual(b"".join(p.data for p in pieces[:5]), data[CHUNK_BYTES:])
        self.assertEqual(list(messages[-1].commit.aliases), ["best"])
        stats = uploader.stats
        self.assertEqual((stats.chunks_sent, stats.chunks_referenced, stats.sent_bytes),
                         (3, 1, (5 << 20) + 12))

        # Without find_missing every byte goes, nothing is hashed.
        every = [m.WhichOneof("part") for m in Uploader(pb, pb.UploadHeader(), [big], [],
                                                        None).requests()]
        self.assertEqual(every, ["header"] + ["data"] * 9 + ["commit"])

    def test_an_error_making_the_messages_is_kept_for_the_caller(self):
        from ckpt_client._upload import Uploader
        pb = PB.checkpoint_store_pb2

        def refuse(addresses):
            raise ckpt_client.PermissionDenied("no")

        uploader = Uploader(pb, pb.UploadHeader(), [torch.ones(4)], [], refuse)
        with self.assertRaises(ckpt_client.PermissionDenied):
            list(uploader.requests())
        self.assertIsInstance(uploader.error, ckpt_client.PermissionDenied)


class HostSnapshotTest(unittest.TestCase):
    def test_copies_into_the_previous_snapshots_buffers_where_they_fit(self):
        from ckpt_client._bundles import HostSnapshot
        snapshot = HostSnapshot()
        state = {"w": torch.ones(4), "opt": {"state": {0: {"step": torch.tensor(1.0)}}},
                 "lr": 0.1, "shape": (torch.zeros(2),)}
        first = snapshot.take(state)
        state["w"].add_(1)  # the caller changes its own at once
        self.assertTrue(torch.equal(first["w"], torch.ones(4)))
        state["shape"] = (torch.zeros(3),)  # no longer fits its buffer
        second = snapshot.take(state)
        self.assertEqual(second["w"].data_ptr(), first["w"].data_ptr())
        self.assertTrue(torch.equal(second["w"], torch.full((4,), 2.0)))
        self.assertEqual(second["opt"]["state"][0]["step"].data_ptr(),
                         first["opt"]["state"][0]["step"].data_ptr())
        self.assertNotEqual(second["shape"][0].data_ptr(), first["shape"][0].data_ptr())
        self.assertEqual((second["lr"], tuple(second["shape"][0].shape)), (0.1, (3,)))
        self.assertIsNot(second["w"], state["w"])


class EncodeTest(unittest.TestCase):
    def test_round_trips_an_optimizer_state_dict_and_refuses_what_needs_pickling(self):
        from ckpt_client._values import StateTensors, decode_value, encode_value
        from ckpt_client._tensors import describe_tensor
        pb = _stubs.load().types_pb2
        dtypes = torch_dtypes(pb)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.Adam(model.parameters())
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        state = optimizer.state_dict()
        table = StateTensors(lambda key, t: describe_tensor(key, t, pb, dtypes))
        value = encode_value(state, "optimizer", table, pb)
        self.assertEqual([m.key for m in table.metas][:3],
                         ["optimizer/state/0/step", "optimizer/state/0/exp_avg",
                          "optimizer/state/0/exp_avg_sq"])
        decoded = decode_value(value, dict(zip((m.key for m in table.metas), table.tensors)))
        self.assertEqual(decoded["param_groups"], state["param_groups"])
        self.assertEqual(list(decoded["state"]), [0, 1])
        self.assertTrue(torch.equal(decoded["state"][1]["exp_avg"], state["state"][1]["exp_avg"]))
        for bad, where in (({"f": len}, "x/f"), ({1.5: 0}, "its key 1.5"), ([object()], "x/0")):
            with self.assertRaisesRegex(ckpt_client.InvalidArgument, where):
                encode_value(bad, "x", table, pb)


class VerifierTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        # 9 MiB + 12 bytes: chunks of 4, 4 and 1 MiB + 12 bytes.
        self.big = torch.randn(9 * (1 << 18) + 3)
        self.small = torch.arange(6, dtype=torch.float32).reshape(2, 3)

    def assemble(self, metas, datas, verify=True):
        assembler = StreamAssembler(metas, range(len(metas)), verify)
        for index, data in enumerate(datas):
            for message in tensor_data(data, index):
                assembler.add(message)
        buffers = assembler.finish()
        return [to_tensor(metas[i], buffers[i], torch_dtypes(TYPES)) for i in buffers]

    def test_intact_chunks_and_content_hashes(self):
        for chunks, content_hash in ((True, None), (False, "scheme"), (False, "legacy")):
            with self.subTest(chunks=chunks, content_hash=content_hash):
                big_meta, big_data = meta_for("big", self.big, chunks, content_hash)
                small_meta, small_data = meta_for("layer.w", self.small, chunks, content_hash)
                if chunks:
                    self.assertEqual(len(big_meta.chunks), 3)
                big, small = self.assemble([big_meta, small_meta], [big_data, small_data])
                self.assertTrue(torch.equal(big, self.big))
                self.assertTrue(torch.equal(small, self.small))

    def test_tampered_chunk_is_named(self):
        meta, data = meta_for("encoder.weight", self.big)
        tampered = bytearray(data)
        tampered[CHUNK_BYTES + 5] ^= 0x01  # one bit in chunk 1
        with self.assertRaises(ckpt_client.IntegrityError) as caught:
            self.assemble([meta], [bytes(tampered)])
        self.assertEqual(caught.exception.tensor, "encoder.weight")
        self.assertEqual(caught.exception.chunk, 1)
        self.assertIn("tensor 'encoder.weight' chunk 1", str(caught.exception))
        self.assertIsInstance(caught.exception, ckpt_client.CkptError)

    def test_tampered_content_hash(self):
        for content_hash in ("scheme", "legacy"):
            meta, data = meta_for("w", self.big, chunks=False, content_hash=content_hash)
            tampered = bytearray(data)
            tampered[-1] ^= 0x80
            with self.assertRaises(ckpt_client.IntegrityError) as caught:
                self.assemble([meta], [bytes(tampered)])
            self.assertEqual(caught.exception.tensor, "w")
            self.assertIn("content hash", str(caught.exception))

    def test_unverifiable_tensor_is_refused_unless_asked(self):
        meta, data = meta_for("w", self.small, chunks=False, content_hash=None)
        with self.assertRaises(ckpt_client.IntegrityError):
            self.assemble([meta], [data])
        (tensor,) = self.assemble([meta], [data], verify=False)
        self.assertTrue(torch.equal(tensor, self.small))

    def test_chunks_covering_a_range_as_libs_store_chunk_layout_finds_them(self):
        """The cases of libs/store/chunk_layout_test.cc's ChunksCovering, and its words."""
        c = CHUNK_BYTES
        meta = TYPES.TensorMeta(key="fc.weight", byte_length=3 * c + 10)
        for length in (c, c, c, 10):
            meta.chunks.add(length=length)
        cases = {(0, 3 * c + 10): (0, 4, 0, 3 * c + 10), (0, 1): (0, 1, 0, c),
                 (c - 1, c + 1): (0, 2, 0, 2 * c), (c, 2 * c): (1, 2, c, 2 * c),
                 (2 * c + 5, 3 * c + 3): (2, 4, 2 * c, 3 * c + 10),
                 (3 * c + 9, 3 * c + 10): (3, 4, 3 * c, 3 * c + 10),
                 (c + 7, c + 7): (0, 0, c + 7, c + 7)}
        for (begin, end), expected in cases.items():
            self.assertEqual(chunks_covering(meta, begin, end), expected, (begin, end))
        small = TYPES.TensorMeta(key="fc.weight", byte_length=10)
        small.chunks.add(length=10)
        for begin, end in ((-1, 3), (4, 3), (0, 11)):
            with self.assertRaisesRegex(ckpt_client.OutOfRange,
                                        "of tensor 'fc.weight' of mlp@3: it holds 10 bytes"):
                chunks_covering(small, begin, end, "mlp@3")

    def test_a_range_is_kept_from_whole_checked_chunks(self):
        """RangeAssembler keeps bytes begin..end of the chunks that hold them, and names a chunk
        whose bytes were damaged."""
        meta, data = meta_for("fc.weight", self.big)
        begin, end = CHUNK_BYTES - 5, CHUNK_BYTES + 9
        assembler = RangeAssembler(meta, 0, begin, end, True, "mlp@3")
        for message in tensor_data(data[:2 * CHUNK_BYTES], 0):
            assembler.add(message)
        self.assertEqual(bytes(assembler.finish()), data[begin:end])
        damaged = bytearray(data[:2 * CHUNK_BYTES])
        damaged[CHUNK_BYTES + 100] ^= 1
        assembler = RangeAssembler(meta, 0, begin, end, True, "mlp@3")
        for message in tensor_data(bytes(damaged), 0):
            assembler.add(message)
        with self.assertRaisesRegex(ckpt_client.IntegrityError, "chunk 1 "):
            assembler.finish()

    def test_chunk_layout_is_checked_as_libs_store_chunk_layout_checks_it(self):
        """The cases and messages of libs/store/chunk_layout.h's CheckChunkLayout, also through
        StreamAssembler, which checks before it makes a tensor's buffer."""
        meta, data = meta_for("fc.weight", self.big)
        check_chunk_layout(meta, "mlp@3")  # 4 MiB, 4 MiB and the rest: intact
        empty, _ = meta_for("e", torch.zeros(0))
        empty.chunks.add(sha256=hashlib.sha256(b"").digest(), length=0)
        check_chunk_layout(empty)  # an empty tensor stored as one empty chunk
        check_chunk_layout(TYPES.TensorMeta(key="e"))  # or as none

        too_long = TYPES.TensorMeta()
        too_long.CopyFrom(meta)
        too_long.chunks[0].length = CHUNK_BYTES + 1
        too_long.chunks[1].length -= 1
        negative = TYPES.TensorMeta(key="fc.weight", byte_length=0)
        negative.chunks.add(length=-1)
        negative.chunks.add(length=1)
        short = TYPES.TensorMeta()
        short.CopyFrom(meta)
        del short.chunks[2]
        # A forged byte_length with one chunk: refused before a buffer of that size is made.
        huge = TYPES.TensorMeta(key="fc.weight", byte_length=1 << 50)
        huge.chunks.add(length=12)
        no_chunks = TYPES.TensorMeta(key="fc.weight", byte_length=12)
        cases = [
            (too_long, 0, f"tensor 'fc.weight' of mlp@3 names a chunk of {CHUNK_BYTES + 1} "
                          f"bytes; chunks hold 0..{CHUNK_BYTES}"),
            (negative, 0, "tensor 'fc.weight' of mlp@3 names a chunk of -1 bytes; chunks hold "
                          "0..4194304"),
            (short, None, f"tensor 'fc.weight' of mlp@3: its chunks hold {2 * CHUNK_BYTES} "
                          f"bytes, its byte_length is {len(data)}"),
            (huge, None, "tensor 'fc.weight' of mlp@3: its chunks hold 12 bytes, its "
                         f"byte_length is {1 << 50}"),
            (no_chunks, None, "tensor 'fc.weight' of mlp@3: its chunks hold 0 bytes, its "
                              "byte_length is 12"),
        ]
        for bad, chunk, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(ckpt_client.IntegrityError) as caught:
                    check_chunk_layout(bad, "mlp@3")
                self.assertEqual(str(caught.exception), message)
                self.assertEqual((caught.exception.tensor, caught.exception.chunk),
                                 ("fc.weight", chunk))
                self.assertIsInstance(caught.exception, ckpt_client.DataLoss)
                if bad is not no_chunks:  # without chunks the stream checks the content hash
                    with self.assertRaises(ckpt_client.IntegrityError) as streamed:
                        StreamAssembler([bad], [0], where="mlp@3")
                    self.assertEqual(str(streamed.exception), message)
        with self.assertRaisesRegex(ckpt_client.IntegrityError,
                                    r"^tensor 'fc.weight': its chunks hold 12 bytes"):
            check_chunk_layout(huge)  # no version to name
        # A Download stream's manifest names the version.
        pb = PB.checkpoint_store_pb2
        stream = [pb.DownloadResponse(manifest=pb.Manifest(model="mlp", version=3,
                                                           tensors=[huge]))]
        with self.assertRaisesRegex(ckpt_client.IntegrityError, r"^tensor 'fc.weight' of mlp@3: "):
            ckpt_client.Client._receive("mlp@3", iter(stream), True,
                                        lambda manifest: (list(manifest.tensors), [0]))

    def test_broken_streams(self):
        meta, data = meta_for("w", self.big)
        assembler = StreamAssembler([meta], [0])
        messages = tensor_data(data, 0)
        with self.assertRaises(ckpt_client.ProtocolError):  # out of order
            assembler.add(messages[1])
        assembler = StreamAssembler([meta], [0])
        for message in messages[:-1]:
            assembler.add(message)
        with self.assertRaises(ckpt_client.ProtocolError):  # cut short
            assembler.finish()
        with self.assertRaises(ckpt_client.ProtocolError):  # a tensor not selected
            StreamAssembler([meta], []).add(messages[0])

    def test_scalar_and_empty(self):
        scalar = torch.tensor(2.5)
        empty = torch.zeros(0, 4)
        metas, datas = zip(*(meta_for("s", scalar), meta_for("e", empty)))
        s, e = self.assemble(list(metas), list(datas))
        self.assertEqual(s.shape, torch.Size([]))
        self.assertEqual(s.item(), 2.5)
        self.assertEqual(e.shape, torch.Size([0, 4]))


class StubsTest(unittest.TestCase):
    def test_generates_into_cache_and_loads_from_proto_dir(self):
        root = _stubs._proto_root()
        self.assertIsNotNone(root, "the .proto files are in the runfiles")
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as cache:
            os.environ["XDG_CACHE_HOME"] = cache
            try:
                generated = _stubs._generate(root)
                self.assertTrue(generated.startswith(os.path.join(cache, "ckpt_client")))
                self.assertEqual(_stubs._generate(root), generated)  # cached: same directory
            finally:
                del os.environ["XDG_CACHE_HOME"]
            # A fresh interpreter takes them from CKPT_CLIENT_PROTO_DIR, and `proto` (proto-plus's
            # import name) stays free.
            env = dict(os.environ, CKPT_CLIENT_PROTO_DIR=generated)
            script = ("import sys, ckpt_client._stubs as s; pb = s.load(); "
                      "print(pb.directory); print(pb.loader_pb2.LoadRequest.DESCRIPTOR.full_name);"
                      "print(any(m == 'proto' or m.startswith('proto.') for m in sys.modules))")
            out = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()
            self.assertEqual(out, [generated, "ckpt.v1.LoadRequest", "False"])

    def test_missing_protoc_names_the_package(self):
        saved = (_stubs._find_tool, os.environ.get("XDG_CACHE_HOME"))
        _stubs._find_tool = lambda name, fallback: None  # as on a machine without them
        try:
            with self.assertRaises(ckpt_client.StubsUnavailableError) as caught:
                _stubs._generate(_stubs._proto_root())
        finally:
            _stubs._find_tool = saved[0]
        self.assertIn("protoc and grpc_python_plugin", str(caught.exception))
        self.assertIn("protobuf-compiler-grpc", str(caught.exception))

    def test_bad_proto_dir_is_an_error(self):
        env = dict(os.environ, CKPT_CLIENT_PROTO_DIR=os.environ.get("TEST_TMPDIR", "/tmp"))
        result = subprocess.run([sys.executable, "-c", "import ckpt_client; ckpt_client.Client("
                                 "store='127.0.0.1:1')"], env=env, capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("does not hold the generated ckpt.v1 modules", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
