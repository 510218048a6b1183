"""R9's Python side (tools/bench): a team's model, and the plain PyTorch DDP loop it would train in.

  make DIR EXAMPLES   DIR/resnet18.ts: torchvision.models.resnet18(num_classes=10), seeded,
                      torch.jit.script'ed (state_dict keys as the extra file
                      state_dict_keys.txt), and DIR/shards/: EXAMPLES [3,32,32] float32 images
                      with int64 labels in 4 torch.save shards, for the C++ trainer.
  ddp DIR WARMUP STEPS BATCH THREADS
                      2 ranks (torch.multiprocessing, Gloo on 127.0.0.1), each with THREADS
                      intra-op threads: torchvision's resnet18(num_classes=10) in
                      torch.nn.parallel.DistributedDataParallel, AdamW(lr=1e-3), cross-entropy,
                      batches of BATCH per rank dealt by DistributedSampler from the shards' data
                      (in memory); WARMUP steps, a barrier, then STEPS timed steps. Prints
                      "samples_per_s X" (both ranks' samples over rank 0's time).
"""
import glob
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision

CLASSES = 10
SHARDS = 4


def make(out, examples):
    examples = int(examples)
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=CLASSES)
    torch.jit.script(model).save(os.path.join(out, "resnet18.ts"), _extra_files={
        "state_dict_keys.txt": "\n".join(model.state_dict().keys())})
    generator = torch.Generator().manual_seed(1)
    prototypes = torch.randn(CLASSES, 3, 32, 32, generator=generator)
    per_shard = (examples + SHARDS - 1) // SHARDS
    for shard in range(SHARDS):
        y = torch.randint(0, CLASSES, (per_shard,), generator=generator)
        x = prototypes[y] + torch.randn(per_shard, 3, 32, 32, generator=generator)
        torch.save({"x": x, "y": y}, os.path.join(out, "shards", "part-%d.pt" % shard))
    print("OK")


def rank_main(rank, world, port, out, warmup, steps, batch, threads, result):
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    parts = [torch.load(path) for path in sorted(glob.glob(os.path.join(out, "shards", "*.pt")))]
    x = torch.cat([p["x"] for p in parts])
    y = torch.cat([p["y"] for p in parts])
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torchvision.models.resnet18(num_classes=CLASSES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = torch.utils.data.DistributedSampler(range(len(y)), num_replicas=world, rank=rank,
                                                  shuffle=True, seed=0)
    indices = list(sampler)
    start = None
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        batch_indices = indices[(step * batch) % len(indices):][:batch]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[batch_indices]), y[batch_indices])
        loss.backward()
        optimizer.step()
        loss.item()
    dist.barrier()
    if rank == 0:
        result.put(steps * batch * world / (time.perf_counter() - start))
    dist.destroy_process_group()


def ddp(out, warmup, steps, batch, threads):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    result = context.SimpleQueue()
    mp.spawn(rank_main, args=(2, port, out, int(warmup), int(steps), int(batch), int(threads),
                              result), nprocs=2, join=True)
    print("samples_per_s %.3f" % result.get())


if __name__ == "__main__":
    {"make": make, "ddp": ddp}[sys.argv[1]](*sys.argv[2:])
