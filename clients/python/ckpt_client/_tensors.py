"""Rebuilding tensors from a Load / Download stream, verifying every byte on the way.

What the protocol carries to check against (proto/ckpt/v1/types.proto):

* ``TensorMeta.chunks``: the store's Download manifest, and the loader's Load manifest for every
  tensor it sends as stored, list each tensor's chunks, each with the SHA-256 of its bytes and its
  length, as the store computed them. Chunks are consecutive pieces of the tensor; each one is
  hashed as its bytes arrive and compared when it is complete, so a bad byte is reported with the
  tensor and the chunk that hold it.
* ``TensorMeta.content_hash``: loaders built before they kept chunk lists send only an uncast
  tensor's content hash: SHA-256 over its chunks' SHA-256s each followed by the chunk length as
  8 little-endian bytes, with chunks cut every 4 MiB from offset 0 (libs/store/chunk_hasher.h).
  The client cuts the received bytes the same way. Stores written before that scheme hold SHA-256
  of the bytes themselves, which is accepted too.

A tensor with neither (one the loader casts) is checked only by the XXH3-64 TensorDigest the
loader sends after it on request; this client never asks the loader to cast (it asks for stored
dtypes and casts itself), so ``verify=True`` refuses a tensor with neither. A failed check raises
IntegrityError, a DataLoss.

Before any of that, a tensor's chunk refs are checked against its byte_length by
check_chunk_layout, the rule and the words of libs/store/chunk_layout.h's CheckChunkLayout.
"""
import hashlib
import sys

import torch

from .errors import IntegrityError, ProtocolError

CHUNK_BYTES = 4 << 20  # libs/store/chunk_hasher.h kChunkBytes: part of the content-hash scheme.


def check_chunk_layout(meta, where=""):
    """Checks that `meta`'s chunk refs describe its bytes, before they are trusted: the Python
    mirror of libs/store/chunk_layout.h (CheckChunkLayout), which every C++ reader of a manifest
    runs, with the same rule and the same words. The store cuts a tensor's bytes into chunks of
    CHUNK_BYTES from offset 0 (libs/store/chunk_hasher.h), so each chunk ref is 0..CHUNK_BYTES
    long and their lengths add up to the tensor's byte_length; a manifest that says otherwise was
    damaged or forged. Otherwise raises IntegrityError (a DataLoss, as the C++ check's
    DATA_LOSS) naming the tensor and, when `where` ("MODEL@N") is given, the version:
    "tensor 'fc.weight' of mlp@3 names a chunk of N bytes; chunks hold 0..4194304" or
    "tensor 'fc.weight' of mlp@3: its chunks hold X bytes, its byte_length is Y".

    As in C++, a meta with no chunk refs passes only when its byte_length is 0; the stream
    verifier calls this for the tensors whose manifest lists chunks (a loader older than this
    client lists none and names a content hash instead, checked in _Tensor.finish)."""
    tensor = f"tensor '{meta.key}'" + (f" of {where}" if where else "")
    total = 0
    for index, chunk in enumerate(meta.chunks):
        if chunk.length < 0 or chunk.length > CHUNK_BYTES:
            raise IntegrityError(f"{tensor} names a chunk of {chunk.length} bytes; chunks hold "
                                 f"0..{CHUNK_BYTES}", tensor=meta.key, chunk=index)
        total += chunk.length
    if total != meta.byte_length:
        raise IntegrityError(f"{tensor}: its chunks hold {total} bytes, its byte_length is "
                             f"{meta.byte_length}", tensor=meta.key)


def chunks_covering(meta, begin, end, where=""):
    """The chunks of `meta` (whose layout check_chunk_layout accepted) that hold bytes
    [begin, end) of it, as (first_chunk, end_chunk, first_offset, end_offset): chunks
    first_chunk..end_chunk-1, the first starting at byte first_offset of the tensor, the last
    ending at end_offset; an empty range is held by none. The Python mirror of
    libs/store/chunk_layout.h's ChunksCovering, with its words: OutOfRange "bytes B..E of tensor
    'K' of M@N: it holds L bytes" unless 0 <= begin <= end <= byte_length."""
    from .errors import OutOfRange  # noqa: PLC0415 (errors imports nothing from here)
    if begin < 0 or end < begin or end > meta.byte_length:
        tensor = f"tensor '{meta.key}'" + (f" of {where}" if where else "")
        raise OutOfRange(f"bytes {begin}..{end} of {tensor}: it holds {meta.byte_length} bytes")
    if begin == end:
        return 0, 0, begin, begin
    first = None
    offset = 0
    for index, chunk in enumerate(meta.chunks):
        chunk_end = offset + chunk.length
        if first is None and chunk_end > begin:
            first = (index, offset)
        if first is not None and chunk_end >= end:
            return first[0], index + 1, first[1], chunk_end
        offset = chunk_end
    raise IntegrityError(f"tensor '{meta.key}': its chunks end before byte {end}",
                         tensor=meta.key)


