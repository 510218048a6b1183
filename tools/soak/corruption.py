"""corruption: damage one file of a small store per trial and check that nothing is served wrong.

A pristine template store is built once: three versions of one model imported with `ckpt import`
from torch.save bundles that /usr/bin/python3 writes (model weights, Adam optimizer state, and a
frozen tensor every version shares, so chunks are deduplicated), the last with alias "best". The
first two imports end in SST files (RocksDB flushes the log when the next process opens the
store), the last one stays in the WAL, so the template has every kind of file: pack files, SSTs,
MANIFEST, CURRENT, WAL, OPTIONS and the store's acknowledged-write marker (CKPT-ACKNOWLEDGED; this
schema keeps chunks in pack files, not RocksDB blob files, so there are none). A WAL that loses
the last version's commit (truncated or deleted) must be refused by the marker check and repaired
without that version; damage to the marker itself (it carries two checksummed copies of its
number) must be refused at open as DATA_LOSS and repaired without a drop, and an empty or
deleted marker (a power cut, a store from before it) costs nothing. Each version is exported once from the template; those exports are
checked once, tensor by tensor and bit for bit, against the source files with torch, and are the
reference every later read is compared with.

Each trial copies the template, damages one file -- kind round-robin, then a seeded choice of the
file, the operation (flip one byte, truncate, delete) and the offset -- and then:
  1. runs `ckpt verify` on the whole store;
  2. exports every version (`ckpt export MODEL@N --bundle`) and compares the bytes with the
     reference. (Skipped when the store does not open: every read then fails the same way.)
  3. a store that does not open (the DATA_LOSS that names `ckpt repair`) is repaired with
     `ckpt repair`; every version it keeps must export byte-equal, `ckpt verify` must pass
     afterwards, and a damaged CURRENT, MANIFEST, OPTIONS or marker file (no version data in
     them) must not cost a version.
A trial is
  - crashes: any ckpt process died of a signal or printed a sanitizer report;
  - silent: a read returned bytes other than the reference without an error;
  - lost: `verify` passed but a version was missing (NOT_FOUND), or the repair dropped a
    version after damage to a file that holds no version data, or `verify` failed after repair;
  - detected: `verify` reported problems, or the store refused to open with DATA_LOSS, or a read
    failed with a clear error;
  - harmless (extra column): `verify` passed and every version read back byte-equal.
"""

import concurrent.futures
import os
import random
import re
import shutil
import threading

DESCRIPTION = "single-byte flips, truncations, deletions of every kind of store file"
FULL_TRIALS = 1000
SHORT_TRIALS = 200

MODEL = "m"
VERSIONS = 3
KINDS = ("pack", "sst", "manifest", "current", "wal", "options", "marker")
# Files that hold no version data: damage to them must cost no version, also through a repair.
METADATA_KINDS = ("manifest", "current", "options", "marker")
OPERATIONS = ("flip", "truncate", "delete")

_GENERATE = r'''
import sys, torch
out = sys.argv[1]
torch.manual_seed(20)
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 16))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
frozen = torch.randn(128, 64)  # the same bytes in every version: deduplicated chunks
for version in range(1, int(sys.argv[2]) + 1):
    loss = model(torch.randn(8, 64)).pow(2).mean()
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    state = dict(model.state_dict()); state["frozen.weight"] = frozen
    torch.save({"model": state, "optimizer": optimizer.state_dict(), "epoch": version},
               f"{out}/v{version}.pt")
'''

# Every tensor of the export equals the source's, bit for bit (model and optimizer state).
_COMPARE = r'''
import sys, torch
def tensors(value, prefix=""):
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for key in value:
            yield from tensors(value[key], f"{prefix}/{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from tensors(item, f"{prefix}/{i}")
source = torch.load(sys.argv[1])
exported = torch.load(sys.argv[2])  # torch 1.13: weights_only lacks BINFLOAT
a = dict(tensors(source["model"], "model")); a.update(tensors(source["optimizer"], "optimizer"))
b = dict(tensors(exported["model"], "model")); b.update(tensors(exported["optimizer"], "optimizer"))
assert a.keys() == b.keys(), (sorted(a.keys() ^ b.keys()))
for key in a:
    x, y = a[key], b[key]
    assert x.dtype == y.dtype and x.shape == y.shape, key
    assert x.contiguous().view(-1).view(torch.uint8).equal(
        y.contiguous().view(-1).view(torch.uint8)), key
print(len(a))
'''


def add_args(parser):
    parser.add_argument("--jobs", type=int, default=2,
                        help="trials run in parallel (default 2)")
    parser.add_argument("--exclude", action="append", default=[], metavar="KIND:OPERATION",
                        help="leave out one damage, e.g. wal:truncate (repeatable): for a known, "
                             "documented open finding, so a short run still guards the rest; the "
                             "table's notes list what was left out")


class HarnessError(Exception):
    pass


