"""ckpt_client: save, resume, load, export and follow ckpt checkpoints from Python.

    import ckpt_client
    with ckpt_client.Client(store="store:7070", loader="loader:7071", token_file="token") as c:
        model.load_state_dict(c.load_state_dict("resnet@production", device="cuda:0"))
        c.export("resnet@7", "resnet7.safetensors", format="safetensors")
        c.annotate("resnet@7", metrics={"val_acc": 0.93}, tags={"eval": "imagenet"})
        for update in c.watch("resnet", alias="production"):
            print(update.event)

See clients/python/README.md. The gRPC modules are generated, never committed (ckpt_client._stubs
says where they come from).
"""
# The package's version: MAJOR is the wire API's (ckpt.v1), MINOR grows with compatible additions.
__version__ = "1.0.0"

from .client import Bundle, Client, Saved, VersionSummary, WatchUpdate, parse_ref
from .errors import (AlreadyExists, Cancelled, CkptError, DataLoss, DeadlineExceeded,
                     FailedPrecondition, IntegrityError, InvalidArgument, NotFound, OutOfRange,
                     PermissionDenied, ProtocolError, ResourceExhausted, ServerError,
                     Unauthenticated, Unavailable, Unimplemented)
from ._stubs import StubsUnavailableError
from ._values import Opaque

__all__ = [
    "Bundle", "Client", "Saved", "VersionSummary", "WatchUpdate", "parse_ref", "Opaque",
    "CkptError", "IntegrityError", "ProtocolError", "InvalidArgument", "NotFound",
    "AlreadyExists", "PermissionDenied", "Unauthenticated",
    "FailedPrecondition", "ResourceExhausted", "Unavailable", "DeadlineExceeded", "Cancelled",
    "Unimplemented", "DataLoss", "OutOfRange", "ServerError", "StubsUnavailableError",
]