class RangeAssembler:
    """Collects the TensorData of a ranged Download (one range of one tensor: the whole chunks
    holding it, in order), checks each chunk against its SHA-256 in the manifest as it
    completes, and keeps bytes [begin, end)."""

    def __init__(self, meta, index, begin, end, verify=True, where=""):
        check_chunk_layout(meta, where)
        first, last, first_offset, end_offset = chunks_covering(meta, begin, end, where)
        self.meta = meta
        self.index = index
        self.begin = begin
        self.end = end
        self.verify = verify
        self.chunks = list(meta.chunks)[first:last]
        self.first_chunk = first
        self.first_offset = first_offset
        self.end_offset = end_offset
        self.buffer = bytearray(end_offset - first_offset)
        self.received = first_offset

    def add(self, data):
        """Takes one TensorData message."""
        key = self.meta.key
        if data.tensor_index != self.index:
            raise ProtocolError(f"TensorData for tensor index {data.tensor_index} in a download "
                                f"of a range of tensor '{key}' (index {self.index})")
        if data.offset != self.received:
            raise ProtocolError(f"tensor '{key}': bytes at offset {data.offset} arrived after "
                                f"those up to {self.received} (the stream sends them in order)")
        end = data.offset + len(data.data)
        if end > self.end_offset:
            raise ProtocolError(f"tensor '{key}': bytes up to {end} sent for a range whose "
                                f"chunks end at {self.end_offset}")
        at = data.offset - self.first_offset
        self.buffer[at:at + len(data.data)] = data.data
        self.received = end

    def finish(self):
        """Checks completeness and each chunk; returns bytes [begin, end) as a bytearray."""
        key = self.meta.key
        if self.received != self.end_offset:
            raise ProtocolError(f"tensor '{key}': the stream ended at byte {self.received} of a "
                                f"range whose chunks end at {self.end_offset}")
        if self.verify:
            at = 0
            for number, chunk in enumerate(self.chunks, start=self.first_chunk):
                digest = hashlib.sha256(memoryview(self.buffer)[at:at + chunk.length]).digest()
                if digest != chunk.sha256:
                    start = self.first_offset + at
                    raise IntegrityError(
                        f"tensor '{key}' chunk {number} (bytes {start}..{start + chunk.length}) "
                        f"has SHA-256 {digest.hex()}, the manifest says {chunk.sha256.hex()}: "
                        "the bytes were damaged on the way or in the store",
                        tensor=key, chunk=number)
                at += chunk.length
        skip = self.begin - self.first_offset
        return self.buffer[skip:skip + self.end - self.begin]


def torch_dtypes(types_pb2):
    """ckpt.v1.DType -> torch.dtype, for the dtypes this torch has."""
    table = {
        types_pb2.DTYPE_FLOAT32: torch.float32,
        types_pb2.DTYPE_FLOAT64: torch.float64,
        types_pb2.DTYPE_FLOAT16: torch.float16,
        types_pb2.DTYPE_BFLOAT16: torch.bfloat16,
        types_pb2.DTYPE_UINT8: torch.uint8,
        types_pb2.DTYPE_INT8: torch.int8,
        types_pb2.DTYPE_INT16: torch.int16,
        types_pb2.DTYPE_INT32: torch.int32,
        types_pb2.DTYPE_INT64: torch.int64,
        types_pb2.DTYPE_BOOL: torch.bool,
        types_pb2.DTYPE_COMPLEX64: torch.complex64,
        types_pb2.DTYPE_COMPLEX128: torch.complex128,
    }
    optional = {  # not in every torch
        "DTYPE_COMPLEX32": "complex32",
        "DTYPE_FLOAT8_E4M3FN": "float8_e4m3fn",
        "DTYPE_FLOAT8_E5M2": "float8_e5m2",
        "DTYPE_FLOAT8_E4M3FNUZ": "float8_e4m3fnuz",
        "DTYPE_FLOAT8_E5M2FNUZ": "float8_e5m2fnuz",
        "DTYPE_UINT16": "uint16",
        "DTYPE_UINT32": "uint32",
        "DTYPE_UINT64": "uint64",
    }
    for enum_name, torch_name in optional.items():
        if hasattr(torch, torch_name):
            table[types_pb2.DType.Value(enum_name)] = getattr(torch, torch_name)
    return table


