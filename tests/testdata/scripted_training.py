"""Real PyTorch (1.13) on both ends of a scripted model trained by //services/trainer
(tests/scripted_training_test).

  make DIR      writes the team's side: DIR/net.ts (Net below, torch.jit.script'ed, with its
                state_dict keys as the extra file state_dict_keys.txt), DIR/init.pt (Net's initial
                state_dict), DIR/data.pt ({'x': [96,1,8,8] float32, 'y': int64 in [0,5)}), and
                the bad modules: vector_loss.ts (loss() returns one value per example),
                flat_input.ts (expects [N, 10] inputs), noparams.ts, nan_after.ts (its loss
                turns NaN at the 9th training call), weights.pt (a torch.save state dict), and
                DIR/shards/: data.pt's examples in four shards of 30, 30, 20 and 16
                (part-0.pt, part-1.pt, part-2.pth by torch.save; part-3.safetensors by the
                format's spec, as the safetensors package writes it).
  check DIR BUNDLE OPTIMIZER SCHEDULER STEPS WORLD BATCH [shards]
                trains Net in a plain Python loop from init.pt over the batches the C++ trainer
                took (DistributedSampler order, or with `shards` the shard-by-shard shuffle
                --data=shards: documents, WORLD ranks of BATCH each; with WORLD 2 the full
                batch with each rank's half through BatchNorm on its own, as DDP does, and rank
                0's running statistics kept), then loads BUNDLE (`ckpt export --bundle` of the
                trainer's final version) into a fresh Net with load_state_dict(strict=True) and
                into the matching torch.optim optimizer and scheduler, compares parameters,
                buffers and optimizer state with its own, trains both 3 more steps and compares
                again. Prints the largest differences, whether they are bit-equal, and OK.

The trainer's flags that match: --lr=0.05 --weight_decay=0.01 --momentum=0.9 --clip_grad_norm=1
--seed=1234, --scheduler=step --step_size=7 --gamma=0.5, or --scheduler=cosine --warmup_steps=5.
"""
import json
import math
import os
import struct
import sys

import torch
from torch import nn
import torch.nn.functional as F

SEED = 1234
LR = 0.05
WEIGHT_DECAY = 0.01
MOMENTUM = 0.9
STEP_SIZE, GAMMA = 7, 0.5
WARMUP = 5
EXAMPLES, CLASSES = 96, 5
SHARDS = [30, 30, 20, 16]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.drop = nn.Dropout(p=0.0)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, x):
        x = self.drop(F.relu(self.bn(self.conv(x))))
        return self.head(x.mean((2, 3)))

    @torch.jit.export
    def loss(self, inputs, targets):
        return F.cross_entropy(self.forward(inputs), targets)


class VectorLoss(Net):
    @torch.jit.export
    def loss(self, inputs, targets):
        return F.cross_entropy(self.forward(inputs), targets, reduction="none")


class FlatInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, CLASSES)

    def forward(self, x):
        return self.fc(x)


class NoParams(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :5]


class NanAfter(Net):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    @torch.jit.export
    def loss(self, inputs, targets):
        value = F.cross_entropy(self.forward(inputs), targets)
        if self.training:
            self.calls += 1
            if int(self.calls) >= 9:
                return value * float("nan")
        return value


def make(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    net = Net()
    torch.save(net.state_dict(), os.path.join(out, "init.pt"))
    keys = "\n".join(net.state_dict().keys())
    torch.jit.script(net).save(os.path.join(out, "net.ts"),
                               _extra_files={"state_dict_keys.txt": keys})
    generator = torch.Generator().manual_seed(7)
    y = torch.randint(0, CLASSES, (EXAMPLES,), generator=generator)
    prototypes = torch.randn(CLASSES, 1, 8, 8, generator=generator)
    x = prototypes[y] + 0.5 * torch.randn(EXAMPLES, 1, 8, 8, generator=generator)
    torch.save({"x": x, "y": y}, os.path.join(out, "data.pt"))
    torch.jit.script(VectorLoss()).save(os.path.join(out, "vector_loss.ts"))
    torch.jit.script(FlatInput()).save(os.path.join(out, "flat_input.ts"))
    torch.jit.script(NoParams()).save(os.path.join(out, "noparams.ts"))
    torch.jit.script(NanAfter()).save(os.path.join(out, "nan_after.ts"))
    torch.save(net.state_dict(), os.path.join(out, "weights.pt"))
    shards = os.path.join(out, "shards")
    os.makedirs(shards, exist_ok=True)
    names = ["part-0.pt", "part-1.pt", "part-2.pth", "part-3.safetensors"]
    start = 0
    for name, size in zip(names, SHARDS):
        part = {"x": x[start:start + size].clone(), "y": y[start:start + size].clone()}
        if name.endswith(".safetensors"):
            write_safetensors(os.path.join(shards, name), part)
        else:
            torch.save(part, os.path.join(shards, name))
        start += size
    print("OK")


def write_safetensors(path, tensors):
    """safetensors' layout: u64 header length, JSON header, the tensors' little-endian bytes."""
    names = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for key, tensor in tensors.items():
        blob = bytes(tensor.contiguous().reshape(-1).view(torch.uint8).tolist())  # no numpy needed
        header[key] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape),
                       "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def cosine_factor(epoch, total):
    if epoch < WARMUP:
        return epoch / WARMUP
    progress = min(1.0, (epoch - WARMUP) / max(1, total - WARMUP))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_training(model, optimizer_kind, scheduler_kind, total):
    if optimizer_kind == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                                    weight_decay=WEIGHT_DECAY)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    if scheduler_kind == "step":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda epoch: cosine_factor(epoch, total))
    return optimizer, scheduler


