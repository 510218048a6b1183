"""Client: the ckpt checkpoint store and loader, from Python."""
from __future__ import annotations

import collections
import concurrent.futures
import os
import tempfile
import threading
import time
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Tuple, Union

import grpc
import torch

from . import _stubs
from ._tensors import StreamAssembler, to_tensor, torch_dtypes
from ._bundles import Bundle, HostSnapshot, build_manifest, param_names_of, restore_bundle
from ._retry import Backoff
from ._upload import Uploader
from .errors import (CkptError, FailedPrecondition, IntegrityError, InvalidArgument, NotFound,
                     ProtocolError, from_rpc_error)

# Large enough for a 1 MiB TensorData piece and a manifest of many tensors (the servers' own
# default limit is 16 MiB).
_MAX_MESSAGE_BYTES = 64 << 20
# A channel's reconnect backoff (first, most) in ms: ClientChannel's (libs/rpc/client_channel.cc).
_RECONNECT_BACKOFF_MS = (100, 5000)
# Seconds watch() waits for the store's channel to connect before each resume (ClientOptions'
# connect_timeout).
_CONNECT_TIMEOUT = 10.0

Saved = collections.namedtuple("Saved", ["version", "logical_bytes", "new_bytes", "warnings",
                                         "chunks_sent", "chunks_referenced", "sent_bytes"])
Saved.__doc__ = """What Client.save committed: the version number, the tensor bytes it holds, those
the store did not hold before (after deduplication; for a scoped identity, new to its scope),
the store's validation warnings, and what travelled: the 4 MiB chunks whose bytes were sent, the
chunks named by address because the store already held them, and the tensor bytes sent."""

WatchUpdate = collections.namedtuple("WatchUpdate", ["state", "event", "resume_token"])
WatchUpdate.__doc__ = """One message of a watch: exactly one of ``state`` (a ckpt.v1.WatchState:
the watched models as they are, sent first on a fresh watch) and ``event`` (a
ckpt.v1.RegistryEvent) is set. ``resume_token`` continues after it (``Client.watch(...,
resume_token=...)``)."""


def _xxh3_64():
    """xxhash.xxh3_64_intdigest; FailedPrecondition when the module is missing, so that a
    verifying call fails rather than skip its check."""
    try:
        import xxhash
    except ImportError as error:
        raise FailedPrecondition(
            "checking an Export needs the xxhash module (Debian: apt-get install python3-xxhash; "
            "pip: xxhash); pass verify=False to accept the file unchecked") from error
    return xxhash.xxh3_64_intdigest


def _check_piece(ref, response, at, xxh3_64):
    """One ExportResponse piece against its offset and XXH3-64 (proto/ckpt/v1/loader.proto)."""
    end = at + len(response.data)
    if not response.HasField("xxh3_64"):
        raise FailedPrecondition(
            f"Export of {ref}: bytes {at}..{end} of the file came without a checksum (a loader "
            "older than this client); pass verify=False to accept the file unchecked")
    if response.offset != at:
        raise ProtocolError(f"Export of {ref}: bytes at offset {response.offset} arrived after "
                            f"{at} bytes")
    digest = xxh3_64(response.data)
    if digest != response.xxh3_64:
        raise IntegrityError(
            f"Export of {ref}: file bytes {at}..{end} arrived with XXH3-64 {digest:016x}, the "
            f"loader sent {response.xxh3_64:016x}: damaged between the loader and this client; "
            "nothing was written", offset=at)


# A torch.device or what torch.device() takes ("cpu", "cuda:1").
Device = Union[str, torch.device]


def parse_ref(text: str) -> Tuple[str, Optional[int], Optional[str]]:
    """"MODEL" / "MODEL@latest" / "MODEL@7" / "MODEL@best" -> (model, version or None, alias or
    None); a plain "MODEL" means alias "latest". Model names never contain '@'."""
    if not isinstance(text, str) or not text:
        raise InvalidArgument(f"a version reference is 'MODEL', 'MODEL@N' or 'MODEL@ALIAS', "
                              f"got {text!r}")
    model, at, ref = text.partition("@")
    if not model or "@" in ref or (at and not ref):
        raise InvalidArgument(f"bad version reference {text!r}: use 'MODEL', 'MODEL@N' or "
                              "'MODEL@ALIAS'")
    if not ref:
        return model, None, "latest"
    if ref.isdigit():
        version = int(ref)
        if version < 1:
            raise InvalidArgument(f"bad version reference {text!r}: versions start at 1")
        return model, version, None
    return model, None, ref


