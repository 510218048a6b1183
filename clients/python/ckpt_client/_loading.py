"""Client's reading calls: load_state_dict and load_bundle (a Load or Download stream, every byte
verified by _tensors.StreamAssembler) and export (the loader's Export into a file, each piece
checked against its XXH3-64)."""
from __future__ import annotations

import collections
import hashlib
import os
import tempfile
from typing import Any, Iterable, Optional, Union

import torch

from ._bundles import Bundle, restore_bundle
from ._distributed import on_one_rank
from ._retry import while_unavailable
from ._tensors import RangeAssembler, StreamAssembler, to_tensor
from .errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound, ProtocolError


def _xxh3_64():
    """xxhash.xxh3_64_intdigest; FailedPrecondition when the module is missing, so that a
    verifying call fails rather than skip its check."""
    try:
        import xxhash
    except ImportError as error:
        raise FailedPrecondition(
            "checking an Export needs the xxhash module (Debian: apt-get install python3-xxhash; "
            "pip: xxhash); or pass checksum='sha256' (hashlib), or verify=False to accept the "
            "file unchecked") from error
    return xxhash.xxh3_64_intdigest


def _check_piece(ref, response, at, checksum, compute):
    """One ExportResponse piece against its offset and its checksum (proto/ckpt/v1/loader.proto):
    ``checksum`` "xxh3" (ExportResponse.xxh3_64, ``compute`` xxh3_64_intdigest) or "sha256"
    (ExportResponse.sha256, ``compute`` returning the 32-byte digest)."""
    end = at + len(response.data)
    sent = response.xxh3_64 if checksum == "xxh3" else response.sha256
    if (checksum == "xxh3" and not response.HasField("xxh3_64")) or \
            (checksum == "sha256" and not sent):
        raise FailedPrecondition(
            f"Export of {ref}: bytes {at}..{end} of the file came without a {checksum} checksum "
            "(a loader older than this client); pass verify=False to accept the file unchecked")
    if response.offset != at:
        raise ProtocolError(f"Export of {ref}: bytes at offset {response.offset} arrived after "
                            f"{at} bytes")
    digest = compute(response.data)
    if digest != sent:
        shown = (lambda d: f"{d:016x}") if checksum == "xxh3" else (lambda d: d.hex())
        raise IntegrityError(
            f"Export of {ref}: file bytes {at}..{end} arrived with {checksum} {shown(digest)}, "
            f"the loader sent {shown(sent)}: damaged between the loader and this client; "
            "nothing was written", offset=at)


# A torch.device or what torch.device() takes ("cpu", "cuda:1").
Device = Union[str, torch.device]


