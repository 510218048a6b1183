"""A Python client of the ckpt loader: other teams are not all C++.

  python_client.py ADDRESS TOKEN MODEL FIXTURE_DIR GEN_DIR

Generates the ckpt.v1 messages and stubs with protoc and Debian's grpc_python_plugin into GEN_DIR,
loads MODEL (latest) through the loader's streaming Load with python3-grpcio, rebuilds each tensor
from the adapted manifest and the TensorData stream, loads it with strict=True into the unwrapped
fixture model, and checks it equals FIXTURE_DIR/reference.pt. Then asks for a bfloat16 subset and
checks the cast. Prints OK.

As a module, connect() and export_bundle() are what a Python team needs to resume training from a
stored version: export_bundle() streams the whole training bundle ({"epoch", "model",
"optimizer", "scheduler", ...}) into a file that torch.load reads, e.g.

    stub, loader_pb2, types_pb2 = connect("loader:7070", "/tmp/ckpt_stubs")
    export_bundle(stub, loader_pb2, types_pb2, "resnet", token, "resume.pt")
    bundle = torch.load("resume.pt")
    model.load_state_dict(bundle["model"]); optimizer.load_state_dict(bundle["optimizer"])
"""
import os
import subprocess
import sys

import torch

PROTOS = ["proto/ckpt/v1/types.proto", "proto/ckpt/v1/registry.proto",
          "proto/ckpt/v1/checkpoint_store.proto",
          "proto/ckpt/v1/loader.proto"]


def generate(gen_dir):
    os.makedirs(gen_dir, exist_ok=True)
    subprocess.run(["protoc", "-I.", f"--python_out={gen_dir}", f"--grpc_python_out={gen_dir}",
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin"] + PROTOS,
                   check=True)
    sys.path.insert(0, gen_dir)


def open_channel(address, ca_file=None, cert_file=None, key_file=None):
    """A channel to a ckpt server: plaintext without ca_file; TLS trusting ca_file; mutual TLS
    when cert_file and key_file (this client's certificate) are given too."""
    import grpc
    if ca_file is None:
        return grpc.insecure_channel(address)
    def read(path):
        with open(path, "rb") as f:
            return f.read()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(ca_file),
        private_key=read(key_file) if key_file else None,
        certificate_chain=read(cert_file) if cert_file else None)
    return grpc.secure_channel(address, credentials)


def connect(address, gen_dir, ca_file=None, cert_file=None, key_file=None):
    """A Loader stub (over open_channel's channel), and the generated message modules."""
    generate(gen_dir)
    from proto.ckpt.v1 import loader_pb2, loader_pb2_grpc, types_pb2
    channel = open_channel(address, ca_file, cert_file, key_file)
    return loader_pb2_grpc.LoaderStub(channel), loader_pb2, types_pb2


def export_bundle(stub, loader_pb2, types_pb2, model, token, path, ref=None):
    """Streams MODEL[@ref]'s whole training bundle (a torch .pt) into `path`, atomically; returns
    what the server left out (e.g. an opaque object it never writes back as code)."""
    version_ref = types_pb2.VersionRef(model=model)
    if ref is not None:
        version_ref.alias = ref
    request = loader_pb2.ExportRequest(
        ref=version_ref, format=loader_pb2.EXPORT_FORMAT_TORCH,
        target=loader_pb2.LoadTarget(include_optimizer_state=True, include_scheduler_state=True))
    stream = stub.Export(request, metadata=[("authorization", f"Bearer {token}")], timeout=120)
    partial = path + ".partial"
    total, left_out = None, []
    with open(partial, "wb") as out:
        for response in stream:
            if total is None:
                total, left_out = response.total_bytes, list(response.left_out)
            out.write(response.data)
        size = out.tell()
    if total is None or size != total:
        os.remove(partial)
        raise RuntimeError(f"Export of {model} ended after {size} of {total} bytes")
    os.replace(partial, path)
    return left_out


def load(stub, types_pb2, loader_pb2, model, token, target):
    request = loader_pb2.LoadRequest(ref=types_pb2.VersionRef(model=model), target=target)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    stream = stub.Load(request, metadata=metadata, timeout=60)
    manifest = None
    buffers = []
    for response in stream:
        if response.HasField("manifest"):
            assert manifest is None, "two manifests"
            manifest = response.manifest
            buffers = [bytearray(meta.byte_length) for meta in manifest.tensors]
            continue
        data = response.data
        buffers[data.tensor_index][data.offset:data.offset + len(data.data)] = data.data
    assert manifest is not None, "no manifest"
    dtypes = {types_pb2.DTYPE_FLOAT32: torch.float32, types_pb2.DTYPE_INT64: torch.int64,
              types_pb2.DTYPE_BFLOAT16: torch.bfloat16}
    state = {}
    for meta, buffer in zip(manifest.tensors, buffers):
        dtype = dtypes[meta.dtype]
        if len(buffer) == 0:
            tensor = torch.zeros(0, dtype=dtype)
        else:
            tensor = torch.frombuffer(buffer, dtype=dtype)
        state[meta.key] = tensor.reshape(list(meta.shape))
    return manifest, state


def main():
    address, token, model, fixture_dir, gen_dir = sys.argv[1:6]
    stub, loader_pb2, types_pb2 = connect(address, gen_dir)
    import grpc

    # Without the token the loader refuses.
    try:
        list(stub.Load(loader_pb2.LoadRequest(ref=types_pb2.VersionRef(model=model)), timeout=60))
        raise SystemExit("expected UNAUTHENTICATED without a token")
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error

    manifest, state = load(stub, types_pb2, loader_pb2, model, token, loader_pb2.LoadTarget())
    reference = torch.load(os.path.join(fixture_dir, "reference.pt"))
    assert list(state) == list(reference), (list(state), list(reference))
    for key, tensor in reference.items():
        assert state[key].dtype == tensor.dtype and torch.equal(state[key], tensor), key
    assert all(meta.original_device == "cuda:1" for meta in manifest.tensors)

    # A bfloat16 subset: only the first layer, cast on the server.
    target = loader_pb2.LoadTarget(cast_floating_to=types_pb2.DTYPE_BFLOAT16, include_prefixes=["0."])
    _, subset = load(stub, types_pb2, loader_pb2, model, token, target)
    assert sorted(subset) == ["0.bias", "0.weight"], list(subset)
    for key, tensor in subset.items():
        assert tensor.dtype == torch.bfloat16, key
        assert torch.equal(tensor, reference[key].to(torch.bfloat16)), key
    print("OK")


if __name__ == "__main__":
    main()
