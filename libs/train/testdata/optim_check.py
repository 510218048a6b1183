"""Real PyTorch (1.13) side of libs/train's optimizer and scheduler tests.

  optimizer KIND PATH   torch.load the optimizer state dict C++ wrote to PATH, load_state_dict it
                        into a Python optimizer of KIND (sgd | adam | adamw) over parameters of
                        the state's shapes, and check that the loaded state, and the state dict of
                        a fresh Python optimizer after one step, have exactly our keys. Prints OK.
  steplr LR STEP_SIZE GAMMA N
                        Python's StepLR over an SGD optimizer with lr LR: prints its state_dict
                        keys, then the lr after each of N steps as float.hex (exact).
"""
import sys

import torch

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check_optimizer(kind, path):
    saved = torch.load(path)
    cls = OPTIMIZERS[kind]
    ids = saved["param_groups"][0]["params"]
    shapes = []
    for i in ids:
        state = saved["state"][i]
        tensor = state.get("exp_avg", state.get("momentum_buffer"))
        shapes.append(tensor.shape)
    extra = {"momentum": 0.5} if kind == "sgd" else {}
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    # Different hyper-parameters than saved: load_state_dict must bring the saved ones.
    optimizer = cls(params, lr=0.123, **extra)
    optimizer.load_state_dict(saved)
    loaded = optimizer.state_dict()
    if list(loaded["param_groups"][0].keys()) != list(saved["param_groups"][0].keys()):
        fail(f"group keys {list(loaded['param_groups'][0].keys())} != "
             f"{list(saved['param_groups'][0].keys())}")
    for key, value in saved["param_groups"][0].items():
        if loaded["param_groups"][0][key] != value:
            fail(f"group {key}: {loaded['param_groups'][0][key]} != {value}")
    for i in ids:
        if list(loaded["state"][i].keys()) != list(saved["state"][i].keys()):
            fail(f"state {i} keys {list(loaded['state'][i].keys())}")
        for key, value in saved["state"][i].items():
            if not torch.equal(loaded["state"][i][key], value):
                fail(f"state {i} {key} differs")
    # What Python itself writes after a step must have the same layout as what we wrote.
    fresh_params = [torch.nn.Parameter(torch.ones(s)) for s in shapes]
    fresh = cls(fresh_params, lr=0.1, **extra)
    sum(p.sum() for p in fresh_params).backward()
    fresh.step()
    native = fresh.state_dict()
    if list(native["param_groups"][0].keys()) != list(saved["param_groups"][0].keys()):
        fail(f"Python writes group keys {list(native['param_groups'][0].keys())}, we wrote "
             f"{list(saved['param_groups'][0].keys())}")
    for i in ids:
        if list(native["state"][i].keys()) != list(saved["state"][i].keys()):
            fail(f"Python writes state keys {list(native['state'][i].keys())}")
        for key, value in native["state"][i].items():
            ours = saved["state"][i][key]
            if value.dtype != ours.dtype or value.shape != ours.shape:
                fail(f"state {i} {key}: Python {value.dtype}{list(value.shape)}, "
                     f"ours {ours.dtype}{list(ours.shape)}")
    print("OK")


def steplr(lr, step_size, gamma, n):
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=gamma)
    print("keys", " ".join(scheduler.state_dict().keys()))
    for _ in range(n):
        optimizer.step()
        scheduler.step()
        print(scheduler.get_last_lr()[0].hex())


def main():
    if sys.argv[1] == "optimizer":
        check_optimizer(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "steplr":
        steplr(float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    else:
        fail(f"unknown mode {sys.argv[1]}")


if __name__ == "__main__":
    main()
