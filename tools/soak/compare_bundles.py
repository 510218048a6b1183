"""compare_bundles A.pt B.pt: whether two training bundles saved with torch.save (what
`ckpt export --bundle` writes) are the same bit for bit.

The one comparison of two runs' final states for the checks that run a trainer twice
(tools/soak/trainer_kill.py, tools/gpu_check.sh): every tensor by dtype, shape and bytes (-0.0
differs from 0.0; NaNs with the same bits are equal) and every plain value (epoch, step, lr,
scheduler counters, ...) by type and value, found by its path in the tree ("/model/fc.weight",
"/optimizer/state/0/exp_avg", "/trainer/rng_cpu"). The C++ tests' counterpart is
libs/train/testing/bundle_comparison.h.

Prints one line and exits 0:
  equal N                       N tensors, and every path in one bundle is in the other, the same
  differ N MAX_ABS_DIFF PATH WHAT
                                PATH is the first differing path (sorted), WHAT says how it
                                differs; MAX_ABS_DIFF is the largest |a - b| over the tensors that
                                differ only in values ("inf" when any path differs in presence,
                                dtype, shape or a plain value)
Exits 2 (a message on stderr) when a file cannot be read.
"""

import math
import pickle
import sys

import torch


def load(path):
    # The files are the caller's own exports. torch 1.13's weights_only unpickler lacks opcodes
    # that newer ones write (BINFLOAT), so fall back to a full load there.
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # no weights_only before torch 1.13
        return torch.load(path, map_location="cpu")
    except pickle.UnpicklingError:
        return torch.load(path, map_location="cpu", weights_only=False)


def leaves(value, path, out):
    """{path: tensor or plain value}; an empty container is a leaf of its own."""
    if isinstance(value, torch.Tensor):
        out[path] = value
    elif isinstance(value, dict) and value:
        for key, item in value.items():
            leaves(item, "%s/%s" % (path, key), out)
    elif isinstance(value, (list, tuple)) and value:
        for i, item in enumerate(value):
            leaves(item, "%s/%d" % (path, i), out)
    else:
        out[path] = value
    return out


def describe(tensor):
    return "%s%s" % (str(tensor.dtype).replace("torch.", ""), list(tensor.shape))


def as_bytes(tensor):
    """The tensor's elements as rows of bytes, one row an element."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).reshape(flat.numel(), flat.element_size())


def compare_tensors(x, y):
    """None when the same; else (max |x - y| or inf, what differs)."""
    if x.dtype != y.dtype or x.shape != y.shape:
        return math.inf, "%s vs %s" % (describe(x), describe(y))
    if x.numel() == 0:
        return None
    rows_x, rows_y = as_bytes(x), as_bytes(y)
    differing = (rows_x != rows_y).any(dim=1).nonzero()
    if differing.numel() == 0:
        return None
    index = int(differing[0])
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    if x.is_floating_point() or (not x.is_complex() and x.dtype != torch.bool):
        worst = (x.double() - y.double()).abs().max().item()
    else:
        worst = math.inf
    return worst, "%s differs first at element %d: %s vs %s" % (
        describe(x), index, flat_x[index].item(), flat_y[index].item())


def same_plain(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(a, b):
    """The verdict line for two loaded bundles."""
    leaves_a, leaves_b = leaves(a, "", {}), leaves(b, "", {})
    tensors = sum(isinstance(v, torch.Tensor) for v in leaves_a.values())
    worst, first = 0.0, None
    for path in sorted(set(leaves_a) | set(leaves_b)):
        if path not in leaves_b:
            found = math.inf, "only in the first"
        elif path not in leaves_a:
            found = math.inf, "only in the second"
        else:
            x, y = leaves_a[path], leaves_b[path]
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                found = compare_tensors(x, y)
            elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or not same_plain(x, y):
                found = math.inf, "%r vs %r" % (x, y)
            else:
                found = None
        if found is None:
            continue
        worst = max(worst, found[0]) if not math.isnan(found[0]) else math.nan
        if first is None:
            first = (path or "/", found[1])
    if first is None:
        return "equal %d" % tensors
    return "differ %d %.3g %s %s" % (tensors, worst, first[0], first[1])


def main(argv):
    if len(argv) != 3:
        print("usage: compare_bundles.py A.pt B.pt", file=sys.stderr)
        return 2
    try:
        a, b = load(argv[1]), load(argv[2])
    except Exception as error:  # pylint: disable=broad-except
        print("compare_bundles: cannot read the bundles: %s" % error, file=sys.stderr)
        return 2
    print(compare(a, b))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
