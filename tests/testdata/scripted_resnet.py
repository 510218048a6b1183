"""A scripted torchvision ResNet-18 on both ends of ckpt (tests/scripted_resnet_test).

  make DIR            DIR/resnet18.ts: torchvision.models.resnet18(num_classes=10), seeded,
                      torch.jit.script'ed and saved with its state_dict keys as the extra file
                      state_dict_keys.txt; DIR/shards/: 128 [3,32,32] images of 10 classes (a
                      fixed prototype per class plus noise) in two torch.save shards of 64.
  check-convert DIR PT
                      PT (`ckpt convert resnet18.ts PT`) holds exactly torch.jit.load's
                      state_dict() of the archive, keys in order, bit for bit, and loads strictly
                      into torchvision.models.resnet18(num_classes=10).
  check-export DIR PT PT is the trained model (`ckpt export` of the trainer's version): it loads
                      strictly into torchvision's resnet18(num_classes=10), differs from the
                      initial weights, and gives the same logits on a fixed batch (eval mode) as
                      the scripted module the trainer ran, holding the same weights.
Each prints OK at the end.
"""
import os
import sys

import torch
import torchvision

CLASSES = 10


def make(out):
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=CLASSES)
    torch.jit.script(model).save(os.path.join(out, "resnet18.ts"), _extra_files={
        "state_dict_keys.txt": "\n".join(model.state_dict().keys())})
    generator = torch.Generator().manual_seed(3)
    prototypes = torch.randn(CLASSES, 3, 32, 32, generator=generator)
    for shard in range(2):
        y = torch.randint(0, CLASSES, (64,), generator=generator)
        x = prototypes[y] + 0.5 * torch.randn(64, 3, 32, 32, generator=generator)
        torch.save({"x": x, "y": y}, os.path.join(out, "shards", "part-%d.pt" % shard))
    print("OK")


def torchvision_resnet(state_dict):
    model = torchvision.models.resnet18(num_classes=CLASSES)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def check_convert(out, path):
    converted = torch.load(path)
    expected = torch.jit.load(os.path.join(out, "resnet18.ts")).state_dict()
    assert list(converted.keys()) == list(expected.keys()), (list(converted)[:5], list(expected)[:5])
    for key, tensor in expected.items():
        assert converted[key].dtype == tensor.dtype and torch.equal(converted[key], tensor), key
    torchvision_resnet(converted)
    print("%d tensors equal torch.jit.load's state_dict()" % len(expected))
    print("OK")


def check_export(out, path):
    trained = torch.load(path)
    model = torchvision_resnet(trained)
    scripted = torch.jit.load(os.path.join(out, "resnet18.ts"))
    initial = {k: v.clone() for k, v in scripted.state_dict().items()}
    changed = [k for k in trained if not torch.equal(trained[k], initial[k])]
    assert len(changed) > len(trained) // 2, "training changed only %d tensors" % len(changed)
    scripted.load_state_dict(trained, strict=True)
    scripted.eval()
    batch = torch.load(os.path.join(out, "shards", "part-0.pt"))["x"][:16]
    with torch.no_grad():
        ours, theirs = scripted(batch), model(batch)
    difference = (ours - theirs).abs().max().item()
    print("logits: largest difference %.3g between the scripted module and torchvision's class"
          % difference)
    assert difference <= 1e-5, difference
    print("OK")


if __name__ == "__main__":
    {"make": make, "check-convert": check_convert,
     "check-export": check_export}[sys.argv[1]](*sys.argv[2:])
