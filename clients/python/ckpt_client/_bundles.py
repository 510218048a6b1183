"""What Client.save sends and what load_bundle restores around: the upload manifest of a training
bundle (model, optimizer, scheduler, epoch, step, extra), host snapshots, and the pickled objects
ckpt keeps as descriptions only."""
import collections
import inspect
from typing import Mapping

import torch

from ._tensors import describe_tensor, to_tensor
from ._values import Opaque, StateTensors, decode_value, encode_value
from .errors import FailedPrecondition, InvalidArgument


Bundle = collections.namedtuple(
    "Bundle", ["version", "model", "optimizer", "scheduler", "extra", "epoch", "step"],
    defaults=(0, 0), module="ckpt_client.client")
Bundle.__doc__ = """A stored training bundle (Client.load_bundle): the version number, the model's
state dict (canonical keys), the optimizer's and the scheduler's state dicts as their producer
saved them (None when the version holds none), ``extra``: everything else of the bundle
(epoch, step, RNG states, user entries; None when nothing), as plain Python values, and
``epoch`` and ``step``: the bundle's own "epoch" and "step" entries when it has them (what
save(epoch=, step=) and a torch.save dict with those keys hold), else the version's recorded
epoch and global step (the trainer's), 0 when the producer recorded none. So the usual resume
stays one line: ``start_epoch = client.load_bundle(ref, model, optimizer).epoch + 1``."""


def param_names_of(module, optimizer):
    """{optimizer parameter index: parameter name} when `module` is an nn.Module and
    `optimizer` a torch.optim object (torch numbers parameters in param_groups order); else
    None."""
    if not isinstance(module, torch.nn.Module) or not hasattr(optimizer, "param_groups"):
        return None
    names = {id(p): name for name, p in module.named_parameters()}
    result, index = {}, 0
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if id(parameter) in names:
                result[index] = names[id(parameter)]
            index += 1
    return result


def build_manifest(modules, dtypes, model_name, state, optimizer=None, scheduler=None,
                   epoch=None, step=None, extra=None, metrics=None, lineage=None,
                   param_names=None):
    """The Manifest of an upload of `state` (an nn.Module or a state dict) and the tensors in
    TensorData order (model, then state tensors). Keys stay the producer's: the store normalizes
    them (UploadHeader.normalize_keys). Arguments as Client.save; `modules` the generated ckpt.v1
    modules, `dtypes` torch_dtypes()."""
    types = modules.types_pb2
    pb = modules.checkpoint_store_pb2
    weights = state.state_dict() if isinstance(state, torch.nn.Module) else state
    if not isinstance(weights, Mapping):
        raise InvalidArgument("state must be an nn.Module or a state dict (a mapping of "
                              f"key -> tensor), not a {type(state).__name__}")
    manifest = pb.Manifest(model=model_name)
    tensors = []
    for key, tensor in weights.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            raise InvalidArgument(
                f"cannot store state['{key}']: the model's state dict holds tensors under "
                f"str keys (got a {type(tensor).__name__}); put other values in extra")
        manifest.tensors.append(describe_tensor(key, tensor, types, dtypes))
        tensors.append(tensor)
    table = StateTensors(lambda key, t: describe_tensor(key, t, types, dtypes))
    layout = types.BundleLayout()
    root = collections.OrderedDict()
    position = 1  # the model sits at 0

    def part(value, name, field, enum):
        nonlocal position
        if value is None:
            return
        if hasattr(value, "state_dict") and callable(value.state_dict):
            value = value.state_dict()
        if name == "scheduler" and isinstance(value, Mapping):
            # Some schedulers' state dicts hold their own bound methods (OneCycleLR's
            # anneal_func in torch < 2.2), which torch.save pickles by reference. They are the
            # scheduler's behaviour, which its constructor rebuilds (load_bundle keeps the
            # restored scheduler's own); ckpt never pickles, so they are left out.
            value = {key: item for key, item in value.items() if not inspect.ismethod(item)}
        getattr(manifest, field).CopyFrom(encode_value(value, name, table, types))
        layout.placements.add(part=enum, path=[types.PathKey(string_key=name)],
                              position=position)
        position += 1

    part(optimizer, "optimizer", "optimizer_state", types.BundleLayout.PART_OPTIMIZER)
    part(scheduler, "scheduler", "scheduler_state", types.BundleLayout.PART_SCHEDULER)
    if epoch is not None:
        root["epoch"] = epoch
        manifest.metadata.epoch = epoch
    if step is not None:
        root["step"] = step
        manifest.metadata.global_step = step
    for key, value in (extra or {}).items():
        if key in ("model", "optimizer", "scheduler", "epoch", "step"):
            raise InvalidArgument(f"extra['{key}'] would hide the bundle's own '{key}'")
        root[key] = value
    if len(layout.placements) > 0 or root:
        layout.placements.add(part=types.BundleLayout.PART_MODEL,
                              path=[types.PathKey(string_key="model")], position=0)
        manifest.extra_state.CopyFrom(encode_value(dict(root), "extra", table, types))
        manifest.bundle_layout.CopyFrom(layout)
    for index, name in (param_names or {}).items():
        manifest.optimizer_param_names[index] = name
    manifest.state_tensors.extend(table.metas)
    tensors.extend(table.tensors)
    metadata = manifest.metadata
    metadata.source_format = "python_client"
    for name, value in (metrics or {}).items():
        metadata.metrics[name] = float(value)
    for field, value in (lineage or {}).items():
        if field == "producer_info":
            metadata.lineage.producer_info.update({str(k): str(v) for k, v in value.items()})
        elif field in ("run_id", "parent", "parent_relation", "code_revision", "dataset"):
            setattr(metadata.lineage, field, str(value))
        else:
            raise InvalidArgument(f"lineage has no field '{field}' (run_id, parent, "
                                  "parent_relation, code_revision, dataset, producer_info)")
    return manifest, tensors


