"""The exceptions ckpt_client raises: all are CkptError.

gRPC failures become the subclass for their status code, carrying the server's message (ckpt's
servers say what was wrong and what to do, e.g. "identity 'serving-fleet' (role reader) may not
move aliases (SetAlias) on model 'resnet': that needs the writer role"), the code and the RPC that
failed.
"""
import grpc


class CkptError(Exception):
    """Base class of every ckpt_client error."""

    code = None  # the grpc.StatusCode, for errors that came from a server.

    def __init__(self, message, code=None, method=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.method = method


class InvalidArgument(CkptError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CkptError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(CkptError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(CkptError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(CkptError):
    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPrecondition(CkptError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(CkptError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(CkptError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(CkptError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(CkptError):
    code = grpc.StatusCode.CANCELLED


class Unimplemented(CkptError):
    """The server does not implement the RPC (an older server than this client)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class DataLoss(CkptError):
    """The server found its stored bytes damaged."""

    code = grpc.StatusCode.DATA_LOSS


class OutOfRange(CkptError):
    """A byte or element range outside its tensor (load_flat_range)."""

    code = grpc.StatusCode.OUT_OF_RANGE


class ServerError(CkptError):
    """Any other status code (INTERNAL, UNKNOWN, ABORTED, ...)."""


class IntegrityError(DataLoss):
    """Bytes received do not match the checksum the server sent for them: damaged between the
    server and this client. A DataLoss (code DATA_LOSS), found here rather than by the server.

    ``tensor`` is the tensor's key and ``chunk`` the chunk's index within it (None when the
    protocol named only the tensor's content hash); for an Export, ``offset`` is where the
    damaged piece starts in the file.
    """

    def __init__(self, message, tensor=None, chunk=None, offset=None):
        super().__init__(message)
        self.tensor = tensor
        self.chunk = chunk
        self.offset = offset


class ProtocolError(CkptError):
    """The server's stream broke the protocol (missing manifest, bytes out of order, ...)."""


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotFound, AlreadyExists, PermissionDenied, Unauthenticated,
    FailedPrecondition, ResourceExhausted, Unavailable, DeadlineExceeded, Cancelled,
    Unimplemented, DataLoss, OutOfRange)}


def from_rpc_error(error, method=None):
    """The CkptError for a grpc.RpcError (the caller raises it ``from error``)."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    name = code.name if code is not None else "UNKNOWN"
    message = f"{method}: {name}: {details}" if method else f"{name}: {details}"
    cls = _BY_CODE.get(code, ServerError)
    return cls(message, code=code, method=method)
