"""Real PyTorch reads files written by ckpt's torch writer (torch_writer_test).

  describe FILE  torch.load(FILE, weights_only=True); prints one line per tensor
                 (key|dtype|shape|hex), PARAM lines for nn.Parameters, SHARED lines for tensors
                 that share storage, and the container type.
  bundle FILE    checks every global in data.pkl is one weights_only allows, loads the file and
                 asserts the bundle torch_writer_test wrote, value by value; prints OK.
  zip FILE       checks the zip with Python's zipfile (CRCs) and that every data record starts on
                 a 64-byte boundary; prints OK.
  plain FILE     torch.load(FILE): key|type|repr of each entry (complex, torch.device, dtype).
  quantized FILE torch.load(FILE) (torch 1.13's weights_only refuses quantized files); one line
                 per quantized tensor: key|dtype|shape|qscheme|params|int_repr hex, the params
                 as hex (scale: float64, zero point: int64; per channel: the scales and zero
                 points tensors' bytes, then the axis).
"""
import io
import math
import pickletools
import struct
import sys
import zipfile

import torch

ALLOWED_GLOBALS = {
    "collections OrderedDict",
    "torch._utils _rebuild_tensor_v2",
    "torch._utils _rebuild_parameter",
} | {f"torch {name}" for name in [
    "FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage", "ByteStorage", "CharStorage",
    "ShortStorage", "IntStorage", "LongStorage", "BoolStorage", "ComplexFloatStorage",
    "ComplexDoubleStorage", "ComplexHalfStorage"]}


def raw_hex(t):
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes().hex() if t.numel() else ""


def describe(path):
    sd = torch.load(path, weights_only=True)
    print("TYPE", type(sd).__name__)
    seen = {}
    for key, t in sd.items():
        print("|".join([key, str(t.dtype), ",".join(map(str, t.shape)), raw_hex(t)]))
        if isinstance(t, torch.nn.Parameter):
            print("PARAM", key, t.requires_grad)
        ptr = t.storage().data_ptr()
        if t.numel() and ptr in seen:
            print("SHARED", seen[ptr], key)
        seen.setdefault(ptr, key)


def data_pkl(path):
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        return z.read(name)


def bundle(path):
    globals_used = set()
    for opcode, arg, _ in pickletools.genops(io.BytesIO(data_pkl(path))):
        if opcode.name == "GLOBAL":
            globals_used.add(arg)
    assert globals_used <= ALLOWED_GLOBALS, globals_used - ALLOWED_GLOBALS
    b = torch.load(path)
    assert list(b) == ["epoch", "model", "optimizer", "name", "flags", "blob", "big", "neg",
                       "ratio", "opaque"], list(b)
    assert b["epoch"] == 3 and isinstance(b["epoch"], int)
    assert type(b["model"]).__name__ == "OrderedDict"
    assert torch.equal(b["model"]["fc.weight"], torch.arange(6.0).reshape(2, 3))
    opt = b["optimizer"]
    assert type(opt) is dict
    # A dict of tensors that was not an OrderedDict stays a plain dict (optimizer state is one).
    assert type(opt["state"][0]) is dict, type(opt["state"][0])
    assert torch.equal(opt["state"][0]["step"], torch.tensor(5.0))
    assert torch.equal(opt["state"][0]["exp_avg"], torch.full((2, 3), 0.5))
    group = opt["param_groups"][0]
    assert group["lr"] == 0.001 and group["betas"] == (0.9, 0.999) and group["params"] == [0]
    assert b["name"] == "run-1"
    assert b["flags"] == [True, False, None]
    assert b["blob"] == b"\x00\x01\xff"
    assert b["big"] == 1 << 40 and b["neg"] == -7
    assert math.isnan(b["ratio"][0]) and b["ratio"][1] == -math.inf
    assert b["opaque"] == {"__opaque_class__": "mypkg.Thing", "args": (1,), "state": {"a": 2}}
    print("OK")


def check_zip(path):
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        raw = open(path, "rb").read()
        for info in z.infolist():
            name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
            data = info.header_offset + 30 + name_len + extra_len
            assert data % 64 == 0, f"{info.filename} data at {data}"
    torch.load(path)
    print("OK")


def plain(path):
    """torch.load(FILE) of {"c": complex, "dev": device, "dt": dtype, ...}: one line each."""
    for key, value in torch.load(path).items():
        print(f"{key}|{type(value).__name__}|{value!r}")


def quantized(path):
    sd = torch.load(path)
    for key, t in sd.items():
        scheme = str(t.qscheme()).replace("torch.", "")
        if t.qscheme() == torch.per_tensor_affine:
            params = struct.pack("<dq", t.q_scale(), t.q_zero_point()).hex()
        else:
            params = ",".join([raw_hex(t.q_per_channel_scales()),
                               raw_hex(t.q_per_channel_zero_points()),
                               str(t.q_per_channel_axis())])
        print("|".join([key, str(t.dtype), ",".join(map(str, t.shape)), scheme, params,
                        raw_hex(t.int_repr())]))


if __name__ == "__main__":
    {"describe": describe, "bundle": bundle, "zip": check_zip, "quantized": quantized,
     "plain": plain}[sys.argv[1]](sys.argv[2])
