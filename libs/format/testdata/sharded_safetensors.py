"""Independent peer for Hugging Face's sharded safetensors layout (real PyTorch; the safetensors
package is not installed, so files are parsed and written by the spec: 8-byte little-endian
header length, JSON header, data).

  write DIR         writes sharded sets under DIR, split with huggingface_hub's algorithm:
                    DIR/good (3 shards + index), and broken copies of it: DIR/missing (a shard
                    deleted), DIR/twice (a tensor in two shards), DIR/lacks (the weight_map names
                    a tensor its shard lacks); DIR/good.txt describes every tensor
                    (name|dtype|shape|hex bytes).
  check DIR MAX K,K..  checks DIR is what transformers' save_pretrained writes for tensors in
                    the order K,K.. and max_shard_size MAX bytes: the shard names, the split, the
                    index (total_size, weight_map, sorted keys), every shard by the spec; prints
                    the same description lines, then one "SHARD file key,key.." line per shard.
"""
import json
import os
import shutil
import struct
import sys

import torch

DTYPES = {  # safetensors name -> (torch dtype, element size)
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
    "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1), "BOOL": (torch.bool, 1),
}
NAME_OF = {dtype: name for name, (dtype, _) in DTYPES.items()}
INDEX = "model.safetensors.index.json"


def raw_bytes(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def describe(name, t):
    return "|".join([name, NAME_OF[t.dtype], ",".join(str(d) for d in t.shape), raw_bytes(t).hex()])


def split(sizes, max_shard_size):
    """huggingface_hub.split_torch_state_dict_into_shards (storage sharing aside)."""
    shards, current, current_size = [], [], 0
    for key, size in sizes:
        if size > max_shard_size:
            shards.append([key])
            continue
        if current_size + size > max_shard_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(key)
        current_size += size
    if current:
        shards.append(current)
    return shards


def shard_name(i, n):
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def write_file(path, tensors):
    order = sorted(tensors, key=lambda n: (-DTYPES[NAME_OF[tensors[n].dtype]][1], n))
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in order:
        size = len(raw_bytes(tensors[name]))
        header[name] = {"dtype": NAME_OF[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in order:
            f.write(raw_bytes(tensors[name]))


def write_set(directory, tensors, max_shard_size):
    os.makedirs(directory, exist_ok=True)
    shards = split([(k, len(raw_bytes(t))) for k, t in tensors.items()], max_shard_size)
    weight_map = {}
    for i, keys in enumerate(shards, 1):
        name = shard_name(i, len(shards))
        write_file(os.path.join(directory, name), {k: tensors[k] for k in keys})
        weight_map.update({k: name for k in keys})
    total = sum(len(raw_bytes(t)) for t in tensors.values())
    with open(os.path.join(directory, INDEX), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                           indent=2, sort_keys=True) + "\n")
    return shards


def write(directory):
    g = torch.Generator().manual_seed(11)
    tensors = {
        "embed.weight": torch.randn(4, 8, generator=g),         # 128 bytes: a shard of its own
        "layers.0.weight": torch.randn(3, 3, generator=g),      # 36
        "layers.0.bias": torch.randn(3, generator=g).half(),    # 6
        "layers.1.weight": torch.randn(2, 5, generator=g).to(torch.bfloat16),  # 20
        "layers.1.steps": torch.tensor(9, dtype=torch.int64),   # 8
        "head.mask": torch.tensor([True, False]),               # 2
        "head.bias": torch.randn(6, generator=g).double(),      # 48
    }
    good = os.path.join(directory, "good")
    shards = write_set(good, tensors, 64)
    assert len(shards) >= 3, shards
    with open(os.path.join(directory, "good.txt"), "w") as f:
        for name, t in tensors.items():
            f.write(describe(name, t) + "\n")
    n = len(shards)

    missing = os.path.join(directory, "missing")
    shutil.copytree(good, missing)
    os.remove(os.path.join(missing, shard_name(2, n)))

    # layers.0.bias also written into the last shard (the index still maps it to its own).
    twice = os.path.join(directory, "twice")
    shutil.copytree(good, twice)
    last = [k for k in shards[-1]] + ["layers.0.bias"]
    if "layers.0.bias" in shards[-1]:
        last = shards[-1] + ["embed.weight"]
    write_file(os.path.join(twice, shard_name(n, n)), {k: tensors[k] for k in last})

    # The weight_map names a tensor in a shard that does not hold it.
    lacks = os.path.join(directory, "lacks")
    shutil.copytree(good, lacks)
    with open(os.path.join(lacks, INDEX)) as f:
        index = json.load(f)
    index["weight_map"]["extra.weight"] = shard_name(1, n)
    with open(os.path.join(lacks, INDEX), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)


def read_file(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, f"{path}: header length {n} is not a multiple of 8"
    header = json.loads(data[8:8 + n])
    buffer = data[8 + n:]
    out, offset = {}, 0
    names = [k for k in header if k != "__metadata__"]
    for name in sorted(names, key=lambda k: header[k]["data_offsets"][0]):
        info = header[name]
        begin, end = info["data_offsets"]
        assert begin == offset, f"{path}: {name} begins at {begin}, expected {offset}"
        dtype, size = DTYPES[info["dtype"]]
        numel = 1
        for d in info["shape"]:
            numel *= d
        assert end - begin == numel * size, f"{path}: {name}: byte length"
        chunk = buffer[begin:end]
        t = torch.frombuffer(bytearray(chunk), dtype=dtype) if numel else torch.zeros(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
        offset = end
    assert offset == len(buffer), f"{path}: trailing or missing bytes"
    assert header.get("__metadata__", {}).get("format") == "pt", f"{path}: metadata"
    return out


def check(directory, max_shard_size, keys):
    max_shard_size = int(max_shard_size)
    keys = keys.split(",")
    text = open(os.path.join(directory, INDEX)).read()
    index = json.loads(text)
    assert text == json.dumps(index, indent=2, sort_keys=True) + "\n", "index not as transformers writes it"
    weight_map = index["weight_map"]
    assert sorted(weight_map) == sorted(keys), (sorted(weight_map), sorted(keys))
    files = sorted(set(weight_map.values()))
    n = len(files)
    assert files == [shard_name(i, n) for i in range(1, n + 1)], files
    assert not os.path.exists(os.path.join(directory, "model.safetensors")), "stale single file"
    tensors, by_shard = {}, {}
    for name in files:
        shard = read_file(os.path.join(directory, name))
        by_shard[name] = list(shard)
        for key, t in shard.items():
            assert key not in tensors, f"{key} in two shards"
            assert weight_map[key] == name, f"{key} is in {name}, the index says {weight_map[key]}"
            tensors[key] = t
    assert sorted(tensors) == sorted(keys)
    total = sum(len(raw_bytes(t)) for t in tensors.values())
    assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    expected = split([(k, len(raw_bytes(tensors[k]))) for k in keys], max_shard_size)
    got = [sorted(by_shard[shard_name(i, n)]) for i in range(1, n + 1)]
    assert got == [sorted(s) for s in expected], f"split {got}, huggingface_hub's {expected}"
    for key in keys:
        print(describe(key, tensors[key]))
    for i in range(1, n + 1):
        print("SHARD", shard_name(i, n), ",".join(sorted(by_shard[shard_name(i, n)])))


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](*sys.argv[2:])
