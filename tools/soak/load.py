"""load: concurrent uploaders and loaders against one checkpoint_store service, for a bounded time.

One checkpoint_store service, and one loader service reading through it (--store=ADDRESS, as a
serving fleet would). For the campaign's duration (--trials seconds: 600 full, 40 short):
- U uploaders (--uploaders, default 2) each import torch files (three distinct ones, ~8 MB each,
  written by Debian's torch 1.13) into a model of their own with `ckpt import --store=...`, in a
  loop. Each import is a process, so its latency includes the CLI's start-up (about 1 s of loading
  libraries here): read the upload figures as "a CLI import end to end", not as the RPC alone;
- L loaders (--loaders, default 2) each, in a loop, pick an uploader's model and either load its
  latest version through the loader (the Python client's load_state_dict, which verifies every
  chunk) or export it as a torch file (verified per piece) and torch.load it.

Every tensor a loader gets is compared with the source files: it must equal one of them exactly
(a version is always one whole import), else the load counts as silent. Columns: trials = calls
made; detected = calls refused with RESOURCE_EXHAUSTED (deliberate backpressure, allowed); silent
= a load or export whose bytes match no source; crashes = a service that died, or a call that
failed for any other reason (the campaign allows no errors but backpressure); lost = an import
acknowledged to its uploader whose version is missing or differs at the end; torn = a version
listed at the end that matches no source. max RSS: the two services' peak (their memory must stay
bounded however long the load runs). Extra columns: calls per second and p50 / p99 latency.
"""

import os
import random
import threading
import time

DESCRIPTION = "U uploaders and L loaders/exporters against one store service: errors, p50/p99"
FULL_TRIALS = 600  # seconds of load
SHORT_TRIALS = 40
SOURCES = 3


def add_args(parser):
    parser.add_argument("--uploaders", type=int, default=2, help="concurrent `ckpt import` loops")
    parser.add_argument("--loaders", type=int, default=2, help="concurrent load/export loops")


_WRITE_SOURCES = r"""
import sys, torch
for i in range(int(sys.argv[2])):
    torch.manual_seed(1000 + i)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 10))
    torch.save(model.state_dict(), "%s/src%d.pt" % (sys.argv[1], i))
"""


def _sources(lib):
    """Writes the source files with Debian's torch; returns their state dicts (loaded here)."""
    result = lib.run([lib.python, "-c", _WRITE_SOURCES, lib.work_dir, str(SOURCES)], timeout=300)
    if not result.ok:
        raise RuntimeError(f"writing the source files failed: {result.describe()}")
    import torch  # pylint: disable=import-outside-toplevel
    return [torch.load(os.path.join(lib.work_dir, f"src{i}.pt")) for i in range(SOURCES)]


def _matches(state, sources):
    import torch  # pylint: disable=import-outside-toplevel
    for source in sources:
        if list(state.keys()) == list(source.keys()) and all(
                state[k].dtype == source[k].dtype and torch.equal(state[k], source[k])
                for k in source):
            return True
    return False


class _Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.latencies = {}  # operation -> [seconds]

    def add(self, operation, seconds):
        with self.lock:
            self.latencies.setdefault(operation, []).append(seconds)


