#!/bin/sh
# Generates ckpt's gRPC client (or server) code from this folder, wherever it was copied.
#
#   proto/generate.sh python OUT_DIR   # OUT_DIR/proto/ckpt/v1/*_pb2.py and *_pb2_grpc.py
#   proto/generate.sh cpp OUT_DIR      # OUT_DIR/proto/ckpt/v1/*.pb.{h,cc} and *.grpc.pb.{h,cc}
#
# Copy the whole `proto/` folder (ckpt/v1 and grpc/, keeping their paths): the files import each
# other as "proto/ckpt/v1/types.proto", so protoc's include root (-I) is the folder that holds
# `proto/`, never proto/ckpt/v1 itself. The same holds for any tool: grpc-js's proto-loader takes
# `includeDirs: [<that folder>]` and the file name "proto/ckpt/v1/loader.proto"; grpcurl takes
# `-import-path <that folder> -proto proto/ckpt/v1/loader.proto` (or reflection, with no files).
# Python's generated modules then import each other as `proto.ckpt.v1.types_pb2`, so OUT_DIR goes
# on sys.path. Needs protoc and the gRPC plugin for the language (Debian: protobuf-compiler-grpc;
# python3-grpc-tools' `python3 -m grpc_tools.protoc` is used when grpc_python_plugin is missing).
set -eu

if [ $# -ne 2 ] || { [ "$1" != python ] && [ "$1" != cpp ]; }; then
  echo "usage: $0 python|cpp OUT_DIR" >&2
  exit 2
fi
language=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")  # the folder that holds proto/: protoc's include root.
if [ "$(basename "$here")" != proto ]; then
  echo "$0: this script must stay in the folder named proto/ (its files import proto/...)" >&2
  exit 2
fi
mkdir -p "$out"
files=$(cd "$root" && ls proto/ckpt/v1/*.proto proto/grpc/health/v1/*.proto \
                          proto/grpc/reflection/v1/*.proto 2>/dev/null)

case $language in
  python)
    # __init__.py files, so `import proto.ckpt.v1.loader_pb2` works on Python's import path.
    for package in proto proto/ckpt proto/ckpt/v1 proto/grpc proto/grpc/health \
                   proto/grpc/health/v1 proto/grpc/reflection proto/grpc/reflection/v1; do
      mkdir -p "$out/$package"
      touch "$out/$package/__init__.py"
    done
    if command -v protoc >/dev/null && command -v grpc_python_plugin >/dev/null; then
      (cd "$root" && protoc -I. --python_out="$out" --grpc_python_out="$out" \
          --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" $files)
    else
      (cd "$root" && python3 -m grpc_tools.protoc -I. --python_out="$out" \
          --grpc_python_out="$out" $files)
    fi
    ;;
  cpp)
    (cd "$root" && protoc -I. --cpp_out="$out" --grpc_out="$out" \
        --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" $files)
    ;;
esac
echo "generated $language code for $(echo "$files" | wc -w) files under $out (include root: $root)"
