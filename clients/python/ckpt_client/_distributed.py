"""One rank of a torch.distributed job does a call for every rank: Client.save(on_rank=) and
Client.load_bundle(broadcast_from=). The result, or the CkptError it raised, reaches every rank
of the group through torch.distributed.broadcast_object_list, which is also the barrier: no rank
returns before the call is done. The objects travel pickled between the job's own processes
(torch's object collectives pickle), never from the store."""
from typing import Any, Callable, Optional

from . import errors


def require_initialized(argument: str):
    """torch.distributed, initialized; FailedPrecondition naming `argument` otherwise."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise errors.FailedPrecondition(
            f"{argument} needs torch.distributed initialized (dist.init_process_group) on "
            "every rank of the job")
    return dist


def on_one_rank(call: Callable[[], Any], src: int, group: Optional[Any], argument: str) -> Any:
    """call() on global rank `src` only; every rank of `group` (default: the whole job) returns
    its result or raises its CkptError (the same class and message). Every rank of the group
    must make the same on_one_rank call, as with any collective."""
    dist = require_initialized(argument)
    payload = [None]
    if dist.get_rank() == src:
        try:
            payload = [(call(), None)]
        except errors.CkptError as error:
            payload = [(None, (type(error).__name__, str(error)))]
    dist.broadcast_object_list(payload, src=src, group=group)
    result, failure = payload[0]
    if failure is not None:
        name, message = failure
        raise getattr(errors, name, errors.CkptError)(f"rank {src}: {message}")
    return result