def _files_of_kind(store, kind):
    names = sorted(os.listdir(store))
    if kind == "pack":
        packs = os.path.join(store, "packs")
        return [os.path.join("packs", n) for n in sorted(os.listdir(packs)) if n.endswith(".pack")]
    if kind == "sst":
        return [n for n in names if n.endswith(".sst")]
    if kind == "manifest":
        return [n for n in names if n.startswith("MANIFEST-")]
    if kind == "current":
        return ["CURRENT"]
    if kind == "wal":
        return [n for n in names if n.endswith(".log")]
    if kind == "options":
        return [n for n in names if n.startswith("OPTIONS-")]
    if kind == "marker":
        return [n for n in names if n == "CKPT-ACKNOWLEDGED"]
    raise ValueError(kind)


def _damage(path, operation, rng):
    """Applies `operation` to the file at `path`; returns a description."""
    size = os.path.getsize(path)
    if operation == "delete" or size == 0:
        os.remove(path)
        return "deleted"
    if operation == "truncate":
        length = rng.randrange(0, size)
        os.truncate(path, length)
        return f"truncated {size} -> {length} bytes"
    offset = rng.randrange(0, size)
    mask = rng.randrange(1, 256)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))
    return f"byte {offset} of {size} xor 0x{mask:02x}"


def _read_back(lib, store, versions, reference, trial_dir):
    """Exports each version; returns {version: "equal" | "differs" | Result(failed)}."""
    outcome = {}
    for version in versions:
        out = os.path.join(trial_dir, f"export{version}.pt")
        result = lib.ckpt(["export", f"{MODEL}@{version}", out, "--bundle"], store_dir=store)
        if result.ok:
            with open(out, "rb") as f:
                outcome[version] = "equal" if f.read() == reference[version] else "differs"
            os.remove(out)
        else:
            outcome[version] = result
    return outcome


def _build_template(lib, table):
    src = os.path.join(lib.work_dir, "src")
    os.makedirs(src)
    made = lib.run([lib.python, "-c", _GENERATE, src, str(VERSIONS)], timeout=300)
    if not made.ok:
        raise HarnessError(f"generating the torch files: {made.describe()}")
    template = os.path.join(lib.work_dir, "template")
    for version in range(1, VERSIONS + 1):
        extra = ["--alias", "best"] if version == VERSIONS else []
        imported = lib.ckpt(["import", os.path.join(src, f"v{version}.pt"), "--model", MODEL,
                             *extra], store_dir=template)
        if not imported.ok:
            raise HarnessError(f"building the template: {imported.describe()}")
    kinds = {kind: _files_of_kind(template, kind) for kind in KINDS}
    missing = [kind for kind, files in kinds.items() if not files]
    if missing:
        raise HarnessError(f"the template has no {', '.join(missing)} files: {kinds}")
    # The reference reads, from a copy (opening the template would flush its WAL into an SST).
    probe = os.path.join(lib.work_dir, "probe")
    shutil.copytree(template, probe)
    reference = {}
    for version in range(1, VERSIONS + 1):
        out = os.path.join(lib.work_dir, f"reference{version}.pt")
        exported = lib.ckpt(["export", f"{MODEL}@{version}", out, "--bundle"], store_dir=probe)
        if not exported.ok:
            raise HarnessError(f"reference export: {exported.describe()}")
        compared = lib.run([lib.python, "-c", _COMPARE, os.path.join(src, f"v{version}.pt"), out],
                           timeout=300)
        if not compared.ok:
            raise HarnessError(f"the reference export of version {version} differs from its "
                               f"source: {compared.describe()}")
        with open(out, "rb") as f:
            reference[version] = f.read()
    again = os.path.join(lib.work_dir, "again.pt")
    if not lib.ckpt(["export", f"{MODEL}@1", again, "--bundle"], store_dir=probe).ok or \
            open(again, "rb").read() != reference[1]:
        raise HarnessError("two exports of one version differ: byte comparison cannot work")
    shutil.rmtree(probe)
    table.note("Template: " + ", ".join(f"{len(files)} {kind}" for kind, files in kinds.items())
               + f" files; {VERSIONS} versions (Adam state, shared chunks), each exported and "
               "checked bit-exact against its torch.save source with torch.")
    return template, reference


def _trial(lib, table, template, reference, number, kind, target, operation, seed):
    row = table.row(kind)
    trial_dir = os.path.join(lib.work_dir, f"trial{number}")
    store = os.path.join(trial_dir, "store")
    shutil.copytree(template, store)
    what = f"trial {number}: {target} " + _damage(os.path.join(store, target), operation,
                                                    random.Random(seed))
    row.add("trials")

    def crashed(result):
        if result.crashed:
            row.fail("crashes", f"{what}: {result.describe()}")
            return True
        return False

    verify = lib.ckpt(["verify"], store_dir=store)
    row.saw_rss(verify.max_rss_mib)
    if crashed(verify):
        return
    unopenable = not verify.ok and "ckpt repair" in verify.stderr
    if unopenable:
        _repair_trial(lib, row, store, reference, what, kind, crashed)
        shutil.rmtree(trial_dir, ignore_errors=True)
        return
    outcome = _read_back(lib, store, range(1, VERSIONS + 1), reference, trial_dir)
    if any(not isinstance(o, str) and crashed(o) for o in outcome.values()):
        return
    differs = [v for v, o in outcome.items() if o == "differs"]
    if differs:
        row.fail("silent", f"{what}: versions {differs} read back different bytes without an "
                           f"error (verify: {verify.stdout.strip()[-200:]})")
        return
    failed = {v: o for v, o in outcome.items() if not isinstance(o, str)}
    if verify.ok and any("NOT_FOUND" in o.stderr for o in failed.values()):
        row.fail("lost", f"{what}: verify passed but " + "; ".join(
            o.stderr.strip() for o in failed.values()))
        return
    if verify.ok and not failed:
        _bump(row, "harmless")
    else:
        row.add("detected")
        if not verify.ok:
            _bump(row, "by verify")
        else:
            _bump(row, "by read only")
    shutil.rmtree(trial_dir, ignore_errors=True)


