"""ckpt_fuzz_target: one fuzz target, two ways to run it.

- `bazel build --config=libfuzzer //...:NAME` (clang, AddressSanitizer + UBSan, libFuzzer's main)
  makes a real coverage-guided fuzzer; tools/fuzz/run_fuzzers.sh builds and runs them.
- In the ordinary build, NAME links fuzz_driver.cc instead of libFuzzer, and NAME_regression is a
  test that replays real-PyTorch seed files plus deterministic mutations (truncations, byte flips)
  through the target: a bounded smoke run in every `bazel test //...`.

The target's source defines `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`.
"""

load("//tools/build_defs:cc.bzl", "CKPT_DEFAULT_COPTS")

def ckpt_fuzz_target(name, srcs, deps, seed_script, mutations_per_seed = 200):
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
        args = [
            "--seed_script=$(location %s)" % seed_script,
            "--mutations_per_seed=%d" % mutations_per_seed,
        ],
        data = [seed_script],
        deps = deps + ["//libs/format/fuzz:fuzz_driver"],
    )
