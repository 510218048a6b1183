"""The byte side of Client.save: each tensor's bytes cut into the store's chunks, hashed here, and
only the chunks the store lacks sent (FindMissingChunks); the others are named by address
(UploadRequest.stored_chunk), so a save whose weights barely changed sends little more than its
changes."""
import concurrent.futures
import hashlib
import os

# A reference names one of the store's chunks: CHUNK_BYTES pieces from each tensor's offset 0,
# the last one possibly shorter.
from ._tensors import CHUNK_BYTES, host_bytes
# Tensor bytes per TensorData message (the store's maximum: libs/rpc/wire_constants.h).
PIECE_BYTES = 1 << 20
# Tensors are hashed and looked up a group at a time, so a save from a GPU holds at most one
# group's host copies beside the stream, and the first bytes leave before the last are hashed.
GROUP_BYTES = 256 << 20
# Addresses per FindMissingChunks call: 34 bytes each on the wire, well inside gRPC's default
# 4 MiB for the request and for an answer that lists every one missing.
ASK_AT_ONCE = 50_000


class UploadStats:
    """What an upload sent: chunks whose bytes travelled, chunks named instead, and bytes sent."""

    def __init__(self):
        self.chunks_sent = 0
        self.chunks_referenced = 0
        self.sent_bytes = 0


def _chunks(data):
    for offset in range(0, len(data), CHUNK_BYTES):
        yield offset, data[offset:offset + CHUNK_BYTES]


def _sha256(view):
    # hashlib releases the GIL for buffers over 2 KiB, so a pool hashes on every core.
    return hashlib.sha256(view).digest()


def _groups(tensors):
    group, size = [], 0
    for index, tensor in enumerate(tensors):
        group.append((index, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= GROUP_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group


class Uploader:
    """The UploadRequest messages of one save. ``find_missing(addresses) -> missing addresses``
    is the store's FindMissingChunks, or None to send every byte. An exception raised while the
    messages are made (gRPC would report it only as a cancelled call) is kept in ``error``."""

    def __init__(self, pb, header, tensors, aliases, find_missing):
        self._pb = pb
        self._header = header
        self._tensors = tensors
        self._aliases = aliases
        self._find_missing = find_missing
        self.stats = UploadStats()
        self.error = None

    def requests(self):
        try:
            yield from self._requests()
        except Exception as error:  # re-raised by the caller in place of gRPC's CANCELLED.
            self.error = error
            raise

    def _requests(self):
        pb = self._pb
        yield pb.UploadRequest(header=self._header)
        workers = min(4, os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            groups = _groups(self._tensors)
            following = self._hash(next(groups, None), pool)
            while following is not None:
                views, addresses = following
                # The next group hashes on the pool while this one's messages go out.
                following = self._hash(next(groups, None), pool)
                stored = self._stored(views, addresses)
                for index, data in views:
                    for offset, chunk in _chunks(data):
                        address = stored.get((index, offset))
                        if address is not None:
                            self.stats.chunks_referenced += 1
                            yield pb.UploadRequest(stored_chunk=pb.StoredChunk(
                                tensor_index=index, offset=offset, sha256=address,
                                length=len(chunk)))
                            continue
                        self.stats.chunks_sent += 1
                        self.stats.sent_bytes += len(chunk)
                        for at in range(0, len(chunk), PIECE_BYTES):
                            yield pb.UploadRequest(data=pb.TensorData(
                                tensor_index=index, offset=offset + at,
                                data=bytes(chunk[at:at + PIECE_BYTES])))
        yield pb.UploadRequest(commit=pb.UploadCommit(aliases=self._aliases))

    def _hash(self, group, pool):
        """(the group's host bytes by tensor index, futures of its chunks' addresses in order),
        or None after the last group."""
        if group is None:
            return None
        views = [(index, host_bytes(tensor)) for index, tensor in group]
        if self._find_missing is None:
            return views, []
        chunks = [chunk for _, data in views for _, chunk in _chunks(data)]
        return views, [pool.submit(_sha256, chunk) for chunk in chunks]

    def _stored(self, views, hashing):
        """{(tensor index, chunk offset): address} of the group's chunks the store holds."""
        if self._find_missing is None:
            return {}
        places = [(index, offset) for index, data in views for offset, _ in _chunks(data)]
        addresses = [future.result() for future in hashing]
        distinct = list(dict.fromkeys(addresses))
        missing = set()
        for start in range(0, len(distinct), ASK_AT_ONCE):
            missing.update(self._find_missing(distinct[start:start + ASK_AT_ONCE]))
        return {place: address for place, address in zip(places, addresses)
                if address not in missing}