def run(args, lib):
    import soak_lib  # pylint: disable=import-outside-toplevel
    table = soak_lib.Table("load", extra_columns=("calls/s", "p50 ms", "p99 ms"))
    sources = _sources(lib)
    store = lib.start_store(os.path.join(lib.work_dir, "db"))
    port_file = os.path.join(lib.work_dir, "loader.port")
    loader = lib.spawn([lib.binary("services/loader/loader"), f"--store={store.address}",
                        "--listen=127.0.0.1:0", f"--port_file={port_file}"], name="loader")
    deadline = time.monotonic() + 60
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if loader.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the loader service did not start: {loader.log_tail()}")
        time.sleep(0.01)
    loader_address = "127.0.0.1:" + open(port_file).read().strip()
    lib.stubs()  # puts clients/python on sys.path
    from ckpt_client import Client  # pylint: disable=import-outside-toplevel
    from ckpt_client import errors  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel

    models = [f"load-u{i}" for i in range(args.uploaders)]
    acknowledged = {model: {} for model in models}  # model -> {version: source index}
    stats = _Stats()
    end = time.monotonic() + min(args.trials, max(0.0, lib.remaining_seconds() - 60))
    rows = {name: table.row(name) for name in ("import (ckpt CLI)", "load", "export")}

    def unexpected(row, what):
        row.fail("crashes", what)

    def uploader(index):
        model = models[index]
        rng = random.Random(lib.seed * 31 + index)  # lib.rng is not shared across threads.
        while time.monotonic() < end:
            source = rng.randrange(SOURCES)
            started = time.monotonic()
            result = lib.ckpt(["import", os.path.join(lib.work_dir, f"src{source}.pt"),
                               f"--model={model}"], store=store.address, timeout=300)
            stats.add("import (ckpt CLI)", time.monotonic() - started)
            row = rows["import (ckpt CLI)"]
            row.add("trials")
            row.saw_rss(result.max_rss_mib)
            output = result.stdout + result.stderr
            if result.ok:
                version = _imported_version(output, model)
                if version is None:
                    unexpected(row, f"no version in ckpt import's output: {output[-300:]!r}")
                else:
                    acknowledged[model][version] = source
            elif "RESOURCE_EXHAUSTED" in output:
                row.add("detected")
            else:
                unexpected(row, f"ckpt import failed: {result.describe()}")

    def reader(index):
        client = Client(store=store.address, loader=loader_address, timeout=120)
        path = os.path.join(lib.work_dir, f"export{index}.pt")
        n = 0
        try:
            while time.monotonic() < end:
                n += 1
                model = models[(index + n) % len(models)]
                if not acknowledged[model]:
                    time.sleep(0.1)  # nothing imported yet
                    continue
                operation = "load" if n % 2 else "export"
                row = rows[operation]
                started = time.monotonic()
                try:
                    if operation == "load":
                        state = client.load_state_dict(model)
                    else:
                        client.export(model, path)
                        state = torch.load(path)
                except errors.ResourceExhausted:
                    row.add("trials")
                    row.add("detected")
                    continue
                except Exception as error:  # pylint: disable=broad-except
                    row.add("trials")
                    unexpected(row, f"{operation} {model}: {type(error).__name__}: {error}")
                    continue
                stats.add(operation, time.monotonic() - started)
                row.add("trials")
                if not _matches(state, sources):
                    row.fail("silent", f"{operation} of {model} matches none of the sources")
        finally:
            client.close()

    threads = [threading.Thread(target=uploader, args=(i,)) for i in range(args.uploaders)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(args.loaders)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started

    # The end state: every acknowledged import is there, whole; nothing else is.
    check = table.row("end state")
    with Client(store=store.address, loader=loader_address, timeout=300) as client:
        for model in models:
            for version, source in sorted(acknowledged[model].items()):
                check.add("trials")
                try:
                    state = client.load_state_dict(f"{model}@{version}")
                except Exception as error:  # pylint: disable=broad-except
                    check.fail("lost", f"{model}@{version} (acknowledged): {error}")
                    continue
                if not _matches(state, [sources[source]]):
                    check.fail("lost", f"{model}@{version} differs from src{source}.pt")
            listed = client.versions(model) if acknowledged[model] else []
            for info in listed:
                number = info.version
                if number not in acknowledged[model]:
                    check.fail("torn", f"{model}@{number} is listed but was never acknowledged")

    for process, name in ((loader, "loader"), (store, "checkpoint_store")):
        status = process.stop()
        if status not in (0, -15) and not process.killed_by_us:
            unexpected(check, f"the {name} service exited with {status}: {process.log_tail()}")
        for row in rows.values():
            row.saw_rss(process.max_rss_mib)
        table.note(f"{name} service peak RSS: {process.max_rss_mib or 0:.0f} MiB")

    for name, row in rows.items():
        values = stats.latencies.get(name, [])
        row.extra["calls/s"] = f"{len(values) / seconds:.2f}" if seconds else ""
        row.extra["p50 ms"] = f"{soak_lib.percentile(values, 0.5) * 1000:.0f}"
        row.extra["p99 ms"] = f"{soak_lib.percentile(values, 0.99) * 1000:.0f}"
    table.note(f"{args.uploaders} uploaders, {args.loaders} loaders, {seconds:.0f} s of load; "
               f"{sum(len(v) for v in acknowledged.values())} imports acknowledged. Import "
               f"latency includes the ckpt CLI's start-up; load and export are the Python "
               f"client's calls (verification included; export also torch.load's the file).")
    if seconds + 1 < args.trials:
        table.stop_early(f"--max_minutes left {seconds:.0f} s of the {args.trials} s asked for")
    return table


def _imported_version(output, model):
    """The N of 'MODEL@N' in ckpt import's output, or None."""
    marker = f"{model}@"
    at = output.rfind(marker)
    if at < 0:
        return None
    digits = ""
    for char in output[at + len(marker):]:
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None
