"""ckpt.v1.Value trees (optimizer, scheduler and extra state) back into Python objects.

The store keeps a bundle's non-model state as Value trees (proto/ckpt/v1/types.proto) whose
tensors point by key into Manifest.state_tensors. Decoding never runs code: a pickled object the
store kept as an OpaqueObject comes back as an ``Opaque`` description, not an instance.
"""
import collections

from .errors import ProtocolError

Opaque = collections.namedtuple("Opaque", ["class_name", "args", "state"])
Opaque.__doc__ = """An object of class ``class_name`` that the producer pickled and ckpt keeps as a
description only (ckpt.v1.OpaqueObject): ``args`` and ``state`` decoded as any other value."""


def decode_value(value, tensors):
    """The Python object `value` (a ckpt.v1.Value) describes; `tensors` maps state-tensor keys to
    torch tensors. Dicts keep their order (OrderedDict when the producer's was one), optimizer
    state's integer keys stay ints, tuples stay tuples."""
    kind = value.WhichOneof("kind")
    if kind is None or kind == "none_value":
        return None
    if kind in ("bool_value", "int_value", "float_value", "string_value", "bytes_value"):
        return getattr(value, kind)
    if kind == "list_value":
        return [decode_value(item, tensors) for item in value.list_value.items]
    if kind == "tuple_value":
        return tuple(decode_value(item, tensors) for item in value.tuple_value.items)
    if kind == "dict_value":
        result = collections.OrderedDict() if value.dict_value.ordered else {}
        for entry in value.dict_value.entries:
            key = entry.int_key if entry.WhichOneof("key") == "int_key" else entry.string_key
            result[key] = decode_value(entry.value, tensors)
        return result
    if kind == "tensor_value":
        key = value.tensor_value.key
        if key not in tensors:
            raise ProtocolError(f"a state value points at tensor '{key}', which the version's "
                                f"state tensors do not hold")
        return tensors[key]
    if kind == "opaque_value":
        opaque = value.opaque_value
        return Opaque(opaque.class_name,
                      decode_value(opaque.args, tensors) if opaque.HasField("args") else None,
                      decode_value(opaque.state, tensors) if opaque.HasField("state") else None)
    raise ProtocolError(f"a state value of unknown kind '{kind}'")
