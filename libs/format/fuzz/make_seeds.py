"""Writes seed files for the parser fuzzers into DIR: files real PyTorch (/usr/bin/python3,
Debian's torch) writes (torch.save, legacy, a TorchScript archive), plus a spec-following
safetensors file and bare pickles."""
import collections
import io
import json
import os
import struct
import sys
import zipfile

import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)

model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
state = model.state_dict()
torch.save(state, f"{out}/state_dict.pt")
torch.save(state, f"{out}/legacy.pt", _use_new_zipfile_serialization=False)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model(torch.randn(5, 3)).sum().backward()
opt.step()
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
torch.save({"epoch": 1, "model": state, "optimizer": opt.state_dict(), "scheduler": sched.state_dict()},
           f"{out}/bundle.pt")
# A TorchScript archive: the module pickled as __torch__ objects, code/ deflated.
torch.jit.script(model).save(f"{out}/scripted.ts")
base = torch.arange(12.0).reshape(3, 4)
torch.save({"t": base.t(), "s": base[1:, 2], "h": torch.ones(2, dtype=torch.float16),
            "b": torch.tensor([True, False]), "i8": torch.tensor([-1, 2], dtype=torch.int8)},
           f"{out}/views_dtypes.pt")

# The bare pickles inside, for the pickle fuzzer.
with zipfile.ZipFile(f"{out}/bundle.pt") as z:
    name = [n for n in z.namelist() if n.endswith("data.pkl")][0]
    open(f"{out}/bundle_data.pkl", "wb").write(z.read(name))
import pickle
open(f"{out}/plain_protocol2.pkl", "wb").write(pickle.dumps(
    {"a": [1, 2.5, None, True], "b": (b"x", "y"), 3: collections.OrderedDict(k=1 << 70)}, protocol=2))
open(f"{out}/plain_protocol5.pkl", "wb").write(pickle.dumps(
    {"nested": [[1, 2], {"x": frozenset({1})}], "bytes": bytearray(b"ab")}, protocol=5))

# safetensors by the spec.
tensors = {"w": torch.randn(2, 3), "n": torch.tensor([7], dtype=torch.int64)}
header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
    data = tensors[name].contiguous().numpy().tobytes()
    header[name] = {"dtype": {torch.float32: "F32", torch.int64: "I64"}[tensors[name].dtype],
                    "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
    offset += len(data)
    blobs.append(data)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(f"{out}/small.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