def _le64(n):
    return n.to_bytes(8, "little")


class _Tensor:
    """One tensor's bytes as they arrive, with its running chunk check."""

    def __init__(self, meta, verify, where=""):
        self.meta = meta
        self.verify = verify
        self.chunks = list(meta.chunks)
        if self.chunks:
            # Before the buffer is sized by the manifest's byte_length.
            check_chunk_layout(meta, where)
            self.bounds = self.chunks
        else:
            # The content-hash scheme's chunks: every 4 MiB from offset 0.
            self.bounds = None
        self.buffer = bytearray(meta.byte_length)
        self.received = 0
        self.chunk_index = 0
        self.chunk_filled = 0
        self.hasher = hashlib.sha256()
        self.chunk_digests = []  # (sha256, length) of completed chunks, for the content hash.

    def _chunk_length(self, index):
        if self.bounds is not None:
            return self.bounds[index].length
        return min(CHUNK_BYTES, self.meta.byte_length - index * CHUNK_BYTES)

    def _chunk_done(self):
        digest = self.hasher.digest()
        length = self.chunk_filled
        if self.bounds is not None and self.verify:
            expected = self.bounds[self.chunk_index].sha256
            if digest != expected:
                start = sum(c.length for c in self.bounds[:self.chunk_index])
                raise IntegrityError(
                    f"tensor '{self.meta.key}' chunk {self.chunk_index} (bytes {start}.."
                    f"{start + length}) has SHA-256 {digest.hex()}, the manifest says "
                    f"{expected.hex()}: the bytes were damaged on the way or in the store",
                    tensor=self.meta.key, chunk=self.chunk_index)
        self.chunk_digests.append((digest, length))
        self.chunk_index += 1
        self.chunk_filled = 0
        self.hasher = hashlib.sha256()

    def add(self, offset, data):
        key = self.meta.key
        if offset != self.received:
            raise ProtocolError(f"tensor '{key}': bytes at offset {offset} arrived after "
                                f"{self.received} bytes (the stream sends them in order)")
        end = offset + len(data)
        if end > self.meta.byte_length:
            raise ProtocolError(f"tensor '{key}': {end} bytes sent, its byte_length is "
                                f"{self.meta.byte_length}")
        view = memoryview(data)
        self.buffer[offset:end] = view
        while len(view) > 0:
            room = self._chunk_length(self.chunk_index) - self.chunk_filled
            take = min(room, len(view))
            self.hasher.update(view[:take])
            self.chunk_filled += take
            view = view[take:]
            if self.chunk_filled == self._chunk_length(self.chunk_index):
                self._chunk_done()
        self.received = end

    def finish(self):
        meta = self.meta
        if self.received != meta.byte_length:
            raise ProtocolError(f"tensor '{meta.key}': the stream ended after {self.received} of "
                                f"its {meta.byte_length} bytes")
        if not self.verify or self.bounds is not None:
            return  # every chunk was checked as it completed.
        if not meta.content_hash:
            raise IntegrityError(
                f"tensor '{meta.key}' arrived without a checksum (no chunks, no content_hash), "
                "so its bytes cannot be verified; pass verify=False to accept it anyway",
                tensor=meta.key)
        scheme = hashlib.sha256()
        for digest, length in self.chunk_digests:
            scheme.update(digest + _le64(length))
        accepted = {scheme.digest(), hashlib.sha256(self.buffer).digest()}
        if meta.byte_length == 0:  # an empty tensor stored as one empty chunk
            accepted.add(hashlib.sha256(hashlib.sha256(b"").digest() + _le64(0)).digest())
        if meta.content_hash not in accepted:
            raise IntegrityError(
                f"tensor '{meta.key}': the {meta.byte_length} bytes received do not match its "
                f"content hash {meta.content_hash.hex()} (the protocol names no chunk list here, "
                f"so the damage is somewhere in chunks 0..{max(len(self.chunk_digests) - 1, 0)})",
                tensor=meta.key)