def shard_order(epoch):
    """--data=shards:'s epoch order: the shards in a random order, each shuffled on its own."""
    generator = torch.Generator().manual_seed(SEED + epoch)
    starts = [sum(SHARDS[:b]) for b in range(len(SHARDS))]
    order = []
    for b in torch.randperm(len(SHARDS), generator=generator).tolist():
        order += (torch.randperm(SHARDS[b], generator=generator) + starts[b]).tolist()
    return order


def batch_order(world, batch, steps, shards=False):
    """The indices each rank trains on at each step, as the trainer's DistributedSampler deals."""
    samplers = [torch.utils.data.DistributedSampler(range(EXAMPLES), num_replicas=world, rank=r,
                                                    shuffle=not shards, seed=SEED)
                for r in range(world)]
    order, epoch = [], 0
    while len(order) < steps:
        per_rank = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            indices = list(sampler)
            if shards:  # the same dealing of positions in the shard-by-shard order
                epoch_order = shard_order(epoch)
                indices = [epoch_order[p] for p in indices]
            per_rank.append([indices[i:i + batch] for i in range(0, len(indices), batch)])
        order.extend(zip(*per_rank))
        epoch += 1
    return order[:steps]


def train_step(model, optimizer, scheduler, x, y, chunks):
    model.train()
    optimizer.zero_grad()
    originals = dict(model.named_buffers())
    losses = []
    # Under DDP every rank's forward starts from rank 0's buffers and only rank 0's updates
    # survive the next broadcast: the other ranks' halves run on copies that are dropped. (Copies
    # swapped in, not restored in place: BatchNorm's backward checks its buffers' versions.)
    # Rank 0 last, so that the module is left holding its buffers.
    for rank in reversed(range(len(chunks))):
        for name, buffer in originals.items():
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner) if owner else model
            setattr(module, leaf, buffer if rank == 0 else buffer.clone())
        losses.append(model.loss(x[chunks[rank]], y[chunks[rank]]))
    loss = sum(losses) / len(losses)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    return loss.item()


def compare(name, ours, theirs, report):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (name, ours, theirs)
    if ours.dtype.is_floating_point:
        scale = theirs.abs().max().item() or 1.0
        report.append(((ours - theirs).abs().max().item() / scale, name))
    else:
        assert torch.equal(ours, theirs), (name, ours, theirs)


def check(out, bundle_path, optimizer_kind, scheduler_kind, steps, world, batch, data="pt"):
    steps, world, batch = int(steps), int(world), int(batch)
    shards = data == "shards"
    torch.set_num_threads(1)
    data = torch.load(os.path.join(out, "data.pt"))
    x, y = data["x"], data["y"]
    model = Net()
    model.load_state_dict(torch.load(os.path.join(out, "init.pt")), strict=True)
    optimizer, scheduler = make_training(model, optimizer_kind, scheduler_kind, steps)
    for chunks in batch_order(world, batch, steps, shards):
        train_step(model, optimizer, scheduler, x, y, list(chunks))

    bundle = torch.load(bundle_path)
    assert bundle["global_step"] == steps, bundle["global_step"]
    resumed = Net()
    resumed.load_state_dict(bundle["model"], strict=True)
    resumed_optimizer, resumed_scheduler = make_training(resumed, optimizer_kind, scheduler_kind,
                                                         steps)
    resumed_optimizer.load_state_dict(bundle["optimizer"])
    resumed_scheduler.load_state_dict(bundle["scheduler"])
    assert resumed_scheduler.get_last_lr() == scheduler.get_last_lr(), (
        resumed_scheduler.get_last_lr(), scheduler.get_last_lr())

    def differences(tag):
        report = []
        for (name, a), (_, b) in zip(resumed.state_dict().items(), model.state_dict().items()):
            compare("%s model %s" % (tag, name), a, b, report)
        ours, theirs = resumed_optimizer.state_dict(), optimizer.state_dict()
        assert ours["state"].keys() == theirs["state"].keys()
        for pid in theirs["state"]:
            for key, value in theirs["state"][pid].items():
                mine = ours["state"][pid][key]
                if torch.is_tensor(value):
                    compare("%s optimizer %d %s" % (tag, pid, key), mine.to(value.dtype), value,
                            report)
                else:
                    assert mine == value, (pid, key, mine, value)
        worst = max(report)
        exact = all(r == 0 for r, _ in report)
        print("%s: largest relative difference %.3g (%s), bit-equal: %s" % (
            tag, worst[0], worst[1], exact))
        return worst[0]

    at_export = differences("exported")
    # Python training resumes from the bundle: 3 more steps on both sides.
    for chunks in batch_order(1, batch * world, 3):
        chunk = [list(chunks[0])]
        train_step(model, optimizer, scheduler, x, y, chunk)
        train_step(resumed, resumed_optimizer, resumed_scheduler, x, y, chunk)
    after_resume = differences("after 3 resumed steps")
    print("MAXDIFF %.6g %.6g" % (at_export, after_resume))
    print("OK")


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](*sys.argv[2:])
