"""Independent safetensors peer for safetensors_test (real PyTorch, no safetensors package).

  write DIR   writes DIR/reference.safetensors following the spec and the reference writer's
              layout, and DIR/reference.txt describing every tensor (name|dtype|shape|hex bytes)
              plus metadata lines (META|key|value).
  check FILE  parses FILE by the spec, checks the layout rules, rebuilds each tensor with
              torch.frombuffer, and prints the same description lines to stdout.
"""
import json
import struct
import sys

import torch

DTYPES = {  # safetensors name -> (torch dtype, element size)
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
    "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1), "C64": (torch.complex64, 8),
}
NAME_OF = {dtype: name for name, (dtype, _) in DTYPES.items()}


def tensors():
    g = torch.Generator().manual_seed(7)
    return {
        "encoder.weight": torch.randn(3, 4, generator=g),
        "encoder.bias": torch.randn(4, generator=g).to(torch.float64),
        "head.weight": torch.randn(2, 3, generator=g).to(torch.bfloat16),
        "head.bias": torch.randn(2, generator=g).to(torch.float16),
        "bn.num_batches_tracked": torch.tensor(17, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "quant.codes": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "pixels": torch.arange(6, dtype=torch.uint8).reshape(2, 3),
        "ids": torch.tensor([1 << 20, -5], dtype=torch.int32),
        "empty": torch.zeros(0, 5),
        "phase": torch.tensor([1 + 2j, -0.5j], dtype=torch.complex64),
        "t.transposed": torch.randn(4, 3, generator=g).t(),  # Saved contiguous, as safetensors does.
    }


METADATA = {"format": "pt", "producer": "safetensors_fixture.py"}


def raw_bytes(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def describe(name, t):
    return "|".join([name, NAME_OF[t.dtype], ",".join(str(d) for d in t.shape), raw_bytes(t).hex()])


def write(directory):
    ts = tensors()
    order = sorted(ts, key=lambda n: (-DTYPES[NAME_OF[ts[n].dtype]][1], n))
    header = {"__metadata__": METADATA}
    offset = 0
    for name in order:
        size = len(raw_bytes(ts[name]))
        header[name] = {"dtype": NAME_OF[ts[name].dtype], "shape": list(ts[name].shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(f"{directory}/reference.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in order:
            f.write(raw_bytes(ts[name]))
    with open(f"{directory}/reference.txt", "w") as f:
        for name in order:
            f.write(describe(name, ts[name]) + "\n")
        for key, value in METADATA.items():
            f.write(f"META|{key}|{value}\n")


def check(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, f"header length {n} is not a multiple of 8"
    def unique(pairs):
        assert len({k for k, _ in pairs}) == len(pairs), "duplicate keys"
        return dict(pairs)

    header = json.loads(data[8:8 + n], object_pairs_hook=unique)
    keys = list(header)
    if "__metadata__" in header:
        assert keys[0] == "__metadata__", "metadata must come first"
    names = [k for k in keys if k != "__metadata__"]
    expected_order = sorted(names, key=lambda k: (-DTYPES[header[k]["dtype"]][1], k))
    assert names == expected_order, f"tensor order {names} != {expected_order}"
    buffer = data[8 + n:]
    offset = 0
    for name in names:
        info = header[name]
        begin, end = info["data_offsets"]
        assert begin == offset, f"{name}: begins at {begin}, expected {offset}"
        dtype, size = DTYPES[info["dtype"]]
        numel = 1
        for d in info["shape"]:
            numel *= d
        assert end - begin == numel * size, f"{name}: byte length mismatch"
        assert begin % size == 0, f"{name}: misaligned"
        chunk = buffer[begin:end]
        t = (torch.frombuffer(bytearray(chunk), dtype=dtype) if numel else torch.zeros(0, dtype=dtype))
        print(describe(name, t.reshape(info["shape"])))
        offset = end
    assert offset == len(buffer), "trailing or missing bytes"
    for key, value in header.get("__metadata__", {}).items():
        print(f"META|{key}|{value}")


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