class StreamAssembler:
    """Collects TensorData for the tensors of a manifest, verifies them, builds torch tensors.

    ``metas`` are the TensorMeta messages indexed as TensorData.tensor_index counts them
    (Manifest.tensors, then state_tensors); ``selected`` the indices the stream will send;
    ``where`` the version ("MODEL@N") that errors name. Each selected tensor's chunk refs are
    checked (check_chunk_layout) before its buffer is made.
    """

    def __init__(self, metas, selected, verify=True, where=""):
        if sys.byteorder != "little":
            raise NotImplementedError("ckpt tensor bytes are little-endian; this host is not")
        self.metas = metas
        self.tensors = {}
        for index in selected:
            self.tensors[index] = _Tensor(metas[index], verify, where)

    def add(self, data):
        """Takes one TensorData message."""
        tensor = self.tensors.get(data.tensor_index)
        if tensor is None:
            raise ProtocolError(f"TensorData for tensor index {data.tensor_index}, which the "
                                f"manifest's selection does not hold")
        tensor.add(data.offset, data.data)

    def finish(self):
        """Checks completeness and content hashes; returns {index: bytearray} in index order."""
        for tensor in self.tensors.values():
            tensor.finish()
        return {index: self.tensors[index].buffer for index in sorted(self.tensors)}


# TensorMeta.sparse (proto/ckpt/v1/types.proto, SparseLayout): a sparse tensor's bytes are its
# dense parts' bytes one after another, in the order the layout lists them.
_SPARSE_KINDS = {"sparse_coo": 1, "sparse_csr": 2, "sparse_csc": 3, "sparse_bsr": 4,
                 "sparse_bsc": 5}


def _layout_name(layout):
    return str(layout).replace("torch.", "")


def _sparse_parts(tensor):
    """[(part name, dense tensor)] of a sparse tensor, in stored order."""
    name = _layout_name(tensor.layout)
    if name == "sparse_coo":
        return [("indices", tensor._indices()), ("values", tensor._values())]
    if name in ("sparse_csr", "sparse_bsr"):
        compressed, plain = tensor.crow_indices(), tensor.col_indices()
    else:
        compressed, plain = tensor.ccol_indices(), tensor.row_indices()
    return [("compressed_indices", compressed), ("plain_indices", plain),
            ("values", tensor.values())]


def _sparse_from_bytes(meta, buffer, dtypes):
    """The sparse tensor `meta` describes, its parts copied out of `buffer`; torch checks the
    indices (an invalid tensor raises IntegrityError)."""
    from .errors import IntegrityError  # noqa: PLC0415
    kinds = {kind: name for name, kind in _SPARSE_KINDS.items()}
    layout = kinds.get(meta.sparse.kind)
    if layout is None:
        raise NotImplementedError(f"tensor '{meta.key}' has sparse layout kind "
                                  f"{meta.sparse.kind}, which this client does not know")
    parts, offset = [], 0
    for part in meta.sparse.parts:
        dtype = dtypes.get(part.dtype)
        if dtype is None:
            raise NotImplementedError(f"tensor '{meta.key}': its {part.name} have dtype "
                                      f"{part.dtype} (ckpt.v1.DType), which torch cannot hold")
        count = 1
        for size in part.shape:
            count *= size
        length = count * torch.empty(0, dtype=dtype).element_size()
        piece = bytearray(buffer[offset:offset + length])  # a copy: aligned for its dtype.
        offset += length
        flat = torch.frombuffer(piece, dtype=dtype) if length else torch.empty(0, dtype=dtype)
        parts.append(flat.reshape(list(part.shape)))
    if offset != len(buffer):
        raise IntegrityError(f"sparse tensor '{meta.key}': its parts hold {offset} bytes, "
                             f"{len(buffer)} arrived", tensor=meta.key)
    size = list(meta.shape)
    try:
        if layout == "sparse_coo":
            tensor = torch.sparse_coo_tensor(parts[0], parts[1], size)
            # Sorted, unique indices stay as they are; only the flag is set.
            tensor = tensor.coalesce() if meta.sparse.coalesced else tensor
        else:
            torch._validate_sparse_compressed_tensor_args(parts[0], parts[1], parts[2], size,
                                                          getattr(torch, layout))
            tensor = torch.sparse_compressed_tensor(parts[0], parts[1], parts[2], size,
                                                    layout=getattr(torch, layout))
    except RuntimeError as error:
        raise IntegrityError(f"{layout} tensor '{meta.key}' cannot be rebuilt: {error}",
                             tensor=meta.key) from error
    return tensor.requires_grad_(True) if meta.requires_grad else tensor


