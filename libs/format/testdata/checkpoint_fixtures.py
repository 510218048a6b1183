"""Real-PyTorch fixtures and checks for checkpoint_file_test / convert_test / inspect_test.

  make DIR                writes, with Debian's torch 1.13:
                            ddp_cuda1.pt   DataParallel-wrapped model's state dict ("module." keys)
                                           with every tensor tagged cuda:1 (torch.load without
                                           map_location fails on a CPU machine)
                            bundle.pt      {'epoch','model','optimizer' (Adam),'scheduler' (StepLR),
                                           'best_acc'}, the model DataParallel-wrapped
                            legacy.pt      the plain state dict in the pre-1.6 format
                            reference.pt   the plain state dict (canonical keys) to compare against
                            whole_model.pt torch.save(model) of a class whose module file is then
                                           deleted (Python can no longer load it), and
                            whole_reference.pt  that model's state_dict()
  verify_torch FILE DIR   torch.load(FILE, weights_only=True) loads with strict=True into the
                          unwrapped model and equals reference.pt; prints OK
  verify_safetensors FILE DIR   parses FILE by the safetensors spec, same checks; prints OK
  verify_sparse FILE DIR  FILE (written from sparse.pt) loads with weights_only=True as the same
                          sparse tensors, layouts, indices and values; prints OK
"""
import copy
import json
import struct
import sys
import warnings

import torch

# torch 1.13 warns on every CSR tensor it makes; the checks print their verdict on the same pipe.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3))


def trained_model():
    model = make_model()
    model.train()
    model(torch.randn(6, 4)).sum().backward()  # BatchNorm running stats and num_batches_tracked move.
    return model


def save_tagged(obj, path, tag):
    original = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: tag
    try:
        torch.save(obj, path)
    finally:
        torch.serialization.location_tag = original


NET_SOURCE = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
        self.head = torch.nn.Linear(8, 3)
        self.register_buffer("scratch", torch.zeros(2), persistent=False)

    def forward(self, x):
        return self.head(self.body(x))
