"""ckpt_fuzz_target: one fuzz target, two ways to run it.

- `bazel build --config=libfuzzer //...:NAME` (clang, AddressSanitizer + UBSan, libFuzzer's main)
  makes a real coverage-guided fuzzer; tools/fuzz/run_fuzzers.sh builds and runs them.
- In the ordinary build, NAME links fuzz_driver.cc instead of libFuzzer, and NAME_regression is a
  test that replays real-PyTorch seed files plus deterministic mutations (truncations, byte flips)
  through the target: a bounded smoke run in every `bazel test //...`.

The target's source defines `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`.

Seeds come from `seed_script` (run by /usr/bin/python3 with the seed directory) or from
`seed_generator`, a cc_binary run as `GENERATOR DIR SEED_ARGS...`; `seed_args` may use
$(location) of labels in `seed_data`.
"""

load("//tools/build_defs:cc.bzl", "CKPT_DEFAULT_COPTS")

def ckpt_fuzz_target(
        name,
        srcs,
        deps,
        seed_script = None,
        seed_generator = None,
        seed_args = [],
        seed_data = [],
        mutations_per_seed = 200):
    if seed_generator:
        seed_flags = ["--seed_generator=$(location %s)" % seed_generator]
        seed_flags += ["--seed_arg=%s" % arg for arg in seed_args]
        seed_files = [seed_generator] + seed_data
    else:
        seed_flags = ["--seed_script=$(location %s)" % seed_script]
        seed_files = [seed_script]
    native.cc_binary(
        name = name,
        srcs = srcs,
        copts = CKPT_DEFAULT_COPTS,
        linkopts = select({
            "//tools/build_defs:libfuzzer_build": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//tools/build_defs:libfuzzer_build": [],
            "//conditions:default": ["//libs/format/fuzz:fuzz_driver"],
        }),
        testonly = 1,
    )
    native.cc_test(
        name = name + "_regression",
        size = "small",
        srcs = srcs,
        copts = CKPT_DEFAULT_COPTS,
        args = seed_flags + ["--mutations_per_seed=%d" % mutations_per_seed],
        data = seed_files,
        deps = deps + ["//libs/format/fuzz:fuzz_driver"],
    )
