"""Prints torch.utils.data.DistributedSampler's indices for each config and rank.

Usage: distributed_sampler_reference.py N,WORLD,SHUFFLE,SEED,EPOCH,DROP_LAST[,B1+B2+...] ...
With block sizes, the order is the block-by-block shuffle DistributedSampler::set_block_sizes
documents, dealt to the ranks by an unshuffled DistributedSampler over positions.
Output, one line per (config, rank): "CONFIG RANK: i0 i1 ..." (CONFIG counts from 0).
"""

import sys

import torch
from torch.utils.data import DistributedSampler


def block_order(sizes, seed, epoch):
    generator = torch.Generator().manual_seed(seed + epoch)
    starts = [sum(sizes[:b]) for b in range(len(sizes))]
    order = []
    for b in torch.randperm(len(sizes), generator=generator).tolist():
        order += (torch.randperm(sizes[b], generator=generator) + starts[b]).tolist()
    return order


def main(configs):
    for config_index, config in enumerate(configs):
        fields = config.split(",")
        n, world, shuffle, seed, epoch, drop_last = (int(v) for v in fields[:6])
        blocks = [int(b) for b in fields[6].split("+")] if len(fields) > 6 else None
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank,
                                         shuffle=bool(shuffle) and blocks is None, seed=seed,
                                         drop_last=bool(drop_last))
            sampler.set_epoch(epoch)
            indices = list(sampler)
            if blocks is not None and shuffle:
                order = block_order(blocks, seed, epoch)
                indices = [order[p] for p in indices]
            assert len(indices) == len(sampler) == sampler.num_samples
            print(f"{config_index} {rank}: " + " ".join(str(i) for i in indices))


if __name__ == "__main__":
    main(sys.argv[1:])
