"""ckpt.v1.Value trees (optimizer, scheduler and extra state) to and from Python objects.

The store keeps a bundle's non-model state as Value trees (proto/ckpt/v1/types.proto) whose
tensors point by key into Manifest.state_tensors. Decoding never runs code: a pickled object the
store kept as an OpaqueObject comes back as an ``Opaque`` description, not an instance.
"""
import collections

import torch

from .errors import InvalidArgument, ProtocolError

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
        args = decode_value(opaque.args, tensors) if opaque.HasField("args") else None
        state = decode_value(opaque.state, tensors) if opaque.HasField("state") else None
        plain = _plain_object(opaque.class_name, args, state)
        return plain if plain is not None else Opaque(opaque.class_name, args, state)
    raise ProtocolError(f"a state value of unknown kind '{kind}'")


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _plain_object(class_name, args, state):
    """The objects that are data, not code (libs/tensor/value.h PlainObjectKind): a complex, a
    torch.device, a torch dtype, built without running anything; None for any other class."""
    if state is not None:
        return None
    if class_name == "builtins.complex" and isinstance(args, tuple) and len(args) == 2 and \
            all(isinstance(part, (int, float)) and not isinstance(part, bool) for part in args):
        return complex(*args)
    if class_name == "torch.device" and isinstance(args, tuple) and 1 <= len(args) <= 2 and \
            isinstance(args[0], str) and (len(args) == 1 or isinstance(args[1], int)):
        return torch.device(*args)
    if class_name.startswith("torch.") and args is None:
        dtype = getattr(torch, class_name[len("torch."):], None)
        if isinstance(dtype, torch.dtype):
            return dtype
    return None


class StateTensors:
    """The tensor table of a manifest being built (Manifest.state_tensors): each tensor of a
    value tree gets a unique key "<part>/<path>" (as the C++ store names them) and a TensorMeta
    made by ``describe(key, tensor)``."""

    def __init__(self, describe):
        self._describe = describe
        self.metas = []
        self.tensors = []
        self._keys = set()

    def add(self, path, tensor):
        key, suffix = path, 2
        while key in self._keys:  # int key 0 and string key "0" print alike
            key, suffix = f"{path}#{suffix}", suffix + 1
        self._keys.add(key)
        meta = self._describe(key, tensor)
        meta.original_key = path
        self.metas.append(meta)
        self.tensors.append(tensor)
        return key


def encode_value(obj, path, table, types_pb2):
    """A ckpt.v1.Value for `obj`, whose tensors go into `table` (StateTensors); `path` ("optimizer",
    "optimizer/state/0") names it in errors and state-tensor keys. InvalidArgument naming the path
    for what ckpt cannot store without pickling (functions, objects of user classes...)."""
    pb = types_pb2
    if obj is None:
        return pb.Value(none_value=pb.NoneValue())
    if isinstance(obj, bool):
        return pb.Value(bool_value=obj)
    if isinstance(obj, int):
        if not _INT64[0] <= obj <= _INT64[1]:
            raise InvalidArgument(f"cannot store {path}: {obj} does not fit in 64 bits")
        return pb.Value(int_value=obj)
    if isinstance(obj, float):
        return pb.Value(float_value=obj)
    if isinstance(obj, str):
        return pb.Value(string_value=obj)
    if isinstance(obj, (bytes, bytearray)):
        return pb.Value(bytes_value=bytes(obj))
    # Data, not code: kept as the objects torch.save would pickle (a complex, a device, a dtype).
    if isinstance(obj, complex):
        return pb.Value(opaque_value=pb.OpaqueObject(class_name="builtins.complex", args=pb.Value(
            tuple_value=pb.ValueList(items=[pb.Value(float_value=obj.real),
                                            pb.Value(float_value=obj.imag)]))))
    if isinstance(obj, torch.device):
        args = [pb.Value(string_value=obj.type)]
        if obj.index is not None:
            args.append(pb.Value(int_value=obj.index))
        return pb.Value(opaque_value=pb.OpaqueObject(
            class_name="torch.device", args=pb.Value(tuple_value=pb.ValueList(items=args))))
    if isinstance(obj, torch.dtype):
        return pb.Value(opaque_value=pb.OpaqueObject(class_name=str(obj)))
    if isinstance(obj, torch.Tensor):
        return pb.Value(tensor_value=pb.TensorRef(key=table.add(path, obj)))
    if isinstance(obj, (list, tuple)):
        items = [encode_value(item, f"{path}/{i}", table, types_pb2) for i, item in enumerate(obj)]
        if isinstance(obj, tuple):
            return pb.Value(tuple_value=pb.ValueList(items=items))
        return pb.Value(list_value=pb.ValueList(items=items))
    if isinstance(obj, dict):
        entries = []
        for key, item in obj.items():
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise InvalidArgument(f"cannot store {path}: its key {key!r} is a "
                                      f"{type(key).__name__}; ckpt keeps str and int keys")
            value = encode_value(item, f"{path}/{key}", table, types_pb2)
            entries.append(pb.DictEntry(int_key=key, value=value) if isinstance(key, int)
                           else pb.DictEntry(string_key=key, value=value))
        return pb.Value(dict_value=pb.ValueDict(
            entries=entries, ordered=isinstance(obj, collections.OrderedDict)))
    raise InvalidArgument(
        f"cannot store {path}: a {type(obj).__module__}.{type(obj).__qualname__}; ckpt stores "
        "tensors, numbers (complex too), strings, bytes, None, torch devices and dtypes, "
        "and lists, tuples and dicts of them, and never pickles (save what rebuilds it "
        "instead)")
