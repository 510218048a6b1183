"""Real PyTorch (1.13) side of optimizer_test's numeric parity check.

  optim_parity.py CASE PATH

Builds seeded parameters and the torch.optim optimizer of CASE (see CASES), takes WARMUP steps
with seeded gradients so that every state tensor is non-trivial, then torch.saves to PATH

  {'params': [tensor, ...],              the parameters after the warm-up,
   'initial': optimizer.state_dict(),    the optimizer state after the warm-up,
   'grads': [[tensor, ...], ...],        the gradients of the STEPS steps that follow,
   'final_params': [tensor, ...],        the parameters after those steps,
   'final': optimizer.state_dict()}      and the optimizer state after them,

and prints OK. The C++ test restores 'initial' into a LibTorch optimizer, takes the same steps
with the same gradients and compares what it ends with against 'final_params' and 'final'.
Gradients shrink and grow from step to step so that AMSGrad's running maximum differs from
exp_avg_sq, and weight decay, momentum, dampening and nesterov all change the numbers.
"""
import copy
import sys

import torch

# Hyper-parameters are floats throughout (0.0, not 0): Python keeps what it is given, and the
# C++ side writes floats.
CASES = {
    "sgd_momentum": (torch.optim.SGD,
                     dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01,
                          nesterov=False)),
    "sgd_nesterov": (torch.optim.SGD,
                     dict(lr=0.05, momentum=0.8, dampening=0.0, weight_decay=0.02,
                          nesterov=True)),
    "adam": (torch.optim.Adam,
             dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.01, amsgrad=False)),
    "adam_amsgrad": (torch.optim.Adam,
                     dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.01,
                          amsgrad=True)),
    "adamw": (torch.optim.AdamW,
              dict(lr=0.02, betas=(0.85, 0.99), eps=1e-7, weight_decay=0.05, amsgrad=False)),
    "adamw_amsgrad": (torch.optim.AdamW,
                      dict(lr=0.02, betas=(0.85, 0.99), eps=1e-7, weight_decay=0.05,
                           amsgrad=True)),
}
WARMUP = 2
STEPS = 4
SHAPES = [(3, 4), (4,), (2, 3, 5)]
SCALES = [1.0, 0.05, 2.0, 0.01, 0.5, 0.2]  # gradient size per step (warm-up first)


def main():
    case, path = sys.argv[1], sys.argv[2]
    cls, hyper = CASES[case]
    generator = torch.Generator().manual_seed(1234)
    params = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in SHAPES]
    optimizer = cls(params, **hyper)
    grads = [[torch.randn(s, generator=generator) * SCALES[i] for s in SHAPES]
             for i in range(WARMUP + STEPS)]

    def step(gradients):
        for param, grad in zip(params, gradients):
            param.grad = grad.clone()
        optimizer.step()

    for gradients in grads[:WARMUP]:
        step(gradients)
    saved = {
        "params": [p.detach().clone() for p in params],
        # state_dict() holds the live state tensors: copy them before stepping on.
        "initial": copy.deepcopy(optimizer.state_dict()),
        "grads": grads[WARMUP:],
    }
    for gradients in grads[WARMUP:]:
        step(gradients)
    saved["final_params"] = [p.detach().clone() for p in params]
    saved["final"] = copy.deepcopy(optimizer.state_dict())
    torch.save(saved, path)
    print("OK")


if __name__ == "__main__":
    main()
