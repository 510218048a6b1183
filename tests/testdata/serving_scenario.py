"""Real PyTorch on both ends of tests/serving_scenario_test.cc.

  make DIR               two trained-looking versions of one network: DIR/v1.pt, DIR/v2.pt
  serve FILE REFERENCE   what a model server does with a synced file: load it (torch .pt with
                         weights_only, or safetensors), load_state_dict into the network, run it;
                         then check every tensor equals REFERENCE's. Prints OK.
"""

import json
import struct
import sys

import torch


def network():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def make(d):
    for version in (1, 2):
        torch.manual_seed(version)
        net = network()
        # A step of training, so the two versions differ the way checkpoints do.
        net(torch.randn(8, 16)).sum().backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.1 * p.grad
        torch.save(net.state_dict(), f"{d}/v{version}.pt")


def load_safetensors(path):
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64}
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    buffer = data[8 + n:]
    state = {}
    for key, info in header.items():
        begin, end = info["data_offsets"]
        state[key] = torch.frombuffer(bytearray(buffer[begin:end]),
                                      dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return state


def serve(path, reference_path):
    state = load_safetensors(path) if path.endswith(".safetensors") else torch.load(
        path, weights_only=True)
    net = network()
    net.load_state_dict(state, strict=True)
    net(torch.randn(2, 16))
    reference = torch.load(reference_path)
    assert sorted(state) == sorted(reference), (sorted(state), sorted(reference))
    for key, tensor in reference.items():
        assert state[key].dtype == tensor.dtype and torch.equal(state[key], tensor), key
    print("OK")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        serve(sys.argv[2], sys.argv[3])
