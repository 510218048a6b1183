"""Real PyTorch Distributed Checkpoint (DCP) directories, written by Debian's torch 1.13 with its
FileSystemWriter (torch.distributed._shard.checkpoint, the package torch 2.x keeps as an alias of
torch.distributed.checkpoint): a .metadata pickle and __R_I.distcp files of torch.save'd items.

  write DIR   DIR/plain    a flat state dict saved without a process group: tensors of several
                           dtypes and shapes (a 0-d one, an empty one), an int and bytes;
              DIR/sharded  a ShardedTensor of two row shards (one Gloo process holding both) and
                           a replicated tensor, saved with the process group;
              DIR/overlap  sharded's metadata with the second shard moved up a row, so two
                           shards claim row 1;
              DIR/hole     sharded's metadata without its second shard: rows 2-3 are nobody's;
              DIR/nofile   plain without one of its .distcp files;
              DIR/nested   a nested state dict ({"model": {...}, "optim": {...}, "epoch": 3}) as
                           torch 2.x writes one: its keys flattened ("model.fc.weight"),
                           planner_data mapping each back to its path, and its metadata under
                           2.x's module names (torch.distributed.checkpoint.*, with
                           Metadata.storage_meta). torch 1.13 cannot flatten, so the items are
                           written by its FileSystemWriter under the flat keys and the metadata
                           is then re-pickled as 2.x's;
              DIR/NAME.txt the state dict each good directory holds, a line per entry:
                           tensors "key|dtype|shape|hex bytes", others "key=repr".
  load DIR    loads the DCP directory DIR (ckpt's export, written as torch 2.x writes one) with
              torch 1.13's FileSystemReader and load_state_dict, as a state dict of its keys, and
              prints it as above. 1.13 knows 2.x's classes under its own module names, so those
              names are pointed at its classes first (the fields are the same).

  DIR         (the seed directory alone, as //libs/format/fuzz:dcp_fuzzer's regression runs it)
              fuzz seeds: plain and sharded, each written with one data file per rank, packed as
              dcp_fuzzer.cc reads its input (4-byte little-endian length, .metadata, the data).

Python 3.11 refuses torch 1.13's sharded-tensor dataclasses (a field whose default is a mutable
dataclass instance, allowed up to 3.10), so this script lets such defaults through as
default_factory copies before importing them: what they write is unchanged.
"""
import copy
import dataclasses
import os
import pickle
import shutil
import sys
import tempfile

_original_get_field = dataclasses._get_field


def _lenient_get_field(cls, name, type_, *args):
    default = cls.__dict__.get(name, dataclasses.MISSING)
    if isinstance(default, dataclasses.Field):
        value = default.default
        if value is not dataclasses.MISSING and type(value).__hash__ is None:
            default.default = dataclasses.MISSING
            default.default_factory = lambda v=value: copy.deepcopy(v)
    elif default is not dataclasses.MISSING and type(default).__hash__ is None:
        setattr(cls, name, dataclasses.field(default_factory=lambda v=default: copy.deepcopy(v)))
    return _original_get_field(cls, name, type_, *args)


dataclasses._get_field = _lenient_get_field

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402
from torch.distributed._shard.sharded_tensor import (  # noqa: E402
    Shard, ShardMetadata, init_from_local_shards)


