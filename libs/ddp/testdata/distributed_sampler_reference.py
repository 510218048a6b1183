"""Prints torch.utils.data.DistributedSampler's indices for each config and rank.

Usage: distributed_sampler_reference.py N,WORLD,SHUFFLE,SEED,EPOCH,DROP_LAST ...
Output, one line per (config, rank): "CONFIG RANK: i0 i1 ..." (CONFIG counts from 0).
"""

import sys

from torch.utils.data import DistributedSampler


def main(configs):
    for config_index, config in enumerate(configs):
        n, world, shuffle, seed, epoch, drop_last = (int(v) for v in config.split(","))
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank,
                                         shuffle=bool(shuffle), seed=seed,
                                         drop_last=bool(drop_last))
            sampler.set_epoch(epoch)
            indices = list(sampler)
            assert len(indices) == len(sampler) == sampler.num_samples
            print(f"{config_index} {rank}: " + " ".join(str(i) for i in indices))


if __name__ == "__main__":
    main(sys.argv[1:])