def _repair_trial(lib, row, store, reference, what, kind, crashed):
    row.add("detected")
    _bump(row, "unopenable")
    repair = lib.ckpt(["repair"], store_dir=store)
    row.saw_rss(repair.max_rss_mib)
    if crashed(repair):
        return
    if not repair.ok:
        row.fail("lost", f"{what}: the repair failed: {repair.describe()}")
        return
    kept = [int(v) for v in re.findall(rf"^kept {MODEL}@(\d+)$", repair.stdout, re.M)]
    if kind in METADATA_KINDS and len(kept) < VERSIONS:
        row.fail("lost", f"{what}: the repair kept only versions {kept}: {repair.stdout[-400:]}")
        return
    _bump(row, "versions dropped", VERSIONS - len(kept))
    trial_dir = os.path.dirname(store)
    outcome = _read_back(lib, store, kept, reference, trial_dir)
    if any(not isinstance(o, str) and crashed(o) for o in outcome.values()):
        return
    bad = {v: o for v, o in outcome.items() if o != "equal"}
    if any(o == "differs" for o in bad.values()):
        row.fail("silent", f"{what}: after repair, versions {sorted(bad)} read back different "
                           "bytes")
        return
    if bad:
        row.fail("lost", f"{what}: the repair kept versions it cannot read: " + "; ".join(
            o.stderr.strip()[-200:] for o in bad.values()))
        return
    verify = lib.ckpt(["verify"], store_dir=store)
    if crashed(verify):
        return
    if not verify.ok:
        row.fail("lost", f"{what}: verify fails after the repair: {verify.describe()}")
        return
    _bump(row, "repaired")


_bump_lock = threading.Lock()


def _bump(row, column, n=1):
    with _bump_lock:
        row.extra[column] = (row.extra.get(column) or 0) + n


def run(args, lib):
    import soak_lib
    table = soak_lib.Table("corruption", extra_columns=(
        "harmless", "by verify", "by read only", "unopenable", "repaired", "versions dropped"))
    for kind in KINDS:
        row = table.row(kind)
        for column in table.extra_columns:
            row.extra[column] = 0
    template, reference = _build_template(lib, table)
    files = {kind: _files_of_kind(template, kind) for kind in KINDS}
    jobs = max(1, getattr(args, "jobs", 2))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        pending = set()
        excluded = set(getattr(args, "exclude", []))
        for pair in excluded:
            kind_name, _, operation_name = pair.partition(":")
            if kind_name not in KINDS or operation_name not in OPERATIONS:
                raise HarnessError(f"--exclude {pair}: expected KIND:OPERATION with KIND in "
                                   f"{KINDS} and OPERATION in {OPERATIONS}")
        if len(excluded) >= len(KINDS) * len(OPERATIONS):
            raise HarnessError("--exclude leaves no damage to try")
        if excluded:
            table.note(f"Left out (--exclude): {', '.join(sorted(excluded))}.")
        number = -1
        for _ in range(args.trials):
            if lib.out_of_time():
                table.stop_early(f"the --max_minutes budget was reached after {number + 1} "
                                 f"trials")
                break
            # Drawn here, in trial order, so a seed repeats whatever the threads do.
            number += 1
            while (f"{KINDS[number % len(KINDS)]}:"
                   f"{OPERATIONS[(number // len(KINDS)) % len(OPERATIONS)]}") in excluded:
                number += 1
            kind = KINDS[number % len(KINDS)]
            target = lib.rng.choice(files[kind])
            operation = OPERATIONS[(number // len(KINDS)) % len(OPERATIONS)]
            seed = lib.rng.randrange(1 << 30)
            pending.add(pool.submit(_trial, lib, table, template, reference, number, kind,
                                    target, operation, seed))
            if len(pending) >= jobs:
                done, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    future.result()
        for future in concurrent.futures.as_completed(pending):
            future.result()
    table.note("detected = verify reported problems, or the store refused to open with DATA_LOSS "
               "naming `ckpt repair` (unopenable: then repaired, every kept version read back "
               "byte-equal and verify passed), or a read failed with a clear error; harmless = "
               "verify passed and every version read back byte-equal to its source; versions "
               "dropped = versions the repair removed after damage to a file holding their data "
               "(SST, WAL); a drop after damage to CURRENT, MANIFEST, OPTIONS or the marker "
               "counts as lost.")
    return table
