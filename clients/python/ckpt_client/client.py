"""Client: the ckpt checkpoint store and loader, from Python.

This module holds the class, its channels and the calls every part shares (unary and streaming
calls with errors mapped, version references, resolve and manifest). The methods live by concern
in mixins: _loading.py (load_state_dict, load_bundle, export), _saving.py (save, save_async) and
_registry.py (history, annotate, set_alias, versions, watch).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import grpc

from . import _registry, _stubs
from ._bundles import Bundle
from ._loading import Device, LoadingCalls
from ._refs import parse_ref
from ._registry import RegistryCalls, VersionSummary, WatchUpdate
from ._saving import Saved, SavingCalls
from ._tensors import torch_dtypes
from .errors import InvalidArgument, from_rpc_error

# What `from ckpt_client.client import ...` has always found here.
__all__ = ["Bundle", "Client", "Device", "Saved", "VersionSummary", "WatchUpdate", "parse_ref"]
# The metric-condition parser versions() uses (tests import it from here).
_parse_condition = _registry._parse_condition

# Large enough for a 1 MiB TensorData piece and a manifest of many tensors (the servers' own
# default limit is 16 MiB).
_MAX_MESSAGE_BYTES = 64 << 20
# A channel's reconnect backoff (first, most) in ms: ClientChannel's (libs/rpc/client_channel.cc).
_RECONNECT_BACKOFF_MS = (100, 5000)
# Keepalive pings (interval, timeout) in ms: libs/rpc/wire_constants.h's. A paused or cut-off
# server keeps its TCP connection open; without pings its calls would hang until their timeouts
# instead of failing over to another store of a list.
_KEEPALIVE_MS = (1000, 1000)


def _target(address, service):
    """(gRPC target, channel options) for ``address``: "HOST:PORT" as it is; several servers of
    the service, "HOST:PORT,HOST:PORT,..." (IP literals of one family) or "dns:///NAME:PORT", as
    the C++ client dials them (ChannelTargetFor, libs/rpc/client_channel.cc): round robin over
    those whose grpc.health.v1 status for ``service`` is SERVING, so a list of stores reaches
    their writer (followers report NOT_SERVING) and, after a failover, its successor."""
    entries = [entry.strip() for entry in address.split(",")]
    if len(entries) == 1 and not address.startswith("dns:"):
        return address, []
    options = [("grpc.service_config", json.dumps({
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": service}}))]
    if address.startswith("dns:"):
        return address, options
    if any(not entry for entry in entries):
        raise InvalidArgument(f"address list {address!r} has an empty entry")
    six = [entry.startswith("[") for entry in entries]
    if any(six) != all(six):
        raise InvalidArgument(f"address list {address!r} mixes IPv4 and IPv6 addresses")
    return ("ipv6:" if six[0] else "ipv4:") + ",".join(entries), options


def _read(path):
    with open(os.path.expanduser(os.fspath(path)), "rb") as f:
        return f.read()


class Client(LoadingCalls, SavingCalls, RegistryCalls):
    """A connection to a ckpt checkpoint_store and / or loader service.

    Args:
      store: "HOST:PORT" of the checkpoint_store service (registry calls: resolve, history,
        annotate, versions, watch; and load_state_dict when no loader is given), or every store
        of a deployment, "HOST:PORT,HOST:PORT" (or "dns:///NAME:PORT"): calls go to the writer
        and, when it dies, to the store that takes over (save() sends a commit again then,
        watch() resumes there).
      loader: "HOST:PORT" of the loader service (load_state_dict, export), or several.
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
                   ("grpc.max_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS[1]),
                   ("grpc.keepalive_time_ms", _KEEPALIVE_MS[0]),
                   ("grpc.keepalive_timeout_ms", _KEEPALIVE_MS[1]),
                   ("grpc.keepalive_permit_without_calls", 1),
                   ("grpc.http2.max_pings_without_data", 0)]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        credentials = None
        if ca_file is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_file),
                private_key=_read(key_file) if key_file else None,
                certificate_chain=_read(cert_file) if cert_file else None)

        def channel(address, service):
            target, extra = _target(address, service)
            if credentials is None:
                return grpc.insecure_channel(target, options=options + extra)
            return grpc.secure_channel(target, credentials, options=options + extra)

        self._channels = []
        self._closed = False
        self._start_saving()
        self._store = self._loader = None
        if store is not None:
            self._channels.append(channel(store, "ckpt.v1.CheckpointStore"))
            self._store_channel = self._channels[-1]
            self._store = self._pb.checkpoint_store_pb2_grpc.CheckpointStoreStub(
                self._store_channel)
        if loader is not None:
            self._channels.append(channel(loader, "ckpt.v1.Loader"))
            self._loader = self._pb.loader_pb2_grpc.LoaderStub(self._channels[-1])

    # ---- plumbing

    def close(self) -> None:
        """Waits for a save_async upload still in flight, then closes the channels; calls in
        progress end (a watch() iteration just stops)."""
        self._finish_saving()
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
