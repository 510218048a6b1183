"""Real PyTorch reads the torch files ckpt's export streams (export_test).

  state FILE   torch.load(FILE, weights_only=True); one line per tensor, key|dtype|shape|hex,
               after "TYPE <class of the state dict>".
  bundle FILE  torch.load(FILE) (1.13's weights_only loader has no float opcode, which optimizer
               state holds); one line per leaf, keys joined by '/': PATH|dtype|shape|hex for a
               tensor, PATH=repr for anything else, after "TYPE <class>" per dict.
"""
import sys

import torch


def raw_hex(t):
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes().hex() if t.numel() else ""


def tensor_line(path, t):
    return "|".join([path, str(t.dtype), ",".join(map(str, t.shape)), raw_hex(t)])


def state(path):
    sd = torch.load(path, weights_only=True)
    print("TYPE", type(sd).__name__)
    for key, t in sd.items():
        print(tensor_line(key, t))


def walk(path, value):
    if isinstance(value, dict):
        print("TYPE", path or "/", type(value).__name__)
        for key, item in value.items():
            walk(f"{path}/{key}" if path else str(key), item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            walk(f"{path}/{i}", item)
    elif isinstance(value, torch.Tensor):
        print(tensor_line(path, value))
    else:
        print(f"{path}={value!r}")


def bundle(path):
    walk("", torch.load(path))


if __name__ == "__main__":
    {"state": state, "bundle": bundle}[sys.argv[1]](sys.argv[2])
