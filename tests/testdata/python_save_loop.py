"""A Python training loop that saves to the store with ckpt_client, for python_save_resume_test.

    python_save_loop.py STORE_ADDRESS SAVE_AT TOTAL

Trains nn.Sequential(Linear(16, 32), ReLU, Linear(32, 4)) under nn.DataParallel (keys
"module.0.weight", as a DP/DDP job saves them) with AdamW and StepLR on one thread, and saves
through Client.save at step SAVE_AT (model, optimizer, scheduler, step) as "py.loop". It goes on
to step TOTAL uninterrupted and saves the final weights as "py.reference", and every batch as
"py.batches" (x<i>, y<i>), so the C++ side resumes from py.loop@1, steps through the same
batches and compares against py.reference, all read back from the store. Prints OK.
"""
import sys

import torch
from torch import nn

import ckpt_client

# The C++ side builds the same optimizer and scheduler (its options are restored from the
# bundle; the kinds must match).
LR, WEIGHT_DECAY, STEP_SIZE, GAMMA = 1e-2, 0.01, 2, 0.5


def main():
    address, save_at, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    wrapped = nn.DataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)
    batches = {}
    with ckpt_client.Client(store=address) as client:
        for step in range(total):
            x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
            batches[f"x{step}"], batches[f"y{step}"] = x, y
            optimizer.zero_grad()
            nn.functional.cross_entropy(wrapped(x), y).backward()
            optimizer.step()
            scheduler.step()
            if step + 1 == save_at:
                saved = client.save("py.loop", wrapped, optimizer=optimizer, scheduler=scheduler,
                                    epoch=0, step=save_at, reason="python loop")
                assert saved.version == 1, saved
        client.save("py.reference", model)
        client.save("py.batches", batches)
    print("OK")


if __name__ == "__main__":
    main()
