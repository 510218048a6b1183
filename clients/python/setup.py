"""Builds ckpt_client with its ckpt.v1 gRPC modules generated from the .proto files.

The metadata is in pyproject.toml; this file only adds the build step that runs protoc (through
ckpt_client/_stubs.py's run_protoc, the same code a source checkout runs on first import) into
the built package's _generated/ directory.
"""
import atexit
import importlib.util
import os
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _stubs():
    # Loaded by path: importing the package would import grpc and torch, which a build needs not.
    spec = importlib.util.spec_from_file_location(
        "_ckpt_client_stubs", os.path.join(HERE, "ckpt_client", "_stubs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithGrpcModules(build_py):
    """build_py, then the ckpt.v1 modules into <build_lib>/ckpt_client/_generated/."""

    def run(self):
        super().run()
        stubs = _stubs()
        root = os.environ.get("CKPT_CLIENT_PROTO_ROOT") or os.path.normpath(
            os.path.join(HERE, "..", ".."))
        missing = [source for source in stubs.proto_sources()
                   if not os.path.isfile(os.path.join(root, source))]
        if missing:
            raise SystemExit(
                f"ckpt-client: cannot find {', '.join(missing)} under {root}: build from a ckpt "
                "checkout (pip install ./clients/python) or set CKPT_CLIENT_PROTO_ROOT to the "
                "directory holding proto/")
        target = os.path.abspath(os.path.join(self.build_lib, "ckpt_client", "_generated"))
        os.makedirs(target, exist_ok=True)
        stubs.run_protoc(root, target)


# pip builds a local directory in place (since pip 21.3): build/ and ckpt_client.egg-info go to a
# scratch directory instead, removed when this build step ends, so `pip install ./clients/python`
# leaves the checkout exactly as it was.
_SCRATCH = tempfile.mkdtemp(prefix="ckpt-client-build-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)

setup(cmdclass={"build_py": BuildPyWithGrpcModules},
      options={"build": {"build_base": os.path.join(_SCRATCH, "build")},
               "egg_info": {"egg_base": _SCRATCH}})