def raw_bytes(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def describe(state):
    lines = []
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            lines.append("|".join([key, str(value.dtype).replace("torch.", ""),
                                   ",".join(str(d) for d in value.shape), raw_bytes(value).hex()]))
        else:
            lines.append(f"{key}={value!r}")
    return "\n".join(lines) + "\n"


def as_torch2(path, planner_data):
    """Re-pickles the metadata at `path` as torch 2.x names and lays it out: its classes under
    torch.distributed.checkpoint.metadata / .filesystem, planner_data, storage_meta."""
    import types
    import torch.distributed._shard.checkpoint.filesystem as fs1
    import torch.distributed._shard.checkpoint.metadata as md1
    import torch.distributed._shard.sharded_tensor.metadata as st1
    with open(path, "rb") as f:
        metadata = pickle.load(f)
    renamed = {"torch.distributed.checkpoint.metadata": [
        md1.Metadata, md1.TensorStorageMetadata, md1.BytesStorageMetadata,
        md1.ChunkStorageMetadata, md1.MetadataIndex, st1.TensorProperties],
        "torch.distributed.checkpoint.filesystem": [fs1._StorageInfo]}
    saved = {}
    for module_name, classes in renamed.items():
        module = sys.modules.setdefault(module_name, types.ModuleType(module_name))
        for cls in classes:
            saved[cls] = cls.__module__
            cls.__module__ = module_name
            setattr(module, cls.__name__, cls)
    metadata.planner_data = planner_data
    metadata.storage_meta = None
    try:
        with open(path, "wb") as f:
            pickle.dump(metadata, f)
    finally:
        for cls, module_name in saved.items():
            cls.__module__ = module_name


def write(out):
    torch.manual_seed(7)
    plain = {
        "fc.weight": torch.randn(4, 3),
        "fc.bias": torch.arange(4, dtype=torch.float64),
        "embed.weight": torch.randn(5, 2).to(torch.bfloat16),
        "bn.num_batches_tracked": torch.tensor(12),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 3, dtype=torch.int32),
        "step": 7,
        "tag": b"run-7",
    }
    dcp.save_state_dict(plain, dcp.FileSystemWriter(os.path.join(out, "plain")), no_dist=True)
    with open(os.path.join(out, "plain.txt"), "w") as f:
        f.write(describe(plain))

    with tempfile.TemporaryDirectory() as rendezvous:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(rendezvous, "pg"),
                                rank=0, world_size=1)
        table = torch.randn(4, 3)
        shards = [Shard(table[0:2].clone(), ShardMetadata([0, 0], [2, 3], "rank:0/cpu")),
                  Shard(table[2:4].clone(), ShardMetadata([2, 0], [2, 3], "rank:0/cpu"))]
        sharded = {"table": init_from_local_shards(shards, [4, 3]), "head": torch.randn(3)}
        dcp.save_state_dict(sharded, dcp.FileSystemWriter(os.path.join(out, "sharded")))
        dist.destroy_process_group()
    with open(os.path.join(out, "sharded.txt"), "w") as f:
        f.write(describe({"table": table, "head": sharded["head"]}))

    def tampered(name, change):
        shutil.copytree(os.path.join(out, "sharded"), os.path.join(out, name))
        path = os.path.join(out, name, ".metadata")
        with open(path, "rb") as f:
            metadata = pickle.load(f)
        change(metadata)
        with open(path, "wb") as f:
            pickle.dump(metadata, f)

    def overlap(metadata):
        chunk = metadata.state_dict_metadata["table"].chunks[1]
        old = chunk.offsets
        chunk.offsets = torch.Size([1, 0])
        for index in list(metadata.storage_data):
            if index.fqn == "table" and index.offset == old:
                info = metadata.storage_data.pop(index)
                metadata.storage_data[type(index)("table", chunk.offsets, index.index)] = info

    def hole(metadata):
        del metadata.state_dict_metadata["table"].chunks[1]

    # torch 2.x's layout of a nested state dict, which 1.13 cannot write itself (see above).
    # As get_state_dict gives it: optimizer state keyed by parameter name, param_groups a list
    # (torch's traversal writes dict keys as strings and list positions as ints).
    nested = {"model": {"fc.weight": torch.randn(2, 2), "fc.bias": torch.randn(2)},
              "optim": {"state": {"fc.weight": {"step": torch.tensor(5.0)}},
                        "param_groups": [{"lr": 0.1}]}, "epoch": 3}
    flat = {"model.fc.weight": nested["model"]["fc.weight"],
            "model.fc.bias": nested["model"]["fc.bias"],
            "optim.state.fc.weight.step": nested["optim"]["state"]["fc.weight"]["step"],
            "optim.param_groups.0.lr": 0.1, "epoch": 3}
    paths = {"model.fc.weight": ("model", "fc.weight"), "model.fc.bias": ("model", "fc.bias"),
             "optim.state.fc.weight.step": ("optim", "state", "fc.weight", "step"),
             "optim.param_groups.0.lr": ("optim", "param_groups", 0, "lr"),
             "epoch": ("epoch",)}
    dcp.save_state_dict(flat, dcp.FileSystemWriter(os.path.join(out, "nested")), no_dist=True)
    as_torch2(os.path.join(out, "nested", ".metadata"), paths)
    with open(os.path.join(out, "nested.txt"), "w") as f:
        f.write(describe(flat))

    tampered("overlap", overlap)
    tampered("hole", hole)
    shutil.copytree(os.path.join(out, "plain"), os.path.join(out, "nofile"))
    os.remove(os.path.join(out, "nofile", sorted(
        name for name in os.listdir(os.path.join(out, "nofile")) if name.endswith(".distcp"))[0]))


