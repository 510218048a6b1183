"""Real PyTorch (1.13) side of scripted_model_test: TorchScript modules a team would bring.

  scripted_models.py DIR

writes into DIR
  net.ts            Net (conv, BatchNorm, linear head, a parameter and two buffers of its own, one
                    of them non-persistent, and a loss(inputs, targets) method), scripted and saved
                    with its state_dict's keys as the extra file state_dict_keys.txt;
  net_nokeys.ts     the same module saved without that file;
  net.keys          the original Net's state_dict(): "key shape dtype" per line, in order;
  batch.pt          {'x': inputs, 'y': targets, 'loss': Net.loss(x, y) in eval mode,
                     'logits': Net(x) in eval mode, 'mse': MSE of a plain MLP's outputs};
  mlp.ts            a traced MLP without a loss method (torch.jit.trace);
  noparams.ts       a module without parameters;
  frozen.ts         a module whose only parameter does not require grad;
  badloss.ts        a module whose loss() takes one argument;
  weights.pt        a torch.save state dict (not TorchScript);
and prints OK.
"""
import os
import sys

import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), 1.5))
        self.register_buffer("scale", torch.full((1,), 0.5))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x))) * self.scale * self.alpha
        return self.head(x.mean((2, 3)))

    @torch.jit.export
    def loss(self, inputs, targets):
        return F.cross_entropy(self.forward(inputs), targets)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(144, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class NoParams(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :10]


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(144, 10), requires_grad=False)

    def forward(self, x):
        return x.flatten(1) @ self.w


class BadLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(144, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))

    @torch.jit.export
    def loss(self, inputs):
        return self.forward(inputs).sum()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    net = Net()
    # Non-trivial BatchNorm statistics, and num_batches_tracked != 0.
    net.train()
    net(torch.randn(8, 1, 12, 12))
    keys = "\n".join(net.state_dict().keys())
    scripted = torch.jit.script(net)
    scripted.save(os.path.join(out, "net.ts"), _extra_files={"state_dict_keys.txt": keys})
    scripted.save(os.path.join(out, "net_nokeys.ts"))
    with open(os.path.join(out, "net.keys"), "w") as f:
        for key, value in net.state_dict().items():
            f.write("%s %s %s\n" % (key, list(value.shape), str(value.dtype).replace("torch.", "")))

    mlp = Mlp()
    traced = torch.jit.trace(mlp, torch.randn(2, 1, 12, 12))
    traced.save(os.path.join(out, "mlp.ts"))

    net.eval()
    x = torch.randn(6, 1, 12, 12)
    y = torch.tensor([0, 3, 9, 1, 1, 7])
    with torch.no_grad():
        torch.save({"x": x, "y": y, "loss": net.loss(x, y), "logits": net(x),
                    "mlp_ce": F.cross_entropy(mlp(x), y)},
                   os.path.join(out, "batch.pt"))

    torch.jit.script(NoParams()).save(os.path.join(out, "noparams.ts"))
    torch.jit.script(Frozen()).save(os.path.join(out, "frozen.ts"))
    torch.jit.script(BadLoss()).save(os.path.join(out, "badloss.ts"))
    torch.save(net.state_dict(), os.path.join(out, "weights.pt"))
    print("OK")


if __name__ == "__main__":
    main()