def _read(path):
    with open(os.path.expanduser(os.fspath(path)), "rb") as f:
        return f.read()


class Client:
    """A connection to a ckpt checkpoint_store and / or loader service.

    Args:
      store: "HOST:PORT" of the checkpoint_store service (registry calls: resolve, history,
        annotate, versions, watch; and load_state_dict when no loader is given).
      loader: "HOST:PORT" of the loader service (load_state_dict, export).
      token: bearer token sent with every call ("authorization: Bearer <token>").
      token_file: a file holding the token (whitespace around it ignored).
      ca_file: PEM of the CA that signed the servers' certificates; enables TLS.
      cert_file, key_file: this client's certificate and key, for mutual TLS (with ca_file).
      server_name: the name the servers' certificates carry, when it is not the host dialled.
      timeout: seconds for unary calls; streaming calls (load, export) get ``timeout`` per call as
        well unless given their own.

    Use as a context manager (or call close()) to close the channels.
    """

    def __init__(self, store: Optional[str] = None, loader: Optional[str] = None,
                 token: Optional[str] = None, token_file: Optional[str] = None,
                 ca_file: Optional[str] = None, cert_file: Optional[str] = None,
                 key_file: Optional[str] = None, server_name: Optional[str] = None,
                 timeout: float = 60) -> None:
        if store is None and loader is None:
            raise InvalidArgument("Client needs store='HOST:PORT' and / or loader='HOST:PORT'")
        if token is not None and token_file is not None:
            raise InvalidArgument("give token or token_file, not both")
        if token_file is not None:
            token = _read(token_file).decode().strip()
        if token is not None and (not token or any(c.isspace() or not c.isprintable()
                                                   for c in token)):
            raise InvalidArgument("the token must be non-empty printable text without spaces")
        if (cert_file is None) != (key_file is None):
            raise InvalidArgument("mutual TLS needs both cert_file and key_file")
        if cert_file is not None and ca_file is None:
            raise InvalidArgument("cert_file / key_file (mutual TLS) need ca_file (TLS)")
        self._pb = _stubs.load()
        self._dtypes = torch_dtypes(self._pb.types_pb2)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout = timeout
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                   # Reconnect about as fast as watch() resumes, as the C++ client does
                   # (libs/rpc/client_channel.cc); gRPC's own default backoff grows to 120 s.
                   ("grpc.initial_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS[0]),
                   ("grpc.max_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS[1])]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        credentials = None
        if ca_file is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_file),
                private_key=_read(key_file) if key_file else None,
                certificate_chain=_read(cert_file) if cert_file else None)

        def channel(address):
            if credentials is None:
                return grpc.insecure_channel(address, options=options)
            return grpc.secure_channel(address, credentials, options=options)

        self._channels = []
        self._closed = False
        # save_async's one upload thread (made on first use) and its last upload.
        self._saver = None
        self._last_save = None
        self._saver_lock = threading.Lock()
        self._snapshot = HostSnapshot()  # save_async's host buffers, reused from save to save
        self._snapshot_taken = None  # set once the last save_async's snapshot is copied
        self._store = self._loader = None
        if store is not None:
            self._channels.append(channel(store))
            self._store_channel = self._channels[-1]
            self._store = self._pb.checkpoint_store_pb2_grpc.CheckpointStoreStub(
                self._store_channel)
        if loader is not None:
            self._channels.append(channel(loader))
            self._loader = self._pb.loader_pb2_grpc.LoaderStub(self._channels[-1])

    # ---- plumbing

    def close(self) -> None:
        """Waits for a save_async upload still in flight, then closes the channels; calls in
        progress end (a watch() iteration just stops)."""
        if self._saver is not None:
            self._saver.shutdown(wait=True)
        self._closed = True
        for channel in self._channels:
            channel.close()
        self._channels = []

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def messages(self) -> Any:
        """The generated ckpt.v1 modules (types_pb2, checkpoint_store_pb2, registry_pb2,
        loader_pb2, ...), for calls this class does not wrap."""
        return self._pb

    def _need(self, which, what):
        stub = self._store if which == "store" else self._loader
        if stub is None:
            raise InvalidArgument(f"{what} needs Client({which}='HOST:PORT')")
        return stub

    def _call(self, which, method, request, timeout=None):
        stub = self._need(which, method)
        try:
            return getattr(stub, method)(request, metadata=self._metadata,
                                         timeout=timeout or self.timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error, method) from error

    def _stream(self, which, method, request, timeout=None):
        """Yields the responses of a server-streaming call, errors mapped."""
        stub = self._need(which, method)
        try:
            for response in getattr(stub, method)(request, metadata=self._metadata,
                                                  timeout=timeout or self.timeout):
                yield response
        except grpc.RpcError as error:
            raise from_rpc_error(error, method) from error

    def version_ref(self, ref: str) -> Any:
        """A ckpt.v1.VersionRef for "MODEL[@N|@ALIAS]"."""
        model, version, alias = parse_ref(ref)
        message = self._pb.types_pb2.VersionRef(model=model)
        if version is not None:
            message.version = version
        else:
            message.alias = alias
        return message

    # ---- reading versions

    def resolve(self, ref: str) -> int:
        """The version number "MODEL@ALIAS" (or "MODEL", meaning latest) points at now."""
        manifest = self._call("store", "GetManifest",
                              self._pb.checkpoint_store_pb2.GetManifestRequest(
                                  ref=self.version_ref(ref)))
        return manifest.version

    def manifest(self, ref: str) -> Any:
        """The stored ckpt.v1.Manifest of a version (metadata, tensors, annotations)."""
        return self._call("store", "GetManifest",
                          self._pb.checkpoint_store_pb2.GetManifestRequest(
                              ref=self.version_ref(ref)))

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
        readers), else from the store's Download. Both are verified; the store's manifest names
        each chunk's SHA-256, the loader's only each tensor's content hash. The loader is asked
        for stored dtypes, because a tensor it casts loses its hash, and the cast is done here.
        """
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise InvalidArgument(f"dtype must be a floating torch.dtype, got {dtype!r}")
        device = torch.device(device)
        keys = list(keys or [])
        prefixes = list(prefixes or [])
        version_ref = self.version_ref(ref)
        if self._loader is not None:
            pb = self._pb.loader_pb2
            request = pb.LoadRequest(ref=version_ref, target=pb.LoadTarget(
                device="cpu", include_keys=keys, include_prefixes=prefixes))
            stream = self._stream("loader", "Load", request, timeout)
        else:
            pb = self._pb.checkpoint_store_pb2
            request = pb.DownloadRequest(ref=version_ref, keys=keys, key_prefixes=prefixes)
            stream = self._stream("store", "Download", request, timeout)
        manifest, buffers = self._receive(
            ref, stream, verify,
            lambda manifest: (list(manifest.tensors),
                              [index for index, meta in enumerate(manifest.tensors)
                               if self._selected(meta.key, keys, prefixes)]))
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
                    timeout: Optional[float] = None) -> Bundle:
        """Resumes from a stored version: the model's weights, the optimizer's and the
        scheduler's state and the rest of the bundle, read from the store (Download with its
        state) and verified as load_state_dict's are.

        Given ``model``, ``optimizer`` and / or ``scheduler``, restores each in place with its
        own ``load_state_dict`` (``strict`` for the model): the weights are copied onto the
        model's parameters where they are, and torch's Optimizer.load_state_dict puts each
        state tensor on its parameter's device. Returns the Bundle either way, whose ``extra``
        holds epoch, step and whatever else the producer saved beside the three. A restore asked
        for state the version does not hold raises FailedPrecondition naming what is missing.
        """
        pb = self._pb.checkpoint_store_pb2
        request = pb.DownloadRequest(ref=self.version_ref(ref), include_state=True)

        def everything(manifest):
            metas = list(manifest.tensors) + list(manifest.state_tensors)
            return metas, range(len(metas))

        manifest, buffers = self._receive(
            ref, self._stream("store", "Download", request, timeout), verify, everything)
        return restore_bundle(manifest, buffers, self._dtypes, model, optimizer, scheduler,
                              strict)

    def save(self, model_name: str, state: Union[torch.nn.Module, Mapping[str, torch.Tensor]],
             *, optimizer: Any = None, scheduler: Any = None, epoch: Optional[int] = None,
             step: Optional[int] = None, extra: Optional[Mapping[str, Any]] = None,
             metrics: Optional[Mapping[str, float]] = None,
             lineage: Optional[Mapping[str, Any]] = None, alias: Optional[str] = None,
             reason: Optional[str] = None, expected_latest_version: int = 0,
             dedup: bool = True, timeout: Optional[float] = None) -> Saved:
        """Commits one version of `model_name` through the store's Upload: visible only once
        whole (a save that fails or is killed leaves nothing), keys normalized by the store as
        `ckpt import` normalizes them ("module.", "_orig_mod." stripped), tensors from any
        device copied to the host, content-addressed and deduplicated by the store.

        Args:
          state: an nn.Module (its state_dict()) or a state dict of tensors.
          optimizer, scheduler: torch.optim objects or their state_dict()s.
          epoch, step: kept in the version's metadata and, with `extra` (plain values and
            tensors, never pickled), in the bundle: `ckpt export --bundle` gives back
            torch.save's {"model", "optimizer", "scheduler", "epoch", "step", **extra}, and
            load_bundle resumes it.
          metrics: name -> number; lineage: run_id, parent ("MODEL@N"), parent_relation,
            code_revision, dataset, producer_info (a dict of strings).
          alias: moved to the new version in the same commit; expected_latest_version: if > 0,
            FailedPrecondition unless the model's latest version is still that one.
          dedup: hash each tensor's 4 MiB chunks here (SHA-256, the store's addresses), ask the
            store which it lacks (FindMissingChunks) and send only those, naming the others:
            a save whose weights barely changed sends little more than the change. False sends
            every byte and skips the hashing (for state that never repeats).

        InvalidArgument names the key of anything it cannot store. Returns Saved.
        """
        return self._save(model_name, state, param_names_of(state, optimizer),
                          optimizer=optimizer, scheduler=scheduler, epoch=epoch, step=step,
                          extra=extra, metrics=metrics, lineage=lineage, alias=alias,
                          reason=reason, expected_latest_version=expected_latest_version,
                          dedup=dedup, timeout=timeout)

    def _save(self, model_name, state, param_names, optimizer=None, scheduler=None, epoch=None,
              step=None, extra=None, metrics=None, lineage=None, alias=None, reason=None,
              expected_latest_version=0, dedup=True, timeout=None):
        """save(), with the optimizer's parameter names given (save_async takes them from the
        module before snapshotting it into a plain state dict)."""
        pb = self._pb.checkpoint_store_pb2
        manifest, tensors = build_manifest(
            self._pb, self._dtypes, model_name, state, optimizer=optimizer, scheduler=scheduler,
            epoch=epoch, step=step, extra=extra, metrics=metrics, lineage=lineage,
            param_names=param_names)
        aliases = [alias] if alias else []
        header = pb.UploadHeader(model=model_name, manifest=manifest, aliases=aliases,
                                 reason=reason or "", normalize_keys=True,
                                 expected_latest_version=expected_latest_version)

        def find_missing(addresses):
            request = pb.FindMissingChunksRequest(sha256=addresses)
            return self._call("store", "FindMissingChunks", request, timeout).missing_sha256

        # A chunk the store reported held can be collected before the upload names it (it was
        # unreferenced, and GC ran in between): the store then answers NOT_FOUND and nothing is
        # committed, so the save is made once more with every byte sent.
        for referencing in ([True, False] if dedup else [False]):
            uploader = Uploader(pb, header, tensors, aliases,
                                find_missing if referencing else None)
            try:
                response = self._call("store", "Upload", uploader.requests(), timeout)
            except CkptError as error:
                if uploader.error is not None:  # raised making the messages: gRPC says CANCELLED
                    raise uploader.error from None
                if referencing and isinstance(error, NotFound) and "send its bytes" in str(error):
                    continue
                raise
            stats = uploader.stats
            return Saved(response.version.version, response.logical_bytes, response.new_bytes,
                         list(response.warnings), stats.chunks_sent, stats.chunks_referenced,
                         stats.sent_bytes)

    def save_async(self, model_name: str,
                   state: Union[torch.nn.Module, Mapping[str, torch.Tensor]], *,
                   overlap_snapshot: bool = False, **kwargs: Any) -> concurrent.futures.Future:
        """save() with the upload on a background thread, for a training loop that must not
        wait for the network: the snapshot is taken here (every tensor of the model, optimizer
        and scheduler state copied to host memory, so the loop may step on at once), the upload
        runs after. At most one upload is in flight: a call made while the previous one still
        uploads waits for it first. The copy goes into the host buffers of the previous snapshot
        where shapes and dtypes match, so the client holds one snapshot's memory and a loop
        that saves every N steps copies into memory already faulted in. The previous
        upload's error, if it failed, is raised by the next call as well as by its future's
        result(). Returns a Future of Saved. Arguments as save().

        overlap_snapshot=True takes the copy on the background thread too, CheckFreq-style, so
        it overlaps the next forward and backward pass: the caller must then call
        wait_snapshot() before anything changes the saved tensors (optimizer.step(), a
        scheduler step, in-place updates); until then the snapshot may mix old and new values.
        """
        with self._saver_lock:
            if self._saver is None:
                self._saver = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="ckpt-save")
            previous, self._last_save = self._last_save, None
        if previous is not None:
            error = previous.exception()
            if error is not None:
                raise error
        weights = state.state_dict() if isinstance(state, torch.nn.Module) else state
        names = param_names_of(state, kwargs.get("optimizer"))
        parts = {}
        for part in ("optimizer", "scheduler", "extra"):
            value = kwargs.get(part)
            if value is not None and hasattr(value, "state_dict") and callable(value.state_dict):
                value = value.state_dict()
            parts[part] = value
        # The previous upload has ended (above), so its host buffers are free to take this copy.
        taken = threading.Event()

        def take():
            try:
                snapshot, copied = self._snapshot.take((weights, parts))
            finally:
                taken.set()
            return snapshot, dict(kwargs, **copied)

        def upload(taken_snapshot):
            snapshot, arguments = taken_snapshot
            return self._save(model_name, snapshot, names, **arguments)

        if overlap_snapshot:
            future = self._saver.submit(lambda: upload(take()))
        else:
            future = self._saver.submit(upload, take())
        with self._saver_lock:
            self._last_save = future
            self._snapshot_taken = taken
        return future

    def wait_snapshot(self) -> None:
        """Returns once the snapshot of the last save_async(..., overlap_snapshot=True) has been
        copied to host memory, so the caller may change the saved tensors again (call it before
        optimizer.step()). Returns at once when no snapshot is being taken."""
        with self._saver_lock:
            taken = self._snapshot_taken
        if taken is not None:
            taken.wait()

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
                assembler = StreamAssembler(metas, selected, verify)
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
               timeout: Optional[float] = None) -> Any:
        """Writes a version as a file through the loader's Export: ``format="pt"`` (torch.save
        zip that torch.load(weights_only=True) reads) or ``"safetensors"``. With
        include_optimizer / include_scheduler (pt only) the file is the whole training bundle as
        its producer saved it. dtype (torch.float16 / bfloat16 / float32) casts floating tensors
        on the server. The file appears whole or not at all: bytes go to a temporary file beside
        ``path``, which is renamed into place once the size the server announced has arrived.

        With verify (the default) each piece is checked against the XXH3-64 the loader took as it
        sent it; a mismatch raises IntegrityError (a DataLoss) naming the piece's offset, and
        nothing is written. The check needs the ``xxhash`` module (Debian: python3-xxhash); without
        it export raises FailedPrecondition rather than skip the check.

        Returns a dict: version ("MODEL@N"), file_name (the server's suggestion), bytes,
        left_out (what the file cannot hold, with why) and warnings.
        """
        xxh3_64 = _xxh3_64() if verify else None
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
                                   format=formats[format])
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
                    if xxh3_64 is not None:
                        _check_piece(ref, response, out.tell(), xxh3_64)
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

    # ---- the registry

    def history(self, model: str, alias: Optional[str] = None, after_sequence: int = 0,
                since_unix_micros: int = 0) -> list:
        """Every registry event of `model` (or only `alias`'s moves and deletes), oldest first, as
        ckpt.v1.RegistryEvent messages: commits, alias moves with who / when / why, annotations,
        deletes. Pages are fetched until the end."""
        pb = self._pb.checkpoint_store_pb2
        events = []
        after = after_sequence
        while True:
            response = self._call("store", "ListHistory", pb.ListHistoryRequest(
                model=model, alias=alias or "", after_sequence=after,
                since_unix_micros=since_unix_micros))
            events.extend(response.events)
            if response.next_after_sequence == 0 or not response.events:
                return events
            after = response.next_after_sequence

    def annotate(self, ref: str, metrics: Optional[Mapping[str, float]] = None,
                 tags: Optional[Mapping[str, str]] = None, description: Optional[str] = None,
                 reason: Optional[str] = None, remove_metrics: Sequence[str] = (),
                 remove_tags: Sequence[str] = ()) -> Any:
        """Adds (or changes) metrics, tags and the description of a committed version; returns
        its ckpt.v1.VersionAnnotations after the change. ``ref`` may be an alias: it is resolved
        first, and the annotation goes to that version number."""
        model, version, _ = parse_ref(ref)
        if version is None:
            version = self.resolve(ref)
        registry = self._pb.registry_pb2
        change = registry.AnnotationChange(
            set_metrics={k: float(v) for k, v in (metrics or {}).items()},
            set_tags={k: str(v) for k, v in (tags or {}).items()},
            remove_metrics=list(remove_metrics), remove_tags=list(remove_tags))
        if description is not None:
            change.description = description
        return self._call("store", "AnnotateVersion",
                          self._pb.checkpoint_store_pb2.AnnotateVersionRequest(
                              model=model, version=version, change=change, reason=reason or ""))

    def set_alias(self, ref: str, alias: str, reason: Optional[str] = None,
                  expected_current_version: int = 0) -> int:
        """Points `alias` at the version `ref` names; returns the version it pointed at before (0
        when new)."""
        model, version, _ = parse_ref(ref)
        if version is None:
            version = self.resolve(ref)
        response = self._call("store", "SetAlias", self._pb.checkpoint_store_pb2.SetAliasRequest(
            model=model, alias=alias, version=version, reason=reason or "",
            expected_current_version=expected_current_version))
        return response.previous_version

    def versions(self, model: str, tags: Sequence[str] = (), labels: Sequence[str] = (),
                 where: Sequence[str] = (), created_after_unix_micros: int = 0,
                 created_before_unix_micros: int = 0) -> list:
        """The versions of `model` (ckpt.v1.VersionInfo, oldest first) that match every filter:
        ``tags`` / ``labels`` as "key=value" or bare "key"; ``where`` metric conditions such as
        "val_acc>=0.9", "loss<=0.2", "val_acc==0.93" (annotation metrics over commit-time ones)."""
        registry = self._pb.registry_pb2
        version_filter = registry.VersionFilter(
            tags=list(tags), labels=list(labels),
            created_after_unix_micros=created_after_unix_micros,
            created_before_unix_micros=created_before_unix_micros)
        for condition in where:
            name, low, high = _parse_condition(condition)
            metric = version_filter.metrics.add(name=name)
            if low is not None:
                metric.min = low
            if high is not None:
                metric.max = high
        pb = self._pb.checkpoint_store_pb2
        infos, token = [], ""
        while True:
            response = self._call("store", "ListVersions", pb.ListVersionsRequest(
                model=model, page_token=token, filter=version_filter))
            infos.extend(response.versions)
            token = response.next_page_token
            if not token:
                return infos

    def watch(self, models: Union[str, Sequence[str], None] = None, alias: Optional[str] = None,
              resume_token: int = 0, max_backoff: float = 10.0,
              max_reconnects: Optional[int] = None) -> Iterator[WatchUpdate]:
        """Iterates over registry updates (WatchUpdate) of `models` (a name, a list, or None for
        every model), only `alias`'s moves when given, forever.

        With resume_token=0 the first update is the current state, then each change as it
        commits. When the connection drops (UNAVAILABLE; RESOURCE_EXHAUSTED or CANCELLED from
        the server cutting off a slow reader or shutting down), the watch backs off 0.1 s
        doubling up to ``max_backoff`` seconds (each wait shortened by up to a fifth at random,
        as the C++ client's; reset after each update), waits up
        to 10 s for the store's channel to connect, and reconnects with the last resume token it
        yielded, as RemoteCheckpointStore::Watch does: the caller misses nothing, sees nothing
        twice, and sees a change made as soon as a restarted store is back.
        ``max_reconnects`` consecutive failed reconnects (None: no limit) raise the last error.
        Other errors raise at once.
        Close the iterator (or break out of the loop), or close the Client, to stop.
        """
        if isinstance(models, str):
            models = [models]
        pb = self._pb.checkpoint_store_pb2
        stub = self._need("store", "Watch")
        token = resume_token
        # Once an update was seen, reconnects continue after it, never from a second state (a
        # state read from an empty history carries token 0).
        resume = False
        failures = 0
        backoff = Backoff(initial=0.1, maximum=max_backoff)
        while True:
            request = pb.WatchRequest(models=list(models or []),
                                      aliases=[alias] if alias else [], resume_token=token,
                                      resume=resume)
            call = stub.Watch(request, metadata=self._metadata)
            try:
                for response in call:
                    failures = 0
                    backoff.reset()
                    token = response.resume_token
                    resume = True
                    kind = response.WhichOneof("update")
                    yield WatchUpdate(state=response.state if kind == "state" else None,
                                      event=response.event if kind == "event" else None,
                                      resume_token=token)
                error = None  # the server ended the stream: reconnect.
            except grpc.RpcError as rpc_error:
                if self._closed:
                    return  # close() cancelled the call.
                error = from_rpc_error(rpc_error, "Watch")
                if rpc_error.code() not in (grpc.StatusCode.UNAVAILABLE,
                                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                                            grpc.StatusCode.CANCELLED):
                    raise error from rpc_error
            finally:
                call.cancel()
            if error is not None:
                failures += 1
                if max_reconnects is not None and failures > max_reconnects:
                    raise error
            # Also after a stream the server ended cleanly, so a server that keeps ending them
            # is not called in a tight loop.
            backoff.wait()
            if self._closed:
                return
            # Resume once the channel is connected, as RemoteWatch does (WaitUntilConnected;
            # issue #36). Resuming at once was a fail-fast call into a channel still in
            # TRANSIENT_FAILURE after the restart, and between those calls no thread polled the
            # channel: its reconnect to the restarted store was read only by gRPC's client-channel
            # backup poller (every 5 s), so the watch saw a move made right after the restart only
            # seconds later (with gRPC's default reconnect backoff, minutes after a longer outage)
            # while a C++ watch saw it at once. Waiting on the channel's state polls the channel.
            self._await_store_channel(_CONNECT_TIMEOUT)
            if self._closed:
                return

    def _await_store_channel(self, timeout):
        """Asks the store's channel to connect and waits up to `timeout` seconds (less once
        close() is called) until it is. A wait that runs out is no error here: the resume that
        follows fails fast and counts as a failed reconnect."""
        ready = grpc.channel_ready_future(self._store_channel)
        deadline = time.monotonic() + timeout
        try:
            while not self._closed and time.monotonic() < deadline:
                try:
                    ready.result(timeout=min(0.25, max(0.0, deadline - time.monotonic())))
                    return
                except grpc.FutureTimeoutError:
                    pass
        finally:
            ready.cancel()


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


def _parse_condition(text):
    """ "val_acc>=0.9" -> ("val_acc", 0.9, None); ranges are inclusive, so > and < are refused
    rather than silently widened."""
    for operator in (">=", "<=", "=="):
        name, found, value = text.partition(operator)
        if found:
            name = name.strip()
            try:
                number = float(value)
            except ValueError:
                raise InvalidArgument(f"metric condition {text!r}: {value.strip()!r} is not a "
                                      "number") from None
            if not name:
                break
            if operator == ">=":
                return name, number, None
            if operator == "<=":
                return name, None, number
            return name, number, number
    raise InvalidArgument(f"metric condition {text!r}: use NAME>=X, NAME<=X or NAME==X")
