"""Python baseline of tools/bench: times torch.save and torch.load of one checkpoint, in-process.

Usage: torch_baseline.py INPUT.pt OUTPUT.pt RUNS warm|cold save|nosave

INPUT.pt is the benchmark's own workload, written once by the C++ benchmark with libs/format's
torch writer, so Python saves exactly the tensors the store saves (same keys, shapes, dtypes and
bytes). Loading INPUT is not timed. Each save is timed from torch.save to a completed os.fsync of
the file -- the same durability as the store's synced commit. Each load is timed from torch.load
until every tensor is in memory (torch.load copies every storage out of the zip file, so every
byte is touched). Prints one JSON object on the last line of stdout.

The memory regime of the loads is set by the caller through glibc's malloc (the C++ benchmark
starts this script with MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ set): *warm* keeps freed
tensor memory in the heap and loads once untimed first, so every timed load lands in memory the
process has already faulted in; *cold* gives every storage a fresh mapping and unmaps it when
freed, so every timed load faults its memory in. Minor page faults of each timed load are printed
(load_minflt) so the caller can check which regime a load really ran in. With `nosave`, OUTPUT.pt
must already hold Python's own save (a previous `save` run leaves it in place).
"""
import gc
import json
import os
import resource
import sys
import time

import torch


def tensor_bytes(obj):
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def main():
    source, target, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    regime, save = sys.argv[4], sys.argv[5] == "save"
    if regime not in ("warm", "cold"):
        sys.exit("regime must be warm or cold, got " + regime)
    torch.set_num_threads(1)
    logical = 0
    save_s = []
    obj = torch.load(source) if save else None
    if save:
        logical = tensor_bytes(obj)
    for _ in range(runs if save else 0):
        if os.path.exists(target):
            os.remove(target)
        start = time.perf_counter()
        with open(target, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        save_s.append(time.perf_counter() - start)
    file_bytes = os.path.getsize(target)
    # Free the saved object so the loads below measure one checkpoint in memory, not two.
    del obj
    gc.collect()
    if regime == "warm":  # faults the heap in; the timed loads reuse it.
        warmup = torch.load(target)
        del warmup
        gc.collect()
    load_s = []
    load_minflt = []
    loaded_bytes = 0
    for _ in range(runs):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        loaded = torch.load(target)
        load_s.append(time.perf_counter() - start)
        load_minflt.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
        loaded_bytes = tensor_bytes(loaded)
        del loaded
        gc.collect()
    print(json.dumps({"torch_version": torch.__version__, "logical_bytes": logical,
                      "loaded_bytes": loaded_bytes, "file_bytes": file_bytes,
                      "save_s": save_s, "load_s": load_s, "load_minflt": load_minflt}))


if __name__ == "__main__":
    main()
