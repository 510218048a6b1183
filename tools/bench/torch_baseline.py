"""Python baseline of tools/bench: times torch.save and torch.load of one checkpoint, in-process.

Usage: torch_baseline.py INPUT.pt OUTPUT.pt RUNS

INPUT.pt is the benchmark's own workload, written once by the C++ benchmark with libs/format's
torch writer, so Python saves exactly the tensors the store saves (same keys, shapes, dtypes and
bytes). Loading INPUT is not timed. Each save is timed from torch.save to a completed os.fsync of
the file -- the same durability as the store's synced commit. Each load is timed from torch.load
until every tensor is in memory (torch.load copies every storage out of the zip file, so every
byte is touched). Prints one JSON object on the last line of stdout.
"""
import gc
import json
import os
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
    torch.set_num_threads(1)
    obj = torch.load(source)
    logical = tensor_bytes(obj)
    save_s = []
    for _ in range(runs):
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
    load_s = []
    loaded_bytes = 0
    for _ in range(runs):
        start = time.perf_counter()
        loaded = torch.load(target)
        load_s.append(time.perf_counter() - start)
        loaded_bytes = tensor_bytes(loaded)
        del loaded
        gc.collect()
    os.remove(target)
    print(json.dumps({"torch_version": torch.__version__, "logical_bytes": logical,
                      "loaded_bytes": loaded_bytes, "file_bytes": file_bytes,
                      "save_s": save_s, "load_s": load_s}))


if __name__ == "__main__":
    main()
