#!/usr/bin/env bash
# Packs the Debian 12 libraries, headers and code generators that the CMake build needs besides
# LibTorch (gRPC, protobuf, Abseil, RocksDB, xxHash, zstd, zlib, OpenSSL, nlohmann-json, Gloo's headers,
# protoc and grpc_cpp_plugin, with every shared library they load) into one tarball, for a machine that has a
# CUDA PyTorch but none of Debian's -dev packages and no network: the GPU machine.
#
#   tools/cmake/deps_bundle.sh .gpu-deps/deps.tar.gz          # here, on Debian 12
#   tools/gpu_check.sh --deps .gpu-deps/deps.tar.gz ...       # there
#
# The tarball unpacks to include/, lib/ and bin/ (protoc and grpc_cpp_plugin as wrappers that find
# their libraries in lib/). CMake takes it as -DCKPT_DEPS_PREFIX=DIR: headers from DIR/include come
# before LibTorch's, and the binaries carry DIR/lib as their RPATH, so they run there with no
# LD_LIBRARY_PATH. glibc, libstdc++ and libgcc_s are not packed: the target's own are newer
# (Debian 12 builds against glibc 2.36), and a second libstdc++ would clash with LibTorch's.
set -euo pipefail

if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -eq 1 ]] && exit 0
  exit 2
fi
out="$(realpath -m "$1")"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
multiarch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
libdir="/usr/lib/$multiarch"

stage="$(mktemp -d /tmp/ckpt-deps-bundle.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/include" "$stage/lib" "$stage/bin" "$stage/libexec"

# Every -lNAME that sources.cmake links (the same list Bazel's third_party/BUILD uses).
mapfile -t names < <(sed -n '/_SYSTEM_LIBRARIES/,/)/p' "$repo/tools/cmake/sources.cmake" |
  grep -v '_SYSTEM_LIBRARIES' | tr -d ')' | tr -s ' \t' '\n' | grep -E '^[A-Za-z0-9_+]+$' | sort -u)
roots=()
for name in "${names[@]}"; do
  if [[ ! -e "$libdir/lib$name.so" ]]; then
    echo "deps_bundle: $libdir/lib$name.so is missing: run tools/install_deps.sh first" >&2
    exit 1
  fi
  roots+=("$(readlink -f "$libdir/lib$name.so")")
done
for tool in protoc grpc_cpp_plugin; do
  command -v "$tool" >/dev/null || { echo "deps_bundle: $tool is not installed" >&2; exit 1; }
  roots+=("$(readlink -f "$(command -v "$tool")")")
done

# The shared-library closure, minus the C/C++ runtime the target brings itself.
is_runtime() {
  [[ "$(basename "$1")" =~ ^(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux.*)\.so ]]
}
declare -A packed=()
for root in "${roots[@]}"; do
  while read -r dependency; do
    dependency="$(readlink -f "$dependency")"
    is_runtime "$dependency" || packed["$dependency"]=1
  done < <(ldd "$root" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
  [[ "$root" == *.so* ]] && packed["$root"]=1
done

for library in "${!packed[@]}"; do
  # Installed under its SONAME (what the loader asks for), with the unversioned name beside it
  # for the linker.
  soname="$(objdump -p "$library" | awk '$1 == "SONAME" { print $2 }')"
  [[ -n "$soname" ]] || soname="$(basename "$library")"
  cp "$library" "$stage/lib/$soname"
  stem="${soname%%.so*}"
  [[ -e "$stage/lib/$stem.so" ]] || ln -s "$soname" "$stage/lib/$stem.so"
done

for tool in protoc grpc_cpp_plugin; do
  cp "$(readlink -f "$(command -v "$tool")")" "$stage/libexec/$tool"
  # protoc also needs the well-known .proto files, which sit in include/google/protobuf.
  extra=""
  # shellcheck disable=SC2016 # expanded by the wrapper, not here
  [[ "$tool" == protoc ]] && extra=' "-I$here/../include"'
  cat >"$stage/bin/$tool" <<EOF
#!/bin/sh
# Debian 12's $tool with its libraries from this bundle (tools/cmake/deps_bundle.sh).
here="\$(dirname "\$(readlink -f "\$0")")"
LD_LIBRARY_PATH="\$here/../lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/../libexec/$tool" "\$@"$extra
EOF
  chmod +x "$stage/bin/$tool"
done

# Headers: the folders and files our sources and these libraries' public headers include.
# gloo: a pip wheel ships no Gloo headers; CMake checks that these fit its ProcessGroupGloo.hpp.
for entry in absl google grpc grpcpp grpc++ rocksdb nlohmann openssl "$multiarch/openssl" "$multiarch/curl" gloo \
  xxhash.h zstd.h zstd_errors.h zdict.h zlib.h zconf.h; do
  if [[ ! -e "/usr/include/$entry" ]]; then
    echo "deps_bundle: /usr/include/$entry is missing: run tools/install_deps.sh first" >&2
    exit 1
  fi
  mkdir -p "$stage/include/$(dirname "$entry")"
  cp -r "/usr/include/$entry" "$stage/include/$entry"
done
# OpenSSL's configuration header lives in the multiarch folder; the target may not search it.
cp -n "/usr/include/$multiarch/openssl/"*.h "$stage/include/openssl/"
rm -rf "${stage:?}/include/$multiarch"

mkdir -p "$(dirname "$out")"
tar -C "$stage" -czf "$out" include lib bin libexec
echo "deps_bundle: ${#packed[@]} libraries, $(find "$stage/include" -type f | wc -l) headers -> $out ($(du -h "$out" | cut -f1))"