class LoadingCalls:
    """The reading methods of Client (mixed into it). They use the Client's plumbing: ``_pb``
    (the generated modules), ``_dtypes`` (torch_dtypes()), ``_loader`` (the loader's stub or
    None), ``_stream`` (a server-streaming call, errors mapped), ``_await_store_channel``
    (before a retry) and ``version_ref``."""

    def load_state_dict(self, ref: str, device: Device = "cpu",
                        dtype: Optional[torch.dtype] = None,
                        keys: Optional[Iterable[str]] = None,
                        prefixes: Optional[Iterable[str]] = None, verify: bool = True,
                        timeout: Optional[float] = None
                        ) -> collections.OrderedDict[str, torch.Tensor]:
        """A version's model state dict: an OrderedDict of tensors under canonical keys (no
        "module." prefix), in the producer's order, ready for ``module.load_state_dict(sd,
        strict=True)``.

        Args:
          ref: "MODEL", "MODEL@7" or "MODEL@ALIAS" ("MODEL" is "MODEL@latest").
          device: where the tensors go ("cpu", "cuda", "cuda:1", or a torch.device).
          dtype: cast floating-point tensors to it (e.g. torch.float16); integer and bool
            tensors are never cast, as the loader's own cast does.
          keys: only these canonical keys; prefixes: only keys under these prefixes.
          verify: check each tensor's bytes against the manifest's SHA-256 checksums (see
            ckpt_client._tensors); IntegrityError names the tensor and chunk that fail.

        Reads from the loader when the Client has one (its shared chunk cache serves many
        readers), else from the store's Download, which is read again from the start (the
        version by number) while it fails with Unavailable, for up to 10 s: a store restarting,
        or another store of Client(store="A,B") taking over. Both are verified: both manifests
        name each chunk's SHA-256 as the store computed it (a loader older than this client
        names only each tensor's content hash). The loader is asked for stored dtypes, because a
        tensor it casts loses its hashes, and the cast is done here.
        """
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise InvalidArgument(f"dtype must be a floating torch.dtype, got {dtype!r}")
        device = torch.device(device)
        keys = list(keys or [])
        prefixes = list(prefixes or [])
        version_ref = self.version_ref(ref)

        def choose(manifest):
            return (list(manifest.tensors), [index for index, meta in enumerate(manifest.tensors)
                                             if self._selected(meta.key, keys, prefixes)])

        if self._loader is not None:
            pb = self._pb.loader_pb2
            request = pb.LoadRequest(ref=version_ref, target=pb.LoadTarget(
                device="cpu", include_keys=keys, include_prefixes=prefixes))
            manifest, buffers = self._receive(
                ref, self._stream("loader", "Load", request, timeout), verify, choose)
        else:
            pb = self._pb.checkpoint_store_pb2
            request = pb.DownloadRequest(ref=version_ref, keys=keys, key_prefixes=prefixes)
            manifest, buffers = self._from_store(
                request, lambda stream: self._receive(ref, stream, verify, choose), timeout)
        state = collections.OrderedDict()
        for index, buffer in buffers.items():
            meta = manifest.tensors[index]
            tensor = to_tensor(meta, buffer, self._dtypes)
            if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
                tensor = tensor.to(dtype)
            if device.type != "cpu":
                tensor = tensor.to(device)
            state[meta.key] = tensor
        return state

    def load_bundle(self, ref: str, model: Optional[torch.nn.Module] = None,
                    optimizer: Optional[torch.optim.Optimizer] = None, scheduler: Any = None,
                    strict: bool = True, verify: bool = True,
                    timeout: Optional[float] = None, broadcast_from: Optional[int] = None,
                    group: Any = None) -> Bundle:
        """Resumes from a stored version: the model's weights, the optimizer's and the
        scheduler's state and the rest of the bundle, read from the loader when the Client has
        one (Load with every state part, through its chunk cache), else from the store (Download
        with its state, read again while the store is unavailable), and verified as
        load_state_dict's are.

        Given ``model``, ``optimizer`` and / or ``scheduler``, restores each in place with its
        own ``load_state_dict`` (``strict`` for the model): the weights are copied onto the
        model's parameters where they are, and torch's Optimizer.load_state_dict puts each
        state tensor on its parameter's device. Returns the Bundle either way, whose ``extra``
        holds epoch, step and whatever else the producer saved beside the three. A restore asked
        for state the version does not hold raises FailedPrecondition naming what is missing.

        broadcast_from: in a torch.distributed job (DDP), call load_bundle() on every rank with
        the same ref: only global rank `broadcast_from` reads (and verifies) the version, from
        the loader or the store as above, and sends it to the others over the process group (`group`, default the whole
        job), so N ranks do not download N copies; each rank then restores its own model,
        optimizer and scheduler. Every rank gets the same version, or the same error.
        """
        pb = self._pb.checkpoint_store_pb2
        request = pb.DownloadRequest(ref=self.version_ref(ref), include_state=True)

        def everything(manifest):
            metas = list(manifest.tensors) + list(manifest.state_tensors)
            return metas, range(len(metas))

        def download():
            if self._loader is not None:
                # Through the loader's chunk cache: the whole bundle, stored dtypes, on the CPU.
                lpb = self._pb.loader_pb2
                load = lpb.LoadRequest(ref=request.ref, target=lpb.LoadTarget(
                    device="cpu", include_optimizer_state=True, include_scheduler_state=True,
                    include_extra_state=True))
                manifest, buffers = self._receive(
                    ref, self._stream("loader", "Load", load, timeout), verify, everything)
            else:
                manifest, buffers = self._from_store(
                    request, lambda stream: self._receive(ref, stream, verify, everything),
                    timeout)
            return manifest.SerializeToString(), buffers

        if broadcast_from is None:
            serialized, buffers = download()
        else:
            serialized, buffers = on_one_rank(download, broadcast_from, group,
                                              "load_bundle(broadcast_from=)")
        manifest = pb.Manifest.FromString(serialized)
        return restore_bundle(manifest, buffers, self._dtypes, model, optimizer, scheduler,
                              strict)

    def load_flat_range(self, ref: str, key: str, start: int, stop: int, verify: bool = True,
                        timeout: Optional[float] = None) -> torch.Tensor:
        """Elements ``start`` to ``stop`` (exclusive) of the tensor stored under ``key``,
        flattened in its stored (row-major) order, as a 1-D CPU tensor of its stored dtype: what
        a rank of a resharded resume reads for its slice of a parameter or of optimizer state.
        ``key`` is a canonical model key ("fc.weight") or a state tensor's
        ("optimizer/state/0/exp_avg"). Only the chunks that hold the range travel (whole, so each
        is checked against its SHA-256 in the manifest, as load_state_dict's are), not the
        tensor.

        Raises OutOfRange unless 0 <= start <= stop <= the tensor's element count, NotFound for an
        unknown key. The version is resolved once (an alias that moves meanwhile does not mix
        two versions' bytes).
        """
        manifest = self.manifest(ref)
        where = f"{manifest.model}@{manifest.version}"
        metas = list(manifest.tensors) + list(manifest.state_tensors)
        index = next((i for i, meta in enumerate(metas) if meta.key == key), None)
        if index is None:
            raise NotFound(f"no tensor '{key}' in {where}")
        meta = metas[index]
        if meta.HasField("sparse"):
            raise InvalidArgument(f"tensor '{key}' of {where} is sparse: its elements are not "
                                  "stored in row-major order; load it whole (load_state_dict)")
        dtype = self._dtypes.get(meta.dtype)
        if dtype is None:
            raise NotImplementedError(f"tensor '{key}' has dtype {meta.dtype} (ckpt.v1.DType), "
                                      f"which torch {torch.__version__} cannot hold")
        size = torch.empty((), dtype=dtype).element_size()
        if start != stop:
            pb = self._pb.checkpoint_store_pb2
            request = pb.DownloadRequest(
                ref=self.version_ref(where), include_state=index >= len(manifest.tensors),
                ranges=[pb.TensorByteRange(key=key, begin=start * size, end=stop * size)])

            def receive(stream):
                assembler = RangeAssembler(meta, index, start * size, stop * size, verify, where)
                seen_manifest = False
                for response in stream:
                    if response.HasField("manifest"):
                        if seen_manifest:
                            raise ProtocolError(f"{where}: the stream sent a second manifest")
                        seen_manifest = True
                    elif not seen_manifest:
                        raise ProtocolError(f"{where}: tensor bytes arrived before the manifest")
                    else:
                        assembler.add(response.data)
                return assembler.finish()

            data = self._from_store(request, receive, timeout)
        else:
            data = bytearray()
        if len(data) == 0:
            return torch.empty((0,), dtype=dtype)
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype)

    def _from_store(self, request, receive, timeout):
        """``receive(stream)`` of the store's Download of ``request``, made again from the start
        while it fails with Unavailable (_retry.while_unavailable): the store restarting, or a
        follower of Client(store="A,B") taking over from a writer that died mid-stream. Once a
        manifest has arrived, a retry asks for that version by number, so an alias that moves
        meanwhile cannot mix two versions' bytes."""
        def attempt():
            def stream():
                for response in self._stream("store", "Download", request, timeout):
                    if response.HasField("manifest") and response.manifest.model:
                        request.ref.CopyFrom(self.version_ref(
                            f"{response.manifest.model}@{response.manifest.version}"))
                    yield response
            return receive(stream())

        return while_unavailable(attempt, self._await_store_channel)

    @staticmethod
    def _receive(ref, stream, verify, choose):
        """Reads a Load / Download stream: its manifest first, then the TensorData of the tensors
        ``choose(manifest)`` picks (``(metas as TensorData.tensor_index counts them, selected
        indices)``), each verified; returns ``(manifest, {index: bytearray})``."""
        manifest = None
        assembler = None
        for response in stream:
            if response.HasField("manifest"):
                if manifest is not None:
                    raise ProtocolError(f"{ref}: the stream sent a second manifest")
                manifest = response.manifest
                metas, selected = choose(manifest)
                where = f"{manifest.model}@{manifest.version}" if manifest.model else ""
                assembler = StreamAssembler(metas, selected, verify, where)
            elif assembler is None:
                raise ProtocolError(f"{ref}: tensor bytes arrived before the manifest")
            else:
                assembler.add(response.data)
        if manifest is None:
            raise ProtocolError(f"{ref}: the stream ended without a manifest")
        return manifest, assembler.finish()

    @staticmethod
    def _selected(key, keys, prefixes):
        if not keys and not prefixes:
            return True
        return key in keys or any(key.startswith(prefix) for prefix in prefixes)

    def export(self, ref: str, path: str, format: str = "pt",
               dtype: Optional[torch.dtype] = None, keys: Optional[Iterable[str]] = None,
               prefixes: Optional[Iterable[str]] = None, include_optimizer: bool = False,
               include_scheduler: bool = False, verify: bool = True,
               timeout: Optional[float] = None, checksum: str = "xxh3") -> Any:
        """Writes a version as a file through the loader's Export: ``format="pt"`` (torch.save
        zip that torch.load(weights_only=True) reads) or ``"safetensors"``. With
        include_optimizer / include_scheduler (pt only) the file is the whole training bundle as
        its producer saved it. dtype (torch.float16 / bfloat16 / float32) casts floating tensors
        on the server. The file appears whole or not at all: bytes go to a temporary file beside
        ``path``, which is renamed into place once the size the server announced has arrived.

        With verify (the default) each piece is checked against the checksum the loader took as
        it sent it; a mismatch raises IntegrityError (a DataLoss) naming the piece's offset, and
        nothing is written. ``checksum="xxh3"`` (the default, the cheapest) needs the ``xxhash``
        module (Debian: python3-xxhash); without it export raises FailedPrecondition rather than
        skip the check. ``checksum="sha256"`` asks the loader for each piece's SHA-256 too
        (ExportRequest.sha256_pieces) and checks it with hashlib, which every Python has.

        Returns a dict: version ("MODEL@N"), file_name (the server's suggestion), bytes,
        left_out (what the file cannot hold, with why) and warnings.
        """
        if checksum not in ("xxh3", "sha256"):
            raise InvalidArgument(f"export checksum must be 'xxh3' or 'sha256', got {checksum!r}")
        compute = None
        if verify:
            compute = _xxh3_64() if checksum == "xxh3" else (
                lambda data: hashlib.sha256(data).digest())
        pb = self._pb.loader_pb2
        formats = {"pt": pb.EXPORT_FORMAT_TORCH, "torch": pb.EXPORT_FORMAT_TORCH,
                   "safetensors": pb.EXPORT_FORMAT_SAFETENSORS}
        if format not in formats:
            raise InvalidArgument(f"export format must be 'pt' or 'safetensors', got {format!r}")
        target = pb.LoadTarget(include_keys=list(keys or []),
                               include_prefixes=list(prefixes or []),
                               include_optimizer_state=include_optimizer,
                               include_scheduler_state=include_scheduler)
        if dtype is not None:
            target.cast_floating_to = self._wire_dtype(dtype)
        request = pb.ExportRequest(ref=self.version_ref(ref), target=target,
                                   format=formats[format],
                                   sha256_pieces=verify and checksum == "sha256")
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        fd, partial = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".partial",
                                       dir=directory)
        info = None
        try:
            with os.fdopen(fd, "wb") as out:
                for response in self._stream("loader", "Export", request, timeout):
                    if info is None:
                        info = {"version": response.version, "file_name": response.file_name,
                                "total_bytes": response.total_bytes,
                                "left_out": list(response.left_out),
                                "warnings": list(response.warnings)}
                    if compute is not None:
                        _check_piece(ref, response, out.tell(), checksum, compute)
                    out.write(response.data)
                size = out.tell()
                out.flush()
                os.fsync(out.fileno())
            if info is None:
                raise ProtocolError(f"Export of {ref} sent nothing")
            if info["total_bytes"] and size != info["total_bytes"]:
                raise ProtocolError(f"Export of {ref} ended after {size} of "
                                    f"{info['total_bytes']} bytes")
            os.chmod(partial, 0o644 & ~_umask())
            os.replace(partial, path)
        except BaseException:
            if os.path.exists(partial):
                os.remove(partial)
            raise
        info["bytes"] = size
        del info["total_bytes"]
        return info

    def _wire_dtype(self, dtype):
        for wire, torch_dtype in self._dtypes.items():
            if torch_dtype == dtype:
                return wire
        raise InvalidArgument(f"no ckpt dtype for {dtype!r}")


def _umask():
    """The process umask, read without changing it (os.umask would race with other threads)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022
