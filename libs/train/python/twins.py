"""PyTorch twins of the C++ models in libs/train/models.h.

Each class has exactly the state_dict() keys (names, order, shapes) of its C++ twin, so a
checkpoint the trainer exports loads here with load_state_dict(strict=True) and gives the same
logits in eval mode. Model.PythonTwin() in C++ returns the constructor expression, e.g.
"MLP(in_features=144, hidden=64, layers=2, num_classes=10)".

As a script it checks a C++ export against its twin:

  python3 twins.py check --bundle FILE [--twin EXPR] [--state FILE] [--atol 1e-5]

FILE is a torch.save dict with some of 'twin' (the expression), 'state' (the state dict),
'input' (a batch) and 'output' (the C++ logits for it); --twin / --state override them (--state
names a file holding a state dict, e.g. one exported through the loader). It loads the state
with strict=True, checks the key order, runs the batch in eval mode and compares the logits;
prints "OK ..." and exits 0, or prints what differs and exits 1.
"""

import argparse
import sys

import torch
from torch import nn


class MLP(nn.Module):
    """flatten -> layers x (Linear + ReLU) -> Linear head."""

    def __init__(self, in_features, hidden, layers, num_classes):
        super().__init__()
        widths = [in_features] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


class CNN(nn.Module):
    """conv-bn-relu, maxpool 2, conv-bn-relu, global average pool, Linear head."""

    def __init__(self, in_channels, channels, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


class Transformer(nn.Module):
    """Token + learned position embedding, post-norm encoder, mean pool, Linear head.

    Every encoder option LibTorch fixes is set explicitly here (ReLU, eps 1e-5, post-norm,
    sequence-first), so a change of Python's defaults cannot silently break the twin.
    """

    def __init__(self, vocab_size, seq_len, d_model, heads, layers, num_classes):
        super().__init__()
        # Registered first: LibTorch's state dict lists it before the children too.
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        self.embed = nn.Embedding(vocab_size, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=2 * d_model, dropout=0.0, activation="relu",
            layer_norm_eps=1e-5, batch_first=False, norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]  # [N,S,E]
        x = self.encoder(x.transpose(0, 1))                    # [S,N,E]
        return self.head(x.mean(dim=0))


def build(expression):
    """The twin a C++ Model.PythonTwin() expression names (only the classes above)."""
    return eval(expression, {"__builtins__": {}},
                {"MLP": MLP, "CNN": CNN, "Transformer": Transformer})


def check(args):
    bundle = torch.load(args.bundle) if args.bundle else {}
    twin = args.twin or bundle.get("twin")
    state = torch.load(args.state) if args.state else bundle.get("state")
    if twin is None or state is None:
        print("need a twin expression and a state dict (--bundle with 'twin'/'state', or "
              "--twin/--state)")
        return 1
    model = build(twin)
    expected_keys = list(model.state_dict().keys())
    if list(state.keys()) != expected_keys:
        print("key order differs from the twin's state_dict():")
        print("  export:", list(state.keys()))
        print("  twin:  ", expected_keys)
        # Still try strict loading below: it names missing / unexpected keys precisely.
    model.load_state_dict(state, strict=True)
    if list(state.keys()) != expected_keys:
        return 1
    model.eval()
    message = "OK %s: %d keys" % (twin, len(expected_keys))
    if "input" in bundle:
        with torch.no_grad():
            output = model(bundle["input"])
        if "output" in bundle:
            want = bundle["output"]
            if output.shape != want.shape:
                print("output shape %s, expected %s" % (tuple(output.shape), tuple(want.shape)))
                return 1
            diff = (output - want).abs().max().item()
            if not torch.allclose(output, want, atol=args.atol, rtol=0):
                print("outputs differ: max abs diff %g > atol %g" % (diff, args.atol))
                return 1
            message += ", max abs diff %.3g" % diff
    print(message)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check_parser = sub.add_parser("check")
    check_parser.add_argument("--bundle")
    check_parser.add_argument("--twin")
    check_parser.add_argument("--state")
    check_parser.add_argument("--atol", type=float, default=1e-5)
    args = parser.parse_args()
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
