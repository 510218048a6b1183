"""soak: long, bounded reliability campaigns against the real binaries, on loopback only.

    bazel run //tools/soak -- CAMPAIGN [--trials N] [--seed S] [--short] [--max_minutes M]
                              [--work_dir DIR] [--bin_dir DIR] [--markdown_out FILE] [--keep]
    /usr/bin/python3 tools/soak/soak.py CAMPAIGN ...   (from a source tree, after bazel build)

Prints one markdown table per campaign (RELIABILITY.md explains the columns and records full
runs). Exit status: 0 when every trial was detected or harmless, 1 when any trial was silent,
lost, torn or crashed, 2 for bad arguments, 3 when the campaign itself failed (a harness error;
its traceback is printed).

--short is the CI form: a small trial count that still covers every scenario. --trials overrides
the count (of the campaign's main unit: kills, flips, ...). --max_minutes bounds the wall time;
a campaign that reaches it stops after the trial in progress and reports what it did (the table
says "Stopped early"), which is not a failure by itself.

The campaign contract. A campaign is the module tools/soak/CAMPAIGN.py and defines:

    DESCRIPTION = "one line for --help"
    FULL_TRIALS = 1000          # trial count of the full form
    SHORT_TRIALS = 30           # trial count of --short
    def add_args(parser): ...   # optional: campaign-specific flags (argparse)
    def run(args, lib) -> soak_lib.Table

`args.trials` is already resolved (--trials, else SHORT_TRIALS with --short, else FULL_TRIALS).
`lib` is a soak_lib.Soak: seeded RNG, time budget, binaries, children with peak RSS, the store
service, gRPC stubs, a scratch directory (see soak_lib's docstring). `run` must check
`lib.out_of_time()` between trials and call `table.stop_early(...)` when it stops for it; it may
raise only for harness errors (a failure of the system under test is a row count, not an
exception).
"""

import argparse
import importlib
import os
import shutil
import sys
import time
import traceback

sys.dont_write_bytecode = True  # campaigns run from the source tree leave no __pycache__.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import soak_lib  # noqa: E402  (after the path set-up above)

CAMPAIGNS = ("store_kill", "trainer_kill", "corruption", "disk_full", "load", "store_failover")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_HARNESS = 0, 1, 2, 3


def _campaign_module(name):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name == name:
            return None
        raise


def main(argv):
    known = [c for c in CAMPAIGNS if os.path.exists(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), c + ".py"))]
    parser = argparse.ArgumentParser(
        prog="soak", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", help=f"one of: {', '.join(known)}")
    parser.add_argument("--trials", type=int, default=0,
                        help="trial count (default: the campaign's full count, or its short "
                             "count with --short)")
    parser.add_argument("--seed", type=int, default=1, help="RNG seed (default 1)")
    parser.add_argument("--short", action="store_true", help="the short CI form")
    parser.add_argument("--max_minutes", type=float, default=0,
                        help="wall-clock budget; stop cleanly when reached (default: 10 with "
                             "--short, else none)")
    parser.add_argument("--work_dir", default="",
                        help="where scratch stores and logs go (default: a new temp dir)")
    parser.add_argument("--bin_dir", default="",
                        help="where the built binaries are (a bazel-bin); default: the Bazel "
                             "runfiles, else the repository's bazel-bin")
    parser.add_argument("--markdown_out", default="",
                        help="also append the table to this file")
    parser.add_argument("--keep", action="store_true",
                        help="keep the scratch directory (default: removed when nothing failed)")
    # Campaign flags are parsed in a second pass, once the campaign is known.
    first, _ = parser.parse_known_args(argv)
    if first.campaign not in CAMPAIGNS:
        parser.error(f"unknown campaign {first.campaign!r}; campaigns: {', '.join(known)}")
    module = _campaign_module(first.campaign)
    if module is None:
        parser.error(f"campaign {first.campaign!r} is not written yet (tools/soak/"
                     f"{first.campaign}.py); available: {', '.join(known)}")
    if hasattr(module, "add_args"):
        module.add_args(parser.add_argument_group(f"{first.campaign} options"))
    args = parser.parse_args(argv)
    # Under `bazel run` the working directory is the runfiles tree; relative paths the user gave
    # are relative to where they ran the command.
    user_dir = os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd())
    for name in ("work_dir", "bin_dir", "markdown_out"):
        value = getattr(args, name)
        if value:
            setattr(args, name, os.path.join(user_dir, os.path.expanduser(value)))
    if args.trials < 0:
        parser.error("--trials must not be negative")
    if not args.trials:
        args.trials = module.SHORT_TRIALS if args.short else module.FULL_TRIALS
    if not args.max_minutes and args.short:
        args.max_minutes = 10.0

    lib = soak_lib.Soak(args, first.campaign)
    print(f"soak {first.campaign}: {args.trials} trials, seed {args.seed}, "
          f"{'short' if args.short else 'full'} form, budget "
          f"{args.max_minutes or 'unbounded'} min, scratch {lib.work_dir}", flush=True)
    start = time.monotonic()
    table = None
    status = EXIT_OK
    try:
        table = module.run(args, lib)
    except KeyboardInterrupt:
        print("soak: interrupted", file=sys.stderr)
        status = EXIT_HARNESS
    except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
        status = EXIT_HARNESS
    finally:
        lib.cleanup()
    seconds = time.monotonic() - start
    if table is not None:
        table.note(f"Wall time {seconds:.0f} s; peak RSS of any child {lib.max_rss_mib:.0f} MiB;"
                   f" seed {args.seed}.")
        text = table.markdown()
        print(text, flush=True)
        if args.markdown_out:
            with open(args.markdown_out, "a") as f:
                f.write(text + "\n")
        if table.failed():
            status = EXIT_FAILED
    if status == EXIT_OK and not args.keep and not args.work_dir:
        shutil.rmtree(lib.work_dir, ignore_errors=True)
    else:
        print(f"soak: scratch kept in {lib.work_dir}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
