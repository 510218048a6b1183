"""R11's Python side (tools/bench python_save_figures.cc runs it against an in-process store
service on 127.0.0.1):

    python_save_baseline.py STORE_ADDRESS WORK_DIR BYTES RUNS STEP_SECONDS STEPS_BETWEEN_SAVES

1. Save: a state dict of BYTES (16 float32 tensors) with ckpt_client's Client.save against
   torch.save to WORK_DIR + fsync, RUNS pairs, alternating which goes first. Before every save each
   tensor is changed in place (untimed), so neither side ever saves bytes it saved before: every
   chunk is new to the store, and deduplication plays no part.
2. Stall: a training loop whose step is STEP_SECONDS of matrix products on the training thread
   saves the same state every STEPS_BETWEEN_SAVES steps, RUNS times each with
   Client.save_async(overlap_snapshot=True) (the copy beside the next step, wait_snapshot()
   before the optimizer step), with Client.save_async (the copy in the call), and with
   torch.save + fsync in the loop; the stall is how long the loop is blocked (in the call and in
   wait_snapshot(); for save_async also any wait for the previous upload).

Prints one line of JSON with the seconds of every run.
"""
import json
import os
import sys
import time

import torch

import ckpt_client

TENSORS = 16


def torch_save(state, path):
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def change(state):
    with torch.no_grad():
        for tensor in state.values():
            tensor.add_(1.0)


def main():
    address, work_dir, total_bytes, runs, step_seconds, between = sys.argv[1:7]
    total_bytes, runs, step_seconds = int(total_bytes), int(runs), float(step_seconds)
    between = int(between)
    numel = total_bytes // TENSORS // 4
    torch.manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(numel) for i in range(TENSORS)}
    path = os.path.join(work_dir, "r11-torch.pt")
    result = {"torch": torch.__version__, "bytes": numel * 4 * TENSORS, "torch_save_s": [],
              "client_save_s": [], "sync_stall_s": [], "async_stall_s": [], "overlap_stall_s": [],
              "async_first_s": 0,
              "step_s": []}
    with ckpt_client.Client(store=address, timeout=600) as client:
        for run in range(runs):
            sides = ["torch", "client"] if run % 2 == 0 else ["client", "torch"]
            for side in sides:
                change(state)
                if os.path.exists(path):
                    os.remove(path)
                start = time.perf_counter()
                if side == "torch":
                    torch_save(state, path)
                else:
                    client.save("bench.r11", state)
                result[f"{side}_save_s"].append(time.perf_counter() - start)
        a = torch.randn(512, 512)

        def train_step():
            start = time.perf_counter()
            while time.perf_counter() - start < step_seconds:
                torch.mm(a, a)
            result["step_s"].append(time.perf_counter() - start)

        # The first save_async allocates its host buffers (reported apart); later ones reuse them.
        start = time.perf_counter()
        first = client.save_async("bench.r11.loop", state)
        result["async_first_s"] = time.perf_counter() - start
        first.result()
        # "overlap": save_async(overlap_snapshot=True), the copy beside the next step, and
        # wait_snapshot() before the optimizer step; "async": the copy in the call; "sync":
        # torch.save + fsync in the loop. The stall is the call plus wait_snapshot().
        for mode in ("overlap", "async", "sync"):
            for _ in range(runs):
                change(state)  # the optimizer step
                start = time.perf_counter()
                if mode == "sync":
                    torch_save(state, path)
                else:
                    client.save_async("bench.r11.loop", state,
                                      overlap_snapshot=(mode == "overlap"))
                stall = time.perf_counter() - start
                train_step()  # the next forward and backward
                start = time.perf_counter()
                client.wait_snapshot()
                result[f"{mode}_stall_s"].append(stall + time.perf_counter() - start)
                for _ in range(between - 1):
                    train_step()
        client.close()  # waits for the last upload
    if os.path.exists(path):
        os.remove(path)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
