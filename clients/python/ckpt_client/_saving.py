"""Client's writing calls: save (the store's Upload, deduplicated by _upload.Uploader) and
save_async with its host snapshot and one background upload."""
from __future__ import annotations

import collections
import concurrent.futures
import secrets
import threading
from typing import Any, Mapping, Optional, Union

import torch

from ._bundles import HostSnapshot, build_manifest, param_names_of
from ._distributed import on_one_rank
from ._retry import while_unavailable
from ._upload import Uploader
from .errors import CkptError, NotFound

# Public as ckpt_client.Saved / ckpt_client.client.Saved, which is where pickle and repr look.
Saved = collections.namedtuple("Saved", ["version", "logical_bytes", "new_bytes", "warnings",
                                         "chunks_sent", "chunks_referenced", "sent_bytes",
                                         "replayed"],
                               defaults=(False,), module="ckpt_client.client")
Saved.__doc__ = """What Client.save committed: the version number, the tensor bytes it holds, those
the store did not hold before (after deduplication; for a scoped identity, new to its scope),
the store's validation warnings, and what travelled: the 4 MiB chunks whose bytes were sent, the
chunks named by address because the store already held them, and the tensor bytes sent (of the
last attempt). ``replayed``: an earlier attempt of this save had committed the version and its
answer was lost; the last attempt made nothing new."""


class SavingCalls:
    """The writing methods of Client (mixed into it). They use the Client's plumbing: ``_pb``
    (the generated modules), ``_dtypes`` (torch_dtypes()), ``_call`` (a unary or
    client-streaming call, errors mapped) and ``_await_store_channel`` (before a retry).
    ``_start_saving()`` sets up their state (called by
    Client.__init__), ``_finish_saving()`` waits for an upload in flight (Client.close)."""

    def _start_saving(self):
        # save_async's one upload thread (made on first use) and its last upload.
        self._saver = None
        self._last_save = None
        self._saver_lock = threading.Lock()
        self._snapshot = HostSnapshot()  # save_async's host buffers, reused from save to save
        self._snapshot_taken = None  # set once the last save_async's snapshot is copied

    def _finish_saving(self):
        if self._saver is not None:
            self._saver.shutdown(wait=True)

    def save(self, model_name: str, state: Union[torch.nn.Module, Mapping[str, torch.Tensor]],
             *, optimizer: Any = None, scheduler: Any = None, epoch: Optional[int] = None,
             step: Optional[int] = None, extra: Optional[Mapping[str, Any]] = None,
             metrics: Optional[Mapping[str, float]] = None,
             lineage: Optional[Mapping[str, Any]] = None, alias: Optional[str] = None,
             reason: Optional[str] = None, expected_latest_version: int = 0,
             dedup: bool = True, idempotency_key: Optional[str] = None,
             timeout: Optional[float] = None, on_rank: Optional[int] = None,
             group: Any = None) -> Saved:
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

          idempotency_key: names this commit (at most 128 printable ASCII characters, no
            spaces): if the model already has a version committed with it, that version is
            returned (Saved.replayed) and nothing new is made, so a job that restarts and saves
            step N again under f"{run_id}-step-{N}" commits it once. Default: a random key.

        A save that fails with Unavailable (the store restarting, or its writer dying and
        another store of Client(store="A,B") taking over) is sent again for up to 10 s, every
        attempt with one idempotency key, so it commits exactly once; Saved.replayed says an
        earlier attempt had landed.

          on_rank: in a torch.distributed job (DDP), call save() on every rank with the same
            arguments: only global rank `on_rank` saves, the others wait for it (in `group`,
            default the whole job) and every rank returns its Saved, or raises its error. The
            plain way works too: ``if dist.get_rank() == 0: client.save(...)`` then
            ``dist.barrier()``.

        InvalidArgument names the key of anything it cannot store. Returns Saved.
        """
        def save():
            return self._save(model_name, state, param_names_of(state, optimizer),
                              optimizer=optimizer, scheduler=scheduler, epoch=epoch, step=step,
                              extra=extra, metrics=metrics, lineage=lineage, alias=alias,
                              reason=reason, expected_latest_version=expected_latest_version,
                              dedup=dedup, idempotency_key=idempotency_key, timeout=timeout)

        if on_rank is None:
            return save()
        return on_one_rank(save, on_rank, group, "save(on_rank=)")

    def _save(self, model_name, state, param_names, optimizer=None, scheduler=None, epoch=None,
              step=None, extra=None, metrics=None, lineage=None, alias=None, reason=None,
              expected_latest_version=0, dedup=True, idempotency_key=None, timeout=None):
        """save(), with the optimizer's parameter names given (save_async takes them from the
        module before snapshotting it into a plain state dict)."""
        pb = self._pb.checkpoint_store_pb2
        manifest, tensors = build_manifest(
            self._pb, self._dtypes, model_name, state, optimizer=optimizer, scheduler=scheduler,
            epoch=epoch, step=step, extra=extra, metrics=metrics, lineage=lineage,
            param_names=param_names)
        aliases = [alias] if alias else []
        # One key for every attempt: a retry of a commit that had landed gets its version back.
        header = pb.UploadHeader(model=model_name, manifest=manifest, aliases=aliases,
                                 reason=reason or "", normalize_keys=True,
                                 expected_latest_version=expected_latest_version,
                                 idempotency_key=idempotency_key or
                                 "commit-" + secrets.token_hex(16))
        return while_unavailable(
            lambda: self._upload(pb, header, tensors, aliases, dedup, timeout),
            self._await_store_channel)

    def _upload(self, pb, header, tensors, aliases, dedup, timeout):
        """One attempt of a save: the Upload call (made twice when a chunk it named was
        collected meanwhile)."""

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
                         stats.sent_bytes, response.replayed)

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
