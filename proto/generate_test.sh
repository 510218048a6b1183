#!/bin/sh
# proto/generate.sh from a copy of the folder, as a team makes one: Python code generated from it
# imports and knows every service.
set -eu
copy="$TEST_TMPDIR/elsewhere"
rm -rf "$copy"
mkdir -p "$copy"
cp -rL proto "$copy/"            # regular files, not the runfiles' links
find "$copy/proto" -name '*.sh' ! -name generate.sh -delete
"$copy/proto/generate.sh" python "$TEST_TMPDIR/generated"
cd "$TEST_TMPDIR"
PYTHONPATH="$TEST_TMPDIR/generated" /usr/bin/python3 - <<'PY'
from proto.ckpt.v1 import (checkpoint_store_pb2_grpc, identity_pb2_grpc, loader_pb2,
                           loader_pb2_grpc, trainer_pb2_grpc)
from proto.grpc.reflection.v1 import reflection_pb2_grpc
services = {name for module in (loader_pb2,) for name in module.DESCRIPTOR.services_by_name}
assert services == {"Loader"}, services
for module, stub in ((checkpoint_store_pb2_grpc, "CheckpointStoreStub"),
                     (loader_pb2_grpc, "LoaderStub"), (trainer_pb2_grpc, "TrainerStub"),
                     (identity_pb2_grpc, "IdentityStub"),
                     (reflection_pb2_grpc, "ServerReflectionStub")):
    assert hasattr(module, stub), (module.__name__, stub)
request = loader_pb2.LoadRequest()
request.ref.model = "resnet"
assert loader_pb2.LoadRequest.FromString(request.SerializeToString()).ref.model == "resnet"
print("OK")
PY
# Run from anywhere but inside a folder named proto/, it says why.
mkdir -p "$TEST_TMPDIR/misplaced"
cp "$copy/proto/generate.sh" "$TEST_TMPDIR/misplaced/"
if "$TEST_TMPDIR/misplaced/generate.sh" python "$TEST_TMPDIR/x" 2>"$TEST_TMPDIR/err"; then
  echo "expected a refusal outside proto/" >&2
  exit 1
fi
grep -q "must stay in the folder named proto/" "$TEST_TMPDIR/err"
