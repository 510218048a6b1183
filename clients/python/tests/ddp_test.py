"""A 2-process Gloo DDP job (torch.distributed, DistributedDataParallel) that checkpoints with
ckpt_client: rank 0 saves asynchronously every few steps (Client.save_async), every rank resumes
from the store's latest version with Client.load_bundle. The job is SIGKILLed mid-run and started
again; both ranks resume from the latest version and the run ends bit-equal to one that was never
interrupted.

A second job does it with one rank talking to the store: rank 0 saves for all (save(on_rank=0))
and reads for all (load_bundle(broadcast_from=0)), while rank 1's client points at a dead address,
so any call of its own would fail; it resumes and ends bit-equal all the same.

    ddp_test.py                                                 the test
    ddp_test.py worker RANK WORLD INIT STORE MODEL TOTAL MODE   one rank (started by the test);
                                                                MODE async or rank0
"""
import os
import signal
import subprocess
import sys
import time
import unittest

import torch
import torch.distributed as dist
from torch import nn

import ckpt_client
from client_test import STORE_BIN, TMP, Server

WORLD = 2
TOTAL = 40       # steps of a whole run
SAVE_EVERY = 4   # rank 0 saves after every 4th step
STEP_PAUSE = 0.05  # seconds per step, so the test can kill the job mid-run


def batch(step, rank):
    """This rank's batch at `step`: the same in every run, whatever was resumed."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(16, 32, generator=generator),
            torch.randint(0, 4, (16,), generator=generator))


def worker(rank, world, init_file, store, model_name, total, mode):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=6, gamma=0.7)
    start = 0
    one_rank = mode == "rank0"
    if one_rank and rank != 0:
        store = "127.0.0.1:1"  # nothing listens: this rank must never call the store itself.
    with ckpt_client.Client(store=store, timeout=20) as client:
        try:
            # Every rank reads the latest version itself (or rank 0 for all); DDP's wrapper keys
            # need no mapping.
            bundle = client.load_bundle(f"{model_name}@latest", ddp, optimizer, scheduler,
                                        broadcast_from=0 if one_rank else None)
            start = bundle.step
            print(f"rank {rank} resumed from version {bundle.version} at step {start}",
                  flush=True)
        except ckpt_client.NotFound:
            pass
        pending = None
        for step in range(start, total):
            x, y = batch(step, rank)
            optimizer.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            scheduler.step()
            if pending is not None and pending.done():
                print(f"rank {rank} committed version {pending.result().version}", flush=True)
                pending = None
            if one_rank and (step + 1) % SAVE_EVERY == 0:
                saved = client.save(model_name, ddp, optimizer=optimizer, scheduler=scheduler,
                                    step=step + 1, on_rank=0)
                print(f"rank {rank} saved version {saved.version}", flush=True)
            elif rank == 0 and (step + 1) % SAVE_EVERY == 0:
                pending = client.save_async(model_name, ddp, optimizer=optimizer,
                                            scheduler=scheduler, step=step + 1)
            time.sleep(STEP_PAUSE)
        if pending is not None:
            pending.result()
        dist.barrier()
        if rank == 0:
            torch.save(model.state_dict(), os.path.join(TMP, f"{model_name}.final.pt"))
    print(f"rank {rank} done", flush=True)


class Job:
    """The WORLD ranks of one run, each a process of this file in worker mode."""

    def __init__(self, store, model_name, name, total=TOTAL, mode="async"):
        init_file = os.path.join(TMP, f"{name}.rendezvous")
        if os.path.exists(init_file):
            os.remove(init_file)
        self.logs = [os.path.join(TMP, f"{name}.rank{rank}.log") for rank in range(WORLD)]
        self.ranks = [subprocess.Popen(
            [sys.executable, __file__, "worker", str(rank), str(WORLD), init_file, store,
             model_name, str(total), mode], stdout=open(log, "w"), stderr=subprocess.STDOUT)
            for rank, log in enumerate(self.logs)]

    def log(self, rank):
        with open(self.logs[rank]) as f:
            return f.read()

    def wait(self, test, timeout=120):
        for rank, process in enumerate(self.ranks):
            test.assertEqual(process.wait(timeout=timeout), 0, self.log(rank))

    def kill(self):
        for process in self.ranks:
            process.send_signal(signal.SIGKILL)
        for process in self.ranks:
            process.wait()


class DdpTest(unittest.TestCase):
    def setUp(self):
        self.store = Server("ddp_store", STORE_BIN, [f"--store_dir={TMP}/ddp_db"])
        self.addCleanup(self.store.stop)

    def test_rank_zero_saves_async_and_every_rank_resumes_after_a_kill(self):
        Job(self.store.address, "ddp.uninterrupted", "uninterrupted").wait(self)

        job = Job(self.store.address, "ddp.killed", "killed")
        deadline = time.monotonic() + 120
        while "committed version 3" not in job.log(0):  # 12 steps in, mid-run
            self.assertLess(time.monotonic(), deadline, job.log(0))
            self.assertIsNone(job.ranks[0].poll(), job.log(0))
            time.sleep(0.05)
        job.kill()
        self.assertNotIn("done", job.log(0))
        with ckpt_client.Client(store=self.store.address) as client:
            latest = client.manifest("ddp.killed@latest")
        self.assertGreaterEqual(latest.version, 3)
        self.assertLess(latest.metadata.global_step, TOTAL)

        resumed = Job(self.store.address, "ddp.killed", "resumed")
        resumed.wait(self)
        for rank in range(WORLD):
            self.assertIn(f"rank {rank} resumed from version {latest.version} at step "
                          f"{latest.metadata.global_step}", resumed.log(rank))
        expected = torch.load(os.path.join(TMP, "ddp.uninterrupted.final.pt"))
        final = torch.load(os.path.join(TMP, "ddp.killed.final.pt"))
        for key, tensor in expected.items():
            self.assertTrue(torch.equal(final[key], tensor), f"{key} after the resume")


    def test_one_rank_saves_and_reads_for_all_and_the_others_never_call_the_store(self):
        Job(self.store.address, "ddp.rank0.whole", "rank0-whole", mode="rank0").wait(self)
        first = Job(self.store.address, "ddp.rank0", "rank0-first", total=TOTAL // 2,
                    mode="rank0")
        first.wait(self)
        saves = TOTAL // 2 // SAVE_EVERY
        for rank in range(WORLD):  # every rank was told the version rank 0 committed
            self.assertIn(f"rank {rank} saved version {saves}", first.log(rank))
        second = Job(self.store.address, "ddp.rank0", "rank0-second", mode="rank0")
        second.wait(self)
        for rank in range(WORLD):
            self.assertIn(f"rank {rank} resumed from version {saves} at step {TOTAL // 2}",
                          second.log(rank))
        expected = torch.load(os.path.join(TMP, "ddp.rank0.whole.final.pt"))
        final = torch.load(os.path.join(TMP, "ddp.rank0.final.pt"))
        for key, tensor in expected.items():
            self.assertTrue(torch.equal(final[key], tensor), f"{key} after the resume")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        rank, world, init_file, store, model_name, total, mode = sys.argv[2:9]
        worker(int(rank), int(world), init_file, store, model_name, int(total), mode)
    else:
        os.makedirs(TMP, exist_ok=True)
        unittest.main()
