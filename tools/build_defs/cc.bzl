"""Shared C++ rules for ckpt: one place for copts and test defaults.

Use these instead of native cc_* rules so every target builds with the same warnings, and every
test links GoogleTest with the project's main (like abseil's ABSL_DEFAULT_COPTS).
"""

CKPT_DEFAULT_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    # LibTorch's headers trip this one on GCC 12; ours are clean without it.
    "-Wno-missing-field-initializers",
]

def ckpt_cc_library(name, copts = [], **kwargs):
    native.cc_library(
        name = name,
        copts = CKPT_DEFAULT_COPTS + copts,
        **kwargs
    )

def ckpt_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = CKPT_DEFAULT_COPTS + copts,
        **kwargs
    )

def ckpt_cc_test(name, copts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest test. Links gtest_main unless the test brings its own main."""
    native.cc_test(
        name = name,
        copts = CKPT_DEFAULT_COPTS + copts,
        deps = deps + ["//third_party:gtest_main"],
        size = size,
        **kwargs
    )
