"""Client's registry calls: history, annotate, set_alias, versions and watch (the store's
ListHistory, AnnotateVersion, SetAlias, ListVersions and Watch), and the metric conditions that
versions() filters by."""
from __future__ import annotations

import collections
import dataclasses
import datetime
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import grpc

from ._refs import parse_ref
from ._retry import Backoff
from .errors import InvalidArgument, from_rpc_error

# Seconds watch() waits for the store's channel to connect before each resume (ClientOptions'
# connect_timeout).
_CONNECT_TIMEOUT = 10.0

# Public as ckpt_client.WatchUpdate / ckpt_client.client.WatchUpdate (pickle and repr look there).
WatchUpdate = collections.namedtuple("WatchUpdate", ["state", "event", "resume_token"],
                                     module="ckpt_client.client")
WatchUpdate.__doc__ = """One message of a watch: exactly one of ``state`` (a ckpt.v1.WatchState:
the watched models as they are, sent first on a fresh watch) and ``event`` (a
ckpt.v1.RegistryEvent) is set. ``resume_token`` continues after it (``Client.watch(...,
resume_token=...)``)."""


@dataclasses.dataclass(frozen=True)
class VersionSummary:
    """One stored version as versions() lists it, in plain Python values.

    ``created`` is the commit time (UTC); ``metrics`` the commit-time metrics with the
    annotations' over them (what ``where=`` filters on); ``tags`` and ``description`` the
    annotations' (the description given at commit when never annotated); ``labels``,
    ``run_id`` and ``parent`` (a "MODEL@N" or "") as committed. ``message`` is the
    ckpt.v1.VersionInfo as the store sent it, for anything else."""

    model: str
    version: int
    aliases: List[str]
    created: Optional[datetime.datetime]
    epoch: int
    step: int
    metrics: Dict[str, float]
    tags: Dict[str, str]
    labels: Dict[str, str]
    description: str
    logical_bytes: int
    tensor_count: int
    has_optimizer_state: bool
    has_scheduler_state: bool
    run_id: str
    parent: str
    message: Any = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_message(cls, model: str, info: Any) -> "VersionSummary":
        metadata, annotations = info.metadata, info.annotations
        created = None
        if metadata.created_unix_micros:
            created = datetime.datetime.fromtimestamp(metadata.created_unix_micros / 1e6,
                                                      tz=datetime.timezone.utc)
        metrics = dict(metadata.metrics)
        metrics.update(annotations.metrics)
        return cls(model=model, version=info.version, aliases=list(info.aliases),
                   created=created, epoch=metadata.epoch, step=metadata.global_step,
                   metrics=metrics, tags=dict(annotations.tags), labels=dict(metadata.labels),
                   description=annotations.description or metadata.description,
                   logical_bytes=info.logical_bytes, tensor_count=info.tensor_count,
                   has_optimizer_state=info.has_optimizer_state,
                   has_scheduler_state=info.has_scheduler_state,
                   run_id=metadata.lineage.run_id, parent=metadata.lineage.parent, message=info)


VersionSummary.__module__ = "ckpt_client.client"  # public there, where pickle and repr look.


class RegistryCalls:
    """The registry methods of Client (mixed into it). They use the Client's plumbing: ``_pb``
    (the generated modules), ``_call`` / ``_need`` / ``_metadata`` (unary calls and the store's
    stub), ``resolve``, and for watch() ``_await_store_channel`` and ``_closed``."""

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
        """The versions of `model` (VersionSummary, oldest first) that match every filter:
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
            infos.extend(VersionSummary.from_message(model, info) for info in response.versions)
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
