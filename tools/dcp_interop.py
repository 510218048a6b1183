"""PyTorch Distributed Checkpoint interop with a real torch >= 2.2 (the GPU machine's; Debian's
torch 1.13 has no torch.distributed.checkpoint.save), for tools/gpu_check.sh (g). No GPU needed.

  write DIR   DIR/one   dcp.save of {"model": {...}, "step": 5} in one process (no process group)
              DIR/two   dcp.save from two Gloo processes of {"w": a DTensor sharded by rows over
                        both ranks, "b": a replicated tensor}: each rank writes its own shard
              DIR/NAME.model.txt  the model state dict each holds ("key|dtype|shape|hex" lines),
                        as ckpt import takes it and ckpt export --format dcp writes it back
  load DIR    dcp.load of the directory into a state dict of zeros shaped by its metadata, printed
              as above (what ckpt exported, read by this torch)
Exits 3 when this torch cannot do it (too old), 0 otherwise.
"""
import os
import sys
import tempfile

import torch

try:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    dcp.save  # noqa: B018 -- 2.2+
except (ImportError, AttributeError) as error:
    print(f"torch {torch.__version__} has no torch.distributed.checkpoint.save: {error}")
    sys.exit(3)


def raw_bytes(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def describe(state):
    return "".join("|".join([key, str(value.dtype).replace("torch.", ""),
                             ",".join(str(d) for d in value.shape), raw_bytes(value).hex()]) + "\n"
                   for key, value in state.items())


def two_ranks(rank, out, rendezvous):
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=2)
    try:
        from torch.distributed.tensor import Shard, distribute_tensor  # 2.4+
    except ImportError:
        from torch.distributed._tensor import Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(11)  # the same full tensors on both ranks
    w, b = torch.randn(8, 4), torch.randn(4)
    state = {"w": distribute_tensor(w, mesh, [Shard(0)]), "b": b}
    dcp.save(state, checkpoint_id=os.path.join(out, "two"))
    if rank == 0:
        with open(os.path.join(out, "two.model.txt"), "w") as f:
            f.write(describe({"w": w, "b": b}))
    dist.destroy_process_group()


def write(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(7)
    model = {"fc.weight": torch.randn(3, 2), "fc.bias": torch.randn(3).double(),
             "embed.weight": torch.randn(2, 2).to(torch.bfloat16),
             "bn.num_batches_tracked": torch.tensor(4)}
    dcp.save({"model": model, "step": 5}, checkpoint_id=os.path.join(out, "one"))
    with open(os.path.join(out, "one.model.txt"), "w") as f:
        f.write(describe(model))
    with tempfile.TemporaryDirectory() as scratch:
        torch.multiprocessing.spawn(two_ranks, args=(out, os.path.join(scratch, "pg")), nprocs=2)


def load(directory):
    reader = dcp.FileSystemReader(directory)
    state = {key: torch.zeros(item.size, dtype=item.properties.dtype)
             for key, item in reader.read_metadata().state_dict_metadata.items()
             if isinstance(item, TensorStorageMetadata)}
    dcp.load(state, checkpoint_id=directory)
    sys.stdout.write(describe(state))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "load"):
        sys.exit(__doc__)
    (write if sys.argv[1] == "write" else load)(sys.argv[2])
