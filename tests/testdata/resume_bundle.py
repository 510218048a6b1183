"""Real PyTorch on both ends of a resume bundle (tests/bundle_resume_test).

  train DIR COMBO N M   trains COMBO for N steps under nn.DataParallel and saves the usual bundle
                        DIR/COMBO.pt ({"epoch", "model", "optimizer", "scheduler", "best_acc",
                        ...} with every tensor tagged cuda:1, as a GPU run saves it); then trains
                        on to N+M steps without a break and saves the end state to
                        DIR/COMBO.reference.pt.
  resume FILE REFERENCE COMBO N M [--wrapped]
                        builds a fresh model (inside nn.DataParallel with --wrapped), optimizer
                        and scheduler, loads the three from FILE, trains steps N..N+M-1, and
                        checks parameters, buffers, optimizer and scheduler state are bit-equal
                        to REFERENCE. Prints OK.
  extras FILE           checks that every extra field `train` saves came back with its type.
  nomodel FILE          saves a bundle that holds no model (for the error test).
  export ADDRESS TOKEN MODEL OUT GEN_DIR
                        exports MODEL's whole bundle to OUT through the loader service's Export
                        RPC from a plain grpcio client with a bearer token (docs/loader.md's Python
                        example, services/loader/testdata/python_client.py). Prints what the
                        server left out, then OK.

COMBOs: sgd_step (SGD with momentum + StepLR), adam_cosine (Adam + CosineAnnealingLR),
adamw_onecycle (AdamW + OneCycleLR, whose torch 1.13 state dict pickles a bound method).
"""
import io
import math
import os
import pickletools
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "libs",
                                "format", "testdata"))
from checkpoint_fixtures import save_tagged  # noqa: E402  (torch.save with every tensor on TAG)
from torch_export_check import ALLOWED_GLOBALS, data_pkl  # noqa: E402

EXTRAS = {
    "best_acc": 0.8125,
    "step": 0,  # set to N
    "note": "resnet-ish run",
    "tags": ["a", 1, 2.5, None, True],
    "nested": {"lr_history": [0.1, 0.05], "inner": {"k": (1, 2)}},
    "metric": torch.tensor([0.25, 0.75]),
    "nothing": None,
    "blob": b"\x00\x01\xff",
}


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def make_training(combo, model, total_steps):
    params = model.parameters()
    if combo == "sgd_step":
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    elif combo == "adam_cosine":
        optimizer = torch.optim.Adam(params, lr=0.01)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    elif combo == "adamw_onecycle":
        optimizer = torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1,
                                                        total_steps=total_steps)
    else:
        raise SystemExit(f"unknown combo {combo}")
    return optimizer, scheduler


def batch(step):
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)


def train(model, optimizer, scheduler, first, last):
    model.train()
    for step in range(first, last):
        x, y = batch(step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()


def cmd_train(out_dir, combo, n, m):
    n, m = int(n), int(m)
    model = nn.DataParallel(make_model())  # on a CPU box DataParallel only wraps: keys "module."
    optimizer, scheduler = make_training(combo, model, n + m)
    train(model, optimizer, scheduler, 0, n)
    bundle = {"epoch": n // 2, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
              "scheduler": scheduler.state_dict()}
    bundle.update(EXTRAS)
    bundle["step"] = n
    save_tagged(bundle, os.path.join(out_dir, combo + ".pt"), "cuda:1")
    train(model, optimizer, scheduler, n, n + m)
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict()},
               os.path.join(out_dir, combo + ".reference.pt"))
    print("OK")


def check_globals(path):
    used = {arg for opcode, arg, _ in pickletools.genops(io.BytesIO(data_pkl(path)))
            if opcode.name == "GLOBAL"}
    assert used <= ALLOWED_GLOBALS, f"globals weights_only refuses: {used - ALLOWED_GLOBALS}"


def same(a, b, where):
    """Bit-equality of two state values (tensors, numbers, containers)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: tensor vs {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{list(a.shape)} vs " \
                                                         f"{b.dtype}{list(b.shape)}"
        assert a.device.type == "cpu", f"{where}: on {a.device}"
        assert torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                           b.view(-1).view(torch.uint8) if b.numel() else b), f"{where}: differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for key in a:
            same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}/{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), f"{where}: {a!r} vs {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} vs {b!r}"


def cmd_resume(path, reference_path, combo, n, m, *flags):
    n, m = int(n), int(m)
    check_globals(path)
    bundle = torch.load(path)
    assert type(bundle) is dict, type(bundle)
    for key, value in bundle["model"].items():
        assert value.device.type == "cpu", key
    model = make_model()
    if "--wrapped" in flags:
        model = nn.DataParallel(model)
    optimizer, scheduler = make_training(combo, model, n + m)
    model.load_state_dict(bundle["model"], strict=True)
    optimizer.load_state_dict(bundle["optimizer"])
    scheduler.load_state_dict(bundle["scheduler"])
    assert bundle["epoch"] == n // 2 and type(bundle["epoch"]) is int, bundle["epoch"]
    train(model, optimizer, scheduler, n, n + m)
    reference = torch.load(reference_path)
    inner = model.module if isinstance(model, nn.DataParallel) else model
    same(inner.state_dict(), reference["model"], "model")
    same(optimizer.state_dict(), reference["optimizer"], "optimizer")
    got, want = scheduler.state_dict(), reference["scheduler"]
    # torch 1.13's OneCycleLR keeps a bound method, which a file never carries as code; the
    # resumed scheduler has its own, built from the same arguments.
    got.pop("anneal_func", None)
    want.pop("anneal_func", None)
    same(got, want, "scheduler")
    print("OK")


def cmd_extras(path):
    bundle = torch.load(path)
    expected = dict(EXTRAS)
    for key, value in expected.items():
        assert key in bundle, f"{key} missing from {list(bundle)}"
        if key == "step":
            assert type(bundle[key]) is int, bundle[key]
            continue
        same(bundle[key], value, key)
    keys = list(bundle)
    assert keys[:4] == ["epoch", "model", "optimizer", "scheduler"], keys
    assert keys[4:] == list(EXTRAS), keys
    assert type(bundle["model"]).__name__ == "OrderedDict"
    assert type(bundle["optimizer"]["state"][0]) is dict
    print("OK")


def cmd_nomodel(path):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.save({"epoch": 1, "optimizer": optimizer.state_dict(), "best_acc": 0.5}, path)
    print("OK")


def cmd_export(address, token, model, out, gen_dir):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "services", "loader",
                                    "testdata"))
    import python_client
    stub, loader_pb2, types_pb2 = python_client.connect(address, gen_dir)
    left_out = python_client.export_bundle(stub, loader_pb2, types_pb2, model, token, out)
    for item in left_out:
        print("left out:", item)
    print("OK")


if __name__ == "__main__":
    commands = {"train": cmd_train, "resume": cmd_resume, "extras": cmd_extras,
                "nomodel": cmd_nomodel, "export": cmd_export}
    commands[sys.argv[1]](*sys.argv[2:])
