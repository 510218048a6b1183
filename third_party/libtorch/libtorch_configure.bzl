"""Repository rule exposing LibTorch's headers to Bazel.

Debian's libtorch-dev installs the C++ frontend headers below
/usr/include/torch/csrc/api/include, which no compiler searches by default, and `includes` can
only name paths inside a repository. This rule links those folders into an external repository:

  @NAME//:system_api_headers  Debian's LibTorch frontend headers (CPU build, Gloo).
  @NAME//:cuda_libtorch       a CUDA-enabled LibTorch at $CKPT_LIBTORCH_DIR or $LIBTORCH_HOME (--config=cuda).
                              Without that variable it is a target that fails with an explanation.
"""

_SYSTEM_API_INCLUDE = "/usr/include/torch/csrc/api/include"

_CUDA_MISSING_BUILD = """
genrule(
    name = "explain_missing_cuda_libtorch",
    outs = ["missing_cuda_libtorch.cc"],
    cmd = "echo '--config=cuda needs a CUDA-enabled LibTorch: set CKPT_LIBTORCH_DIR (or LIBTORCH_HOME) to its root " +
          "(the folder with include/ and lib/), e.g. the torch/ folder of a pip install.' >&2; exit 1",
)

cc_library(
    name = "cuda_libtorch",
    srcs = [":missing_cuda_libtorch.cc"],
    visibility = ["//visibility:public"],
)
"""

_CUDA_BUILD = """
cc_library(
    name = "cuda_libtorch",
    hdrs = glob(["cuda/include/**/*.h", "cuda/include/**/*.hpp", "cuda/include/**/*.cuh"]),
    includes = ["cuda/include", "cuda/include/torch/csrc/api/include"],
    defines = ["USE_C10D_GLOO", "USE_C10D_NCCL", "USE_CUDA"],
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-Wl,--push-state,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_cuda",
        "-lc10",
        "-lc10_cuda",
        "-Wl,--pop-state",
        "-L/usr/local/cuda/lib64",
        "-Wl,-rpath,/usr/local/cuda/lib64",
        "-lcudart",
    ],
    visibility = ["//visibility:public"],
)
"""

def _libtorch_configure_impl(ctx):
    ctx.symlink(_SYSTEM_API_INCLUDE, "system_api_include")
    build = """
cc_library(
    name = "system_api_headers",
    hdrs = glob(["system_api_include/**/*.h"]),
    includes = ["system_api_include"],
    visibility = ["//visibility:public"],
)
"""
    cuda_dir = ctx.os.environ.get("CKPT_LIBTORCH_DIR", "") or ctx.os.environ.get("LIBTORCH_HOME", "")
    if cuda_dir:
        ctx.symlink(cuda_dir + "/include", "cuda/include")
        build += _CUDA_BUILD.format(lib = cuda_dir + "/lib")
    else:
        build += _CUDA_MISSING_BUILD
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    ctx.file("BUILD", build)

libtorch_configure = repository_rule(
    implementation = _libtorch_configure_impl,
    environ = ["CKPT_LIBTORCH_DIR", "LIBTORCH_HOME"],
    local = True,
)
