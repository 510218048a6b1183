#!/usr/bin/env python3
"""Prints CMake set() commands describing the LibTorch of the PyTorch this interpreter imports.

tools/cmake/CMakeLists.txt runs it at configure time instead of find_package(Torch): TorchConfig
of a CUDA wheel insists on a full CUDA toolkit (nvcc, nvrtc, CMake's FindCUDAToolkit knowing the
CUDA version), while building ckpt only needs LibTorch's headers and libraries plus the CUDA
runtime's and NCCL's headers, which pip's nvidia-* packages or /usr/local/cuda supply. This is
the same split as Bazel's --config=cuda (third_party/libtorch/libtorch_configure.bzl).
"""

import glob
import os
import sys


def cmake_quote(value):
    return '"%s"' % str(value).replace("\\", "\\\\").replace('"', '\\"')


def emit(name, value):
    if isinstance(value, (list, tuple)):
        value = ";".join(value)
    print("set(%s %s)" % (name, cmake_quote(value)))


def nvidia_dirs():
    """Include and library folders of pip's nvidia-* packages (NCCL, CUDA runtime, ...)."""
    includes, libraries = [], []
    try:
        import nvidia  # namespace package installed by nvidia-*-cu1x wheels
        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    for root in roots:
        # cu12 wheels: nvidia/<component>/{include,lib}; cu13 wheels: nvidia/cu13/{include,lib}.
        for folder in sorted(glob.glob(os.path.join(root, "*", "include")) +
                             glob.glob(os.path.join(root, "*", "*", "include"))):
            includes.append(folder)
        for folder in sorted(glob.glob(os.path.join(root, "*", "lib")) +
                             glob.glob(os.path.join(root, "*", "*", "lib"))):
            libraries.append(folder)
    return includes, libraries


def main():
    try:
        import torch
    except Exception as error:  # an ImportError, or a broken install raising anything
        emit("CKPT_TORCH_ERROR", "%s cannot import torch: %s" % (sys.executable, error))
        return
    torch_dir = os.path.dirname(torch.__file__)
    library_dir = os.path.join(torch_dir, "lib")
    include_dirs = [os.path.join(torch_dir, "include"),
                    os.path.join(torch_dir, "include", "torch", "csrc", "api", "include")]
    cuda_libraries = all(os.path.exists(os.path.join(library_dir, name))
                         for name in ("libtorch_cuda.so", "libc10_cuda.so"))
    emit("CKPT_TORCH_VERSION", torch.__version__)
    emit("CKPT_TORCH_DIR", torch_dir)
    emit("CKPT_TORCH_INCLUDE_DIRS", include_dirs)
    emit("CKPT_TORCH_LIBRARY_DIR", library_dir)
    emit("CKPT_TORCH_CXX11_ABI", int(torch.compiled_with_cxx11_abi()))
    # c10d's Gloo header includes Gloo's: in torch/include/gloo, or the system's (libgloo-dev).
    emit("CKPT_TORCH_HAS_GLOO_HEADERS",
         int(os.path.isfile(os.path.join(include_dirs[0], "gloo", "algorithm.h"))))
    emit("CKPT_TORCH_CUDA_VERSION", torch.version.cuda or "")
    emit("CKPT_TORCH_HAS_CUDA_LIBRARIES", int(bool(torch.version.cuda) and cuda_libraries))
    includes, libraries = nvidia_dirs()
    emit("CKPT_NVIDIA_INCLUDE_DIRS", includes)
    emit("CKPT_NVIDIA_LIBRARY_DIRS", libraries)


if __name__ == "__main__":
    main()
