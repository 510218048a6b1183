"""Repository rule exposing LibTorch's headers to Bazel.

Debian's libtorch-dev installs the C++ frontend headers below
/usr/include/torch/csrc/api/include, which no compiler searches by default, and `includes` can
only name paths inside a repository. This rule links those folders into an external repository:

  @NAME//:system_api_headers  Debian's LibTorch frontend headers (CPU build, Gloo).
  @NAME//:cuda_libtorch       a CUDA-enabled LibTorch at $CKPT_LIBTORCH_DIR or $LIBTORCH_HOME (--config=cuda),
                              with the CUDA toolkit ($CUDA_HOME, default /usr/local/cuda: headers and
                              libcudart) and NCCL ($NCCL_HOME; else the CUDA toolkit's, else pip's
                              nvidia/nccl next to the LibTorch). When any of them is missing, or the
                              LibTorch is a CPU build or has the other C++ ABI, it is a target that
                              fails with an explanation of what was looked for, where.
"""

_SYSTEM_API_INCLUDE = "/usr/include/torch/csrc/api/include"

# A target that fails at build time with `message` (the repository itself must load: it also
# serves the CPU build's headers).
_CUDA_MISSING_BUILD = """
genrule(
    name = "explain_missing_cuda_libtorch",
    outs = ["missing_cuda_libtorch.h"],
    cmd = "echo {message} >&2; exit 1",
)

# A header, so that every compile against it needs the genrule first and shows the explanation
# (a source would only fail its own action, after other compiles failed without it).
cc_library(
    name = "cuda_libtorch",
    hdrs = [":missing_cuda_libtorch.h"],
    visibility = ["//visibility:public"],
)
"""

_CUDA_BUILD = """
cc_library(
    name = "cuda_libtorch",
    # The toolkit's headers include extensionless ones (nv/target, cuda/std/...): take them all.
    hdrs = glob(["cuda/include/**/*.h", "cuda/include/**/*.hpp", "cuda/include/**/*.cuh",
                 "cuda_toolkit/include/**", "nccl/include/*.h"]),
    includes = ["cuda/include", "cuda/include/torch/csrc/api/include", "cuda_toolkit/include",
                "nccl/include"],
    defines = ["USE_C10D_GLOO", "USE_C10D_NCCL", "USE_CUDA", "CKPT_WITH_NCCL"],
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
        "-L{cuda_lib}",
        "-Wl,-rpath,{cuda_lib}",
        "-lcudart",
        "-L{nccl_lib}",
        "-Wl,-rpath,{nccl_lib}",
        "-lnccl",
    ],
    visibility = ["//visibility:public"],
)
"""

def _first_existing(ctx, candidates, relative):
    """The first directory of `candidates` holding `relative`, or None."""
    for candidate in candidates:
        if candidate and ctx.path(candidate + "/" + relative).exists:
            return candidate
    return None

def _shell_quote(text):
    # The message lands in a genrule command inside a double-quoted BUILD string.
    return "'" + text.replace("'", "").replace("\"", "") + "'"

def _cuda_build(ctx, libtorch_dir):
    """The BUILD text of @NAME//:cuda_libtorch: the library, or an explanation of what is missing."""
    problems = []
    lib = libtorch_dir + "/lib"
    if not ctx.path(libtorch_dir + "/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp").exists:
        problems.append("%s/include has no torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp (not a LibTorch root: " % libtorch_dir +
                        "give the folder holding include/ and lib/, e.g. site-packages/torch)")
    if not ctx.path(lib + "/libtorch_cuda.so").exists:
        problems.append("%s has no libtorch_cuda.so: that LibTorch is a CPU build" % lib)
    abi = ctx.execute(["grep", "-ho", "_GLIBCXX_USE_CXX11_ABI=[01]", libtorch_dir + "/share/cmake/Torch/TorchConfig.cmake"])
    if abi.return_code == 0 and "=0" in abi.stdout:
        problems.append("that LibTorch was built with -D_GLIBCXX_USE_CXX11_ABI=0, but Debian gRPC, protobuf and " +
                        "Abseil (which the same binaries link) use the C++11 ABI; use a LibTorch built with ABI 1 " +
                        "(PyTorch >= 2.7 wheels, or the cxx11-abi LibTorch download)")

    cuda_home = ctx.os.environ.get("CUDA_HOME", "") or "/usr/local/cuda"
    cuda_lib = _first_existing(ctx, [cuda_home + "/lib64", cuda_home + "/lib"], "libcudart.so")
    if not ctx.path(cuda_home + "/include/cuda_runtime_api.h").exists or not cuda_lib:
        problems.append("no CUDA toolkit at %s (looked for include/cuda_runtime_api.h and lib64/libcudart.so); " % cuda_home +
                        "set CUDA_HOME to it")

    site_packages = libtorch_dir + "/.."
    nccl_home = ctx.os.environ.get("NCCL_HOME", "")
    nccl_candidates = [nccl_home] if nccl_home else [cuda_home, site_packages + "/nvidia/nccl", "/usr"]
    nccl_include = _first_existing(ctx, nccl_candidates, "include/nccl.h")
    nccl_lib = None
    if nccl_include:
        nccl_lib = _first_existing(ctx, [nccl_include + "/lib64", nccl_include + "/lib", nccl_include + "/lib/x86_64-linux-gnu"], "libnccl.so")
        if not nccl_lib:
            nccl_lib = _first_existing(ctx, [nccl_include + "/lib64", nccl_include + "/lib"], "libnccl.so.2")
    if not nccl_include or not nccl_lib:
        problems.append("no NCCL (looked for include/nccl.h and lib/libnccl.so under %s); set NCCL_HOME" %
                        ", ".join([c for c in nccl_candidates if c]))

    if problems:
        message = "--config=cuda cannot build: " + "; ".join(problems) + "."
        return _CUDA_MISSING_BUILD.format(message = _shell_quote(message))

    ctx.symlink(libtorch_dir + "/include", "cuda/include")
    ctx.symlink(cuda_home + "/include", "cuda_toolkit/include")
    ctx.symlink(nccl_include + "/include", "nccl/include")
    return _CUDA_BUILD.format(lib = lib, cuda_lib = cuda_lib, nccl_lib = nccl_lib)

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
    libtorch_dir = ctx.os.environ.get("CKPT_LIBTORCH_DIR", "") or ctx.os.environ.get("LIBTORCH_HOME", "")
    if libtorch_dir:
        build += _cuda_build(ctx, libtorch_dir)
    else:
        build += _CUDA_MISSING_BUILD.format(message = _shell_quote(
            "--config=cuda needs a CUDA-enabled LibTorch: set CKPT_LIBTORCH_DIR (or LIBTORCH_HOME) to its root " +
            "(the folder with include/ and lib/), e.g. the torch/ folder of a pip install; CUDA_HOME (default " +
            "/usr/local/cuda) and NCCL_HOME (default: the CUDA toolkit, then pip's nvidia/nccl) for the rest.",
        ))
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    ctx.file("BUILD", build)

libtorch_configure = repository_rule(
    implementation = _libtorch_configure_impl,
    environ = ["CKPT_LIBTORCH_DIR", "LIBTORCH_HOME", "CUDA_HOME", "NCCL_HOME"],
    local = True,
)
