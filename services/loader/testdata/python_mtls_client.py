"""A Python team's client over mutual TLS, with nothing but python3-grpcio and protoc.

  python_mtls_client.py ADDRESS CA CERT KEY MODEL FIXTURE_DIR GEN_DIR

Lists the server's services through gRPC reflection (as grpcurl would), then loads MODEL with its
client certificate (no token) and checks it against FIXTURE_DIR/reference.pt. Without a client
certificate the handshake must fail. Prints OK.
"""
import os
import subprocess
import sys

import torch

import python_client


def list_services(channel, gen_dir):
    subprocess.run(["protoc", f"-I{os.path.dirname(os.path.abspath(__file__))}",
                    f"--python_out={gen_dir}", f"--grpc_python_out={gen_dir}",
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    "reflection_v1alpha.proto"], check=True)
    import reflection_v1alpha_pb2 as pb2
    import reflection_v1alpha_pb2_grpc as pb2_grpc
    stub = pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([pb2.ServerReflectionRequest(list_services="")]),
                                          timeout=30)
    return sorted(s.name for r in responses for s in r.list_services_response.service)


def main():
    address, ca, cert, key, model, fixture_dir, gen_dir = sys.argv[1:8]
    import grpc
    stub, loader_pb2, types_pb2 = python_client.connect(address, gen_dir, ca, cert, key)

    services = list_services(python_client.open_channel(address, ca, cert, key), gen_dir)
    for expected in ["ckpt.v1.Loader", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection",
                     "grpc.reflection.v1.ServerReflection"]:
        assert expected in services, services

    manifest, state = python_client.load(stub, types_pb2, loader_pb2, model, None,
                                         loader_pb2.LoadTarget())
    reference = torch.load(os.path.join(fixture_dir, "reference.pt"))
    assert list(state) == list(reference), (list(state), list(reference))
    for name, tensor in reference.items():
        assert torch.equal(state[name], tensor), name

    # TLS without a client certificate: the server refuses the handshake.
    anonymous, _, _ = python_client.connect(address, gen_dir, ca)
    try:
        list(anonymous.Load(loader_pb2.LoadRequest(ref=types_pb2.VersionRef(model=model)),
                            timeout=10))
        raise SystemExit("expected the handshake to fail without a client certificate")
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    print("OK")


if __name__ == "__main__":
    main()
