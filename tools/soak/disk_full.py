"""disk_full: fill the store's disk with imports, again and again, and check every time that the
failing commit is a clean RESOURCE_EXHAUSTED, that nothing acknowledged is lost or changed, and
that the store is usable again once space is freed.

The store lives on a tmpfs of --disk_mib MiB that the campaign mounts (root only: `mount -t
tmpfs`) under its work directory and unmounts when it ends. One checkpoint_store service
(--abandoned_upload_grace=0s, so that `gc` reclaims the partial pack of a failed import at once)
serves it for the whole campaign, restarted every --restart_every trials, because a long-lived
process is where a writer that failed on ENOSPC gets reused (issue #20: RocksDB's
`sync_without_flush_called_` assertion).

A pool of torch.save files (random float32 tensors, 2-6 MiB each, written once with
/usr/bin/python3) is imported round-robin into model "m"; the pool is larger than what fits on
the disk, so every import brings new chunks (dedup would otherwise make a full disk unreachable).

One trial (one ENOSPC cycle):
  1. import the next files until an import fails: it must exit non-zero with RESOURCE_EXHAUSTED
     (else "unclean", printed with the message), and the service must still run (else crash);
  2. import once more right away: again a clean RESOURCE_EXHAUSTED (the sequence that aborted the
     service before the fix);
  3. check: `ckpt verify` passes; `ckpt ls m` lists exactly the acknowledged versions not deleted
     by the campaign (a missing one is lost, an extra one -- the failed commit -- is torn); the new
     versions and one older one are exported as safetensors and each tensor's SHA-256 equals its
     source's (else lost);
  4. free space: delete the oldest half of the versions (`ckpt rm --force`) and `ckpt gc`;
  5. import again: it must succeed (else "not usable", counted as lost: the store refused a commit
     that fits).
detected = failing commits that were a clean RESOURCE_EXHAUSTED (two per trial).
"""

import hashlib
import json
import os
import re
import struct
import subprocess

import soak_lib

DESCRIPTION = "fill a tmpfs under the store service with imports; clean ENOSPC, nothing lost"
FULL_TRIALS = 200
SHORT_TRIALS = 5

ROW = "store service on a full tmpfs"
IMPORTED = re.compile(r"as m@(\d+)")

GENERATE = r"""
import hashlib, json, sys, torch
out, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
g = torch.Generator().manual_seed(seed)
hashes = {}
for i in range(count):
    mib = 2 + (i * 7) % 5  # 2..6 MiB
    tensors = {f"w{j}": torch.randn(mib * 262144 // 4, generator=g) for j in range(4)}
    path = f"{out}/src{i:03d}.pt"
    torch.save(tensors, path)
    hashes[path] = {k: hashlib.sha256(t.numpy().tobytes()).hexdigest() for k, t in tensors.items()}
print(json.dumps(hashes))
"""


def add_args(parser):
    parser.add_argument("--disk_mib", type=int, default=48,
                        help="size of the tmpfs the store lives on (default 48)")
    parser.add_argument("--restart_every", type=int, default=10,
                        help="restart the service every N trials (default 10)")


