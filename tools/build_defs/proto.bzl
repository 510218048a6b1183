"""ckpt_proto_library: .proto -> C++ messages + gRPC services with Debian's protoc and plugin.

Bazel 4.2.3 offline has no rules_proto / grpc repositories, so a genrule runs
/usr/bin/protoc with /usr/bin/grpc_cpp_plugin. Proto files import each other by their path from
the workspace root (`import "proto/ckpt/v1/types.proto";`), and generated headers are included
the same way (`#include "proto/ckpt/v1/types.pb.h"`).

Example:
    ckpt_proto_library(
        name = "checkpoint_store_proto",
        srcs = ["checkpoint_store.proto"],
        deps = [":types_proto"],
    )
makes :checkpoint_store_proto, a cc_library with checkpoint_store.pb.h and
checkpoint_store.grpc.pb.h.
"""

def ckpt_proto_library(name, srcs, deps = [], visibility = None):
    """Generates and compiles C++ message and service code for `srcs`.

    Args:
      name: the cc_library's name; NAME_sources is a filegroup of the .proto files (with deps').
      srcs: .proto files in this package.
      deps: other ckpt_proto_library targets whose .proto files `srcs` import.
      visibility: of the cc_library and the filegroup.
    """
    stems = [src[:-len(".proto")] for src in srcs]
    outs = []
    for stem in stems:
        outs += [stem + ".pb.h", stem + ".pb.cc", stem + ".grpc.pb.h", stem + ".grpc.pb.cc"]

    native.filegroup(
        name = name + "_sources",
        srcs = srcs + [dep + "_sources" for dep in deps],
        visibility = visibility,
    )

    native.genrule(
        name = name + "_codegen",
        srcs = srcs + [name + "_sources"],
        outs = outs,
        cmd = " ".join([
            "/usr/bin/protoc",
            "-I.",
            "--cpp_out=$(GENDIR)",
            "--grpc_out=$(GENDIR)",
            "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin",
        ] + ["$(location %s)" % src for src in srcs]),
        message = "Generating C++ and gRPC code for " + ", ".join(srcs),
    )

    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + [
            "//third_party:grpc",
            "//third_party:protobuf",
        ],
        visibility = visibility,
    )
