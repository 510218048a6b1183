#!/usr/bin/env bash
# Installs exactly the Debian 12 packages that ckpt's build and tests need.
# Idempotent: when every package is already installed it says so and runs no apt-get at all.
set -euo pipefail

packages=(
  # Build system (Bazel 4.2.3, offline) and the JDK it runs on.
  bazel-bootstrap default-jdk-headless
  # C++ libraries the code links against (libgloo-dev: headers that c10d's ProcessGroupGloo.hpp includes).
  libtorch-dev libgloo-dev librocksdb-dev libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libgtest-dev libgmock-dev libxxhash-dev libzstd-dev zlib1g-dev libssl-dev nlohmann-json3-dev
  # etcd: the writer lease of several stores on one bucket (libs/ha), a real one in tests.
  etcd-server
  # HTTP(S) for the S3 client in libs/s3 (the OpenSSL flavour, like the rest of the TLS code).
  libcurl4-openssl-dev
  # The console's HTTP server (services/console); curl drives its API in tests.
  libcpp-httplib-dev curl
  # The console's page in a real headless browser in tests (tests/console_browser.py).
  chromium chromium-driver python3-selenium
  # Real PyTorch as a peer in interop tests (/usr/bin/python3).
  python3-torch python3-numpy
  # torchvision models (ResNet-18) scripted as a team would bring them to the trainer.
  python3-torchvision
  # A Python gRPC client of the loader in tests (stubs generated with protoc and
  # /usr/bin/grpc_python_plugin from protobuf-compiler-grpc).
  python3-grpcio python3-protobuf
  # XXH3-64, for the Python client's check of every Export piece (ExportResponse.xxh3_64).
  python3-xxhash
  # `pip install ./clients/python` into a venv, offline (clients/python:install_test).
  python3-venv python3-pip python3-setuptools python3-wheel
  # The openssl command line: tests make their TLS certificates with it.
  openssl
  # A real S3 server for the S3 client's tests: Debian's Ceph (a monitor, one memstore OSD and
  # radosgw, started per test by tools/ceph/single_node.sh on 127.0.0.1; ~70 s to install).
  ceph-mon ceph-osd radosgw ceph-common uuid-runtime
  # libFuzzer and the sanitizers for the parser fuzz targets.
  clang libclang-rt-14-dev
  # The CMake build that tools/gpu_check.sh uses on machines without Bazel (CI runs its CPU mode).
  cmake ninja-build
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages already installed; nothing to do."
  exit 0
fi

echo "install_deps: installing ${#missing[@]} missing package(s): ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install_deps: done."