"""


def make_whole_model(d):
    import importlib
    import os
    sys.path.insert(0, d)
    with open(f"{d}/renamed_pkg_models.py", "w") as f:
        f.write(NET_SOURCE)
    module = importlib.import_module("renamed_pkg_models")
    torch.manual_seed(1)
    net = module.Net()
    net(torch.randn(3, 4))
    torch.save(net, f"{d}/whole_model.pt")
    torch.save(net.state_dict(), f"{d}/whole_reference.pt")
    os.remove(f"{d}/renamed_pkg_models.py")
    del sys.modules["renamed_pkg_models"]
    sys.path.remove(d)
    try:
        torch.load(f"{d}/whole_model.pt")
        raise SystemExit("expected torch.load of the whole model to fail without its module")
    except ModuleNotFoundError:
        pass


def make(d):
    make_whole_model(d)
    model = trained_model()
    torch.save(model.state_dict(), f"{d}/reference.pt")
    torch.save(model.state_dict(), f"{d}/legacy.pt", _use_new_zipfile_serialization=False)
    wrapped = torch.nn.DataParallel(model)
    save_tagged(wrapped.state_dict(), f"{d}/ddp_cuda1.pt", "cuda:1")
    try:
        torch.load(f"{d}/ddp_cuda1.pt")
        raise SystemExit("expected torch.load of a cuda:1 file to fail on a CPU machine")
    except RuntimeError:
        pass
    wrapped_state = copy.deepcopy(wrapped.state_dict())  # The weights reference.pt holds.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    opt.step()
    sched.step()
    torch.save({"epoch": 3, "model": wrapped_state, "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "best_acc": 0.5}, f"{d}/bundle.pt")
    # A few hundred bytes that claim 4 TB: one float broadcast to 10**12 elements (stride 0),
    # and a modest broadcast (4 MB) that fits any budget.
    torch.save({"w": torch.zeros(1).expand(10**12), "b": torch.ones(2)}, f"{d}/expanded.pt")
    torch.save({"w": torch.ones(1).expand(10**6)}, f"{d}/expanded_small.pt")
    # What a hostile rerun got through a per-tensor budget (#38): eight 4 GB broadcasts of one
    # element each (2.5 KB on disk, 29.8 GiB materialized), a 3.7 GiB overlapping as_strided view
    # of ten zeros, and one 24 GB broadcast just under this machine's physical memory.
    torch.save({f"w{i}": torch.full((1,), float(i)).expand(10**9) for i in range(8)},
               f"{d}/hostile_eight_broadcasts.pt")
    torch.save({"w": torch.zeros(10).as_strided((10**9,), (0,))}, f"{d}/hostile_as_strided.pt")
    torch.save({"w": torch.zeros(1).expand(6 * 10**9)}, f"{d}/hostile_one_broadcast.pt")
    # Roots that are no state dict (#54): a bare tensor, a list of tensors, plain values; sparse
    # layouts; and meta tensors, which ckpt does not store.
    torch.save(torch.arange(12.0).reshape(3, 4), f"{d}/root_tensor.pt")
    torch.save([torch.arange(3.0), torch.ones(2, dtype=torch.int64)], f"{d}/root_list.pt")
    torch.save({"lr": 0.1, "name": "run-7"}, f"{d}/root_plain.pt")
    torch.save(sparse_tensors(), f"{d}/sparse.pt")
    torch.save({"w": torch.empty(3, 4, device="meta")}, f"{d}/meta.pt")
    # One empty storage viewed as two dtypes, which torch allows when it has no bytes.
    empty = torch.empty(0)
    torch.save({"a": empty, "b": empty.view(torch.int32), "c": torch.ones(2)},
               f"{d}/empty_two_dtypes.pt")


def sparse_tensors():
    """COO (coalesced, and an uncoalesced hybrid one with a dense dim), CSR with int32 indices."""
    hybrid = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1], [1, 1, 2]]),
                                     torch.arange(6.0, dtype=torch.float64).reshape(3, 2), (2, 3, 2))
    csr = torch.sparse_csr_tensor(torch.tensor([0, 1, 1, 3], dtype=torch.int32),
                                  torch.tensor([2, 0, 3], dtype=torch.int32),
                                  torch.tensor([1.5, -2.0, 4.0]), (3, 4))
    return {"w": torch.eye(3).to_sparse(), "hybrid": hybrid, "csr": csr, "b": torch.ones(3)}


def verify_sparse(path, d):
    """`path` loads with weights_only=True as sparse.pt's tensors, each in its layout with the
    same indices and values."""
    got, want = torch.load(path, weights_only=True), sparse_tensors()
    assert list(got) == list(want), (list(got), list(want))
    for key, tensor in want.items():
        other = got[key]
        assert other.layout == tensor.layout and other.dtype == tensor.dtype, (key, other)
        assert other.shape == tensor.shape, (key, other.shape)
        if tensor.layout == torch.sparse_coo:
            assert torch.equal(other._indices(), tensor._indices()), key
            assert torch.equal(other._values(), tensor._values()), key
        elif tensor.layout == torch.sparse_csr:
            assert other.crow_indices().dtype == tensor.crow_indices().dtype, key
            assert torch.equal(other.crow_indices(), tensor.crow_indices()), key
            assert torch.equal(other.col_indices(), tensor.col_indices()), key
            assert torch.equal(other.values(), tensor.values()), key
        else:
            assert torch.equal(other, tensor), key
    print("OK")


def check(state, d):
    model = make_model()
    model.load_state_dict(state, strict=True)
    reference = torch.load(f"{d}/reference.pt")
    # Same keys; safetensors files keep them in layout order, not the model's.
    assert sorted(state) == sorted(reference), (list(state), list(reference))
    for key, tensor in reference.items():
        assert state[key].dtype == tensor.dtype and torch.equal(state[key], tensor), key
    print("OK")


def verify_torch(path, d):
    check(torch.load(path, weights_only=True), d)


def verify_root(path, d):
    """`path` (converted from root_list.pt) loads as the same list of tensors."""
    got, want = torch.load(path, weights_only=True), torch.load(f"{d}/root_list.pt")
    assert isinstance(got, list) and len(got) == len(want), got
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)
    print("OK")


def verify_safetensors(path, d):
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    assert header["__metadata__"]["format"] == "pt"
    buffer = data[8 + n:]
    reference = torch.load(f"{d}/reference.pt")
    state = {}
    for key in reference:  # In the model's order, as load_state_dict does not care.
        info = header[key]
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(buffer[begin:end]), dtype=dtypes[info["dtype"]]) \
            if end > begin else torch.zeros(0, dtype=dtypes[info["dtype"]])
        state[key] = t.reshape(info["shape"])
    assert len(header) - 1 == len(reference)
    check(state, d)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "make":
        make(sys.argv[2])
    elif mode == "verify_torch":
        verify_torch(sys.argv[2], sys.argv[3])
    elif mode == "verify_root":
        verify_root(sys.argv[2], sys.argv[3])
    elif mode == "verify_sparse":
        verify_sparse(sys.argv[2], sys.argv[3])
    else:
        verify_safetensors(sys.argv[2], sys.argv[3])