def to_tensor(meta, buffer, dtypes):
    """A CPU tensor over `buffer` (no copy) with meta's dtype and shape; a sparse tensor (its
    parts copied) in its layout."""
    if meta.HasField("sparse"):
        return _sparse_from_bytes(meta, buffer, dtypes)
    dtype = dtypes.get(meta.dtype)
    if dtype is None:
        raise NotImplementedError(
            f"tensor '{meta.key}' has dtype {meta.dtype} (ckpt.v1.DType), which torch "
            f"{torch.__version__} cannot hold")
    shape = list(meta.shape)
    if len(buffer) == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def describe_tensor(key, tensor, types_pb2, dtypes):
    """The TensorMeta of `tensor` under `key` (dtype, shape, byte length, device, requires_grad),
    as the C++ store describes one; `dtypes` is torch_dtypes(). InvalidArgument naming the key
    for a tensor the store cannot keep as dense bytes."""
    from .errors import InvalidArgument  # noqa: PLC0415 (errors imports nothing from here)
    if _layout_name(tensor.layout) in _SPARSE_KINDS:
        return _describe_sparse(key, tensor, types_pb2, dtypes)
    if tensor.layout != torch.strided:
        raise InvalidArgument(f"tensor '{key}' has layout {tensor.layout}; the store keeps "
                              "strided and sparse tensors (convert with to_dense())")
    if tensor.is_quantized:
        raise InvalidArgument(f"tensor '{key}' is quantized; the Python client saves dense "
                              "tensors only (ckpt import reads quantized torch.save files)")
    wire = {dtype: enum for enum, dtype in dtypes.items()}.get(tensor.dtype)
    if wire is None:
        raise InvalidArgument(f"tensor '{key}' has dtype {tensor.dtype}, which ckpt does not store")
    return types_pb2.TensorMeta(
        key=key, original_key=key, dtype=wire, shape=list(tensor.shape),
        byte_length=tensor.numel() * tensor.element_size(), original_device=str(tensor.device),
        requires_grad=tensor.requires_grad)


def _describe_sparse(key, tensor, types_pb2, dtypes):
    from .errors import InvalidArgument  # noqa: PLC0415
    wire = {dtype: enum for enum, dtype in dtypes.items()}
    parts, byte_length = [], 0
    for name, part in _sparse_parts(tensor):
        byte_length += part.numel() * part.element_size()
        if part.dtype not in wire:
            raise InvalidArgument(f"sparse tensor '{key}': its {name} have dtype {part.dtype}, "
                                  "which ckpt does not store")
        parts.append(types_pb2.TensorPart(name=name, dtype=wire[part.dtype],
                                          shape=list(part.shape)))
    layout = _layout_name(tensor.layout)
    sparse = types_pb2.SparseLayout(kind=_SPARSE_KINDS[layout], parts=parts,
                                    coalesced=layout == "sparse_coo" and tensor.is_coalesced())
    return types_pb2.TensorMeta(
        key=key, original_key=key, dtype=wire[tensor.dtype], shape=list(tensor.shape),
        byte_length=byte_length,
        original_device=str(tensor.device), requires_grad=tensor.requires_grad, sparse=sparse)


def host_bytes(tensor):
    """`tensor`'s bytes, little-endian and C-ordered, as a memoryview over a CPU tensor (a copy
    when the tensor is elsewhere or not contiguous); a sparse tensor's parts one after another."""
    if sys.byteorder != "little":
        raise NotImplementedError("ckpt tensor bytes are little-endian; this host is not")
    if _layout_name(tensor.layout) in _SPARSE_KINDS:
        return memoryview(b"".join(host_bytes(part).tobytes()
                                   for _, part in _sparse_parts(tensor)))
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())