def restore_bundle(manifest, buffers, dtypes, model, optimizer, scheduler, strict):
    """The Bundle of a Download with its state (`buffers` by TensorData index), restored into
    `model`, `optimizer` and `scheduler` where given (Client.load_bundle)."""
    weights = collections.OrderedDict()
    state_tensors = {}
    for index, buffer in buffers.items():
        if index < len(manifest.tensors):
            meta = manifest.tensors[index]
            weights[meta.key] = to_tensor(meta, buffer, dtypes)
        else:
            meta = manifest.state_tensors[index - len(manifest.tensors)]
            state_tensors[meta.key] = to_tensor(meta, buffer, dtypes)

    def state(field):
        if not manifest.HasField(field):
            return None
        return decode_value(getattr(manifest, field), state_tensors)

    extra = state("extra_state")

    def counter(name, recorded):
        value = extra.get(name) if isinstance(extra, Mapping) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else recorded

    bundle = Bundle(manifest.version, weights, state("optimizer_state"),
                    state("scheduler_state"), extra,
                    counter("epoch", manifest.metadata.epoch),
                    counter("step", manifest.metadata.global_step))
    where = f"{manifest.model}@{manifest.version}"
    for target, held, what in ((optimizer, bundle.optimizer, "optimizer"),
                               (scheduler, bundle.scheduler, "scheduler")):
        if target is not None and held is None:
            raise FailedPrecondition(f"{where} holds no {what} state to restore")
    if model is not None:
        unwrap(model).load_state_dict(weights, strict=strict)
    if optimizer is not None:
        opaque = opaque_paths(bundle.optimizer, "optimizer")
        if opaque:
            raise FailedPrecondition(
                f"{where}: the optimizer state holds pickled objects ckpt does not rebuild "
                f"(it runs no pickled code): {', '.join(opaque)}")
        optimizer.load_state_dict(bundle.optimizer)
    if scheduler is not None:
        # A scheduler's state dict may hold what its constructor made (OneCycleLR's
        # anneal_func, a bound method pickled by reference): torch.load would run the pickle
        # to rebuild it, ckpt never does. The scheduler made here already holds its own, so
        # such entries are left as they are and every plain value is restored.
        scheduler.load_state_dict(
            {key: value for key, value in bundle.scheduler.items()
             if not opaque_paths(value, key)})
    return bundle


def unwrap(module):
    """The module inside DistributedDataParallel, DataParallel and torch.compile wrappers, whose
    state dict keys are the canonical ones the store keeps ("0.weight", not "module.0.weight")."""
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    while True:
        if isinstance(module, wrappers):
            module = module.module
        elif isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):
            module = module._orig_mod  # torch.compile's OptimizedModule (PyTorch >= 2.0)
        else:
            return module


class HostSnapshot:
    """Copies of a state's tensors in host memory that reuse the buffers of the previous copy
    (the tensor at the same place in the traversal, of the same shape and dtype): a loop that
    saves every N steps copies into memory already faulted in instead of allocating a new copy
    each time, which on a fresh page costs far more than the copy (save_async). take() must not
    be called while the previous snapshot is still read."""

    def __init__(self):
        self._buffers = []

    def take(self, value):
        """`value` with every tensor copied to host memory (a copy even of a CPU tensor, so the
        caller may change its own at once); containers rebuilt, everything else as it is."""
        previous, self._buffers = iter(self._buffers), []
        return self._copy(value, previous)

    def _copy(self, value, previous):
        if isinstance(value, torch.Tensor):
            source = value.detach()
            buffer = next(previous, None)
            if (buffer is not None and buffer.shape == source.shape
                    and buffer.dtype == source.dtype and source.layout == torch.strided
                    and not source.is_quantized):
                buffer.copy_(source)
            else:
                buffer = source.to("cpu", copy=True)
            self._buffers.append(buffer)
            return buffer
        if isinstance(value, dict):
            copied = collections.OrderedDict() if isinstance(value, collections.OrderedDict) else {}
            for key, item in value.items():
                copied[key] = self._copy(item, previous)
            return copied
        if isinstance(value, (list, tuple)):
            items = [self._copy(item, previous) for item in value]
            return items if isinstance(value, list) else tuple(items)
        return value


def opaque_paths(value, path):
    """Where in `value` an Opaque (a pickled object kept as a description) sits: ["a.b", ...]."""
    if isinstance(value, Opaque):
        return [path]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in opaque_paths(item, f"{path}.{key}")]
    if isinstance(value, (list, tuple)):
        return [p for i, item in enumerate(value) for p in opaque_paths(item, f"{path}[{i}]")]
    return []