def safetensors_hashes(path):
    """SHA-256 of each tensor's bytes in a safetensors file, by key."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len])
    base = 8 + header_len
    return {key: hashlib.sha256(blob[base + meta["data_offsets"][0]:
                                     base + meta["data_offsets"][1]]).hexdigest()
            for key, meta in header.items() if key != "__metadata__"}


class Campaign:
    def __init__(self, args, lib):
        self.args = args
        self.lib = lib
        self.table = soak_lib.Table("disk_full", extra_columns=[
            "commits", "unclean", "not usable"])
        self.row = self.table.row(ROW)
        self.commits = 0
        self.unclean = 0
        self.not_usable = 0
        self.mount = os.path.join(lib.work_dir, "disk")
        self.db = os.path.join(self.mount, "db")
        self.store = None
        self.next_source = 0
        self.versions = {}  # acknowledged and not deleted: version -> source path
        self.checked = set()

    # --- helpers -----------------------------------------------------------------------------

    def ckpt(self, *argv, timeout=120.0):
        result = self.lib.ckpt(list(argv), store=self.store.address, timeout=timeout)
        self.row.saw_rss(result.max_rss_mib)
        if result.crashed:
            self.row.fail("crashes", result.describe())
        return result

    def start(self):
        self.store = self.lib.start_store(self.db, flags=["--abandoned_upload_grace=0s"])

    def service_alive(self, where):
        if self.store.poll() is None:
            return True
        self.row.fail("crashes", f"the service exited ({self.store.returncode}) {where}: "
                      f"{self.store.log_tail(600)}")
        self.row.saw_rss(self.store.max_rss_mib)
        self.start()
        return False

    def import_next(self):
        source = self.sources[self.next_source % len(self.sources)]
        self.next_source += 1
        result = self.ckpt("import", source, "--model", "m")
        version = None
        if result.ok:
            match = IMPORTED.search(result.stdout + result.stderr)
            if match:
                version = int(match.group(1))
                self.versions[version] = source
                self.commits += 1
        return result, version

    def expect_full(self, result, what):
        if result.ok:
            return False
        text = (result.stderr + result.stdout).strip()
        if "RESOURCE_EXHAUSTED" in text:
            self.row.add("detected")
        else:
            self.unclean += 1
            print(f"[disk_full] unclean {what}: {text[-300:]}", flush=True)
        return True

    def check(self):
        verify = self.ckpt("verify", timeout=300.0)
        if not verify.ok and not verify.crashed:
            self.row.fail("lost", f"verify failed: {verify.describe()}")
        listed = self.ckpt("ls", "m")
        if not listed.ok:
            self.row.fail("lost", f"ls failed: {listed.describe()}")
            return
        present = {int(line.split()[0]) for line in listed.stdout.splitlines()
                   if line.strip() and line.split()[0].isdigit()}
        for version in sorted(set(self.versions) - present):
            self.row.fail("lost", f"acknowledged m@{version} is not listed")
            self.versions.pop(version)
        for version in sorted(present - set(self.versions)):
            self.row.fail("torn", f"m@{version} is listed but was never acknowledged")
        todo = [v for v in sorted(self.versions) if v not in self.checked]
        older = [v for v in sorted(self.versions) if v in self.checked]
        if older:
            todo.append(self.lib.rng.choice(older))
        for version in todo:
            out = os.path.join(self.lib.work_dir, "export.safetensors")
            exported = self.ckpt("export", f"m@{version}", out)
            if not exported.ok:
                self.row.fail("lost", f"export of m@{version}: {exported.describe()}")
                continue
            if safetensors_hashes(out) != self.hashes[self.versions[version]]:
                self.row.fail("lost", f"m@{version} differs from {self.versions[version]}")
            self.checked.add(version)
            os.unlink(out)

    def free_space(self):
        oldest = sorted(self.versions)[:max(1, len(self.versions) // 2)]
        for version in oldest:
            removed = self.ckpt("rm", f"m@{version}", "--force")
            if removed.ok:
                self.versions.pop(version)
                self.checked.discard(version)
            else:
                self.row.fail("lost", f"rm m@{version} on a full disk: {removed.describe()}")
        collected = self.ckpt("gc", timeout=300.0)
        if not collected.ok:
            self.row.fail("lost", f"gc on a full disk: {collected.describe()}")

    # --- the campaign --------------------------------------------------------------------------

    def run(self):
        pool = max(8, (self.args.disk_mib * 2) // 3)  # about twice what the disk holds.
        src_dir = os.path.join(self.lib.work_dir, "sources")
        os.makedirs(src_dir)
        generated = self.lib.run([self.lib.python, "-c", GENERATE, src_dir, str(pool),
                                  str(self.lib.seed)], timeout=600.0)
        if not generated.ok:
            raise RuntimeError(f"generating sources: {generated.describe()}")
        self.hashes = json.loads(generated.stdout)
        self.sources = sorted(self.hashes)
        os.makedirs(self.mount)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.args.disk_mib}m", "tmpfs",
                        self.mount], check=True)
        try:
            self.start()
            self.trials()
        finally:
            if self.store is not None:
                self.store.stop()
                self.row.saw_rss(self.store.max_rss_mib)
            subprocess.run(["umount", "-l", self.mount], check=False)
        self.row.extra.update({"commits": self.commits, "unclean": self.unclean,
                               "not usable": self.not_usable})
        self.table.note(f"tmpfs of {self.args.disk_mib} MiB, a pool of {pool} torch files of "
                        f"2-6 MiB; service restarted every {self.args.restart_every} trials.")
        return self.table

    def trials(self):
        for trial in range(self.args.trials):
            if self.lib.out_of_time():
                self.table.stop_early(f"--max_minutes reached after {trial} trials")
                return
            if trial and trial % self.args.restart_every == 0:
                self.store.stop()
                self.row.saw_rss(self.store.max_rss_mib)
                self.start()
            self.row.add("trials")
            # 1. Fill until an import fails.
            for _ in range(1000):
                result, version = self.import_next()
                if version is None:
                    break
            self.expect_full(result, "first failing commit")
            self.service_alive("after the first failing commit")
            # 2. Again, right away.
            again, version = self.import_next()
            if version is None:
                self.expect_full(again, "commit right after ENOSPC")
            self.service_alive("after the commit right after ENOSPC")
            # 3. Nothing acknowledged lost, nothing unacknowledged visible.
            self.check()
            self.service_alive("during the check")
            # 4. Free space, 5. usable again.
            self.free_space()
            usable, version = self.import_next()
            if version is None:
                self.not_usable += 1
                self.row.fail("lost", f"import after freeing space: {usable.describe()}")
            self.service_alive("after freeing space")
        self.check()


def run(args, lib):
    return Campaign(args, lib).run()