def load(directory):
    import types
    import torch.distributed._shard.checkpoint.filesystem as fs1
    import torch.distributed._shard.checkpoint.metadata as md1
    import torch.distributed._shard.sharded_tensor.metadata as st1
    md2 = types.ModuleType("torch.distributed.checkpoint.metadata")
    md2.__dict__.update({k: v for k, v in md1.__dict__.items() if not k.startswith("__")})
    md2.TensorProperties = st1.TensorProperties
    md2._MEM_FORMAT_ENCODING = st1.MEM_FORMAT_ENCODING
    fs2 = types.ModuleType("torch.distributed.checkpoint.filesystem")
    fs2._StorageInfo = fs1._StorageInfo
    sys.modules.setdefault("torch.distributed.checkpoint", types.ModuleType(
        "torch.distributed.checkpoint"))
    sys.modules["torch.distributed.checkpoint.metadata"] = md2
    sys.modules["torch.distributed.checkpoint.filesystem"] = fs2
    reader = dcp.FileSystemReader(directory)
    metadata = reader.read_metadata()
    state = {}
    for key, item in metadata.state_dict_metadata.items():
        if isinstance(item, md1.TensorStorageMetadata):
            state[key] = torch.zeros(item.size, dtype=item.properties.dtype)
        else:
            state[key] = None
    dcp.load_state_dict(state, reader, no_dist=True)
    sys.stdout.write(describe(state))


def seeds(out):
    import struct
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        torch.manual_seed(5)
        plain = {"fc.weight": torch.randn(3, 2), "fc.bias": torch.arange(3.0).double(),
                 "mask": torch.tensor([True, False]), "step": 7}
        dcp.save_state_dict(plain, dcp.FileSystemWriter(os.path.join(scratch, "plain"),
                                                        single_file_per_rank=True), no_dist=True)
        dist.init_process_group("gloo", init_method="file://" + os.path.join(scratch, "pg"),
                                rank=0, world_size=1)
        table = torch.randn(4, 3)
        shards = [Shard(table[0:2].clone(), ShardMetadata([0, 0], [2, 3], "rank:0/cpu")),
                  Shard(table[2:4].clone(), ShardMetadata([2, 0], [2, 3], "rank:0/cpu"))]
        dcp.save_state_dict({"table": init_from_local_shards(shards, [4, 3])},
                            dcp.FileSystemWriter(os.path.join(scratch, "sharded"),
                                                 single_file_per_rank=True))
        dist.destroy_process_group()
        for name in ("plain", "sharded"):
            directory = os.path.join(scratch, name)
            data = [f for f in os.listdir(directory) if f.endswith(".distcp")]
            assert data == ["__0_0.distcp"], data
            with open(os.path.join(directory, ".metadata"), "rb") as f:
                metadata = f.read()
            with open(os.path.join(directory, data[0]), "rb") as f:
                payload = f.read()
            with open(os.path.join(out, name + ".dcp"), "wb") as f:
                f.write(struct.pack("<I", len(metadata)) + metadata + payload)


if __name__ == "__main__":
    if len(sys.argv) == 2:
        seeds(sys.argv[1])
        sys.exit(0)
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "load"):
        sys.exit(__doc__)
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        load(sys.argv[2])
