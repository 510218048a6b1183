"""Finding (or generating) the ckpt.v1 message and service modules.

The generated code is never committed: it must match the protobuf runtime it runs on, and the
.proto files are the single source of truth. Where the modules come from, first match wins:

1. ``$CKPT_CLIENT_PROTO_DIR``: a directory holding plain ``protoc --python_out --grpc_python_out``
   output of the ckpt .proto files (``DIR/proto/ckpt/v1/*_pb2.py``).
2. ``ckpt_client/_generated/``: what ``pip install ./clients/python`` generated at build time
   (``setup.py`` calls ``run_protoc`` below), so an installed client needs no ``protoc``.
3. The Bazel genrule ``//clients/python:ckpt_v1_py_codegen`` output, which sits beside the
   package in the runfiles of anything that depends on ``//clients/python:ckpt_client``
   (``clients/python/gen/proto/ckpt/v1``).
4. A per-user cache, ``$XDG_CACHE_HOME/ckpt_client/<hash>/`` (``~/.cache/...``), filled on first
   use by running ``protoc`` with ``grpc_python_plugin`` over the .proto files; ``<hash>`` covers
   the .proto contents and the protoc version, so a changed API regenerates. The .proto files are
   looked up in ``$CKPT_CLIENT_PROTO_ROOT`` (a directory holding ``proto/ckpt/v1/``), else in the
   repository this package sits in (``clients/python/../../proto``), which is also where they are
   in Bazel runfiles.

The modules are loaded under the private package ``ckpt_client._pb`` rather than as
``proto.ckpt.v1``: ``proto`` is also the import name of the widely installed proto-plus package,
and a client library must not shadow (or be shadowed by) it. The generated files' own imports
(``from proto.ckpt.v1 import types_pb2``) are redirected to that package as each file is loaded.
"""
import hashlib
import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import types

# In dependency order: each file imports only files before it.
PROTO_FILES = ("types", "registry", "checkpoint_store", "loader")
_MODULES = tuple(f"{name}_pb2" for name in PROTO_FILES) + (
    "checkpoint_store_pb2_grpc", "loader_pb2_grpc")
_PACKAGE = "ckpt_client._pb"
_IMPORT = re.compile(rb"^from proto\.ckpt\.v1 import ", re.MULTILINE)
_PROTOC_PACKAGE = "protobuf-compiler-grpc"  # Debian: protoc and grpc_python_plugin.

_lock = threading.Lock()
_loaded = None


class StubsUnavailableError(ImportError):
    """The ckpt.v1 modules could neither be found nor generated; the message says what to do."""


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def _has_modules(directory):
    v1 = os.path.join(directory, "proto", "ckpt", "v1")
    return all(os.path.isfile(os.path.join(v1, module + ".py")) for module in _MODULES)


def _proto_root():
    """The directory holding proto/ckpt/v1/*.proto, or None."""
    candidates = []
    if os.environ.get("CKPT_CLIENT_PROTO_ROOT"):
        candidates.append(os.environ["CKPT_CLIENT_PROTO_ROOT"])
    # clients/python/ckpt_client -> the repository (or runfiles workspace) root.
    candidates.append(os.path.normpath(os.path.join(_package_dir(), "..", "..", "..")))
    for root in candidates:
        if all(os.path.isfile(os.path.join(root, "proto", "ckpt", "v1", name + ".proto"))
               for name in PROTO_FILES):
            return root
    return None


def _find_tool(name, fallback):
    found = shutil.which(name)
    if found:
        return found
    return fallback if os.path.isfile(fallback) else None


def _cache_home():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckpt_client")


def proto_sources():
    """The .proto files, relative to the proto root, in dependency order."""
    return [os.path.join("proto", "ckpt", "v1", name + ".proto") for name in PROTO_FILES]


def run_protoc(proto_root, out_dir):
    """Generates the ckpt.v1 modules of ``proto_root``'s .proto files into ``out_dir``
    (``out_dir/proto/ckpt/v1/``). Also setup.py's build step."""
    protoc, plugin = _tools()
    result = subprocess.run(
        [protoc, "-I.", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
         f"--plugin=protoc-gen-grpc_python={plugin}"] + proto_sources(),
        cwd=proto_root, capture_output=True, text=True)
    if result.returncode != 0:
        raise StubsUnavailableError(
            f"protoc failed generating ckpt_client's modules from {proto_root}: "
            f"{result.stderr.strip()}")


def _tools():
    """protoc and grpc_python_plugin, or StubsUnavailableError saying how to get them."""
    protoc = _find_tool("protoc", "/usr/bin/protoc")
    plugin = _find_tool("grpc_python_plugin", "/usr/bin/grpc_python_plugin")
    missing = [tool for tool, path in (("protoc", protoc), ("grpc_python_plugin", plugin))
               if path is None]
    if missing:
        raise StubsUnavailableError(
            f"ckpt_client needs {' and '.join(missing)} to generate its gRPC modules on first use "
            f"(Debian / Ubuntu: apt-get install {_PROTOC_PACKAGE}), or set CKPT_CLIENT_PROTO_DIR "
            "to a directory of generated modules (protoc --python_out --grpc_python_out over "
            "proto/ckpt/v1/*.proto)")
    return protoc, plugin


def _generate(proto_root):
    """Runs protoc into the per-user cache (once per API and protoc version); returns the dir."""
    protoc, _ = _tools()
    version = subprocess.run([protoc, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256(version.encode())
    for source in proto_sources():
        with open(os.path.join(proto_root, source), "rb") as f:
            digest.update(source.encode() + b"\0" + f.read() + b"\0")
    target = os.path.join(_cache_home(), digest.hexdigest()[:16])
    if _has_modules(target):
        return target
    os.makedirs(_cache_home(), exist_ok=True)
    # Generate beside the target and rename: concurrent first imports never see half a directory.
    scratch = tempfile.mkdtemp(prefix=".generating-", dir=_cache_home())
    try:
        run_protoc(proto_root, scratch)
        try:
            os.rename(scratch, target)
        except OSError:
            if not _has_modules(target):  # anything but "another process got there first"
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _locate():
    explicit = os.environ.get("CKPT_CLIENT_PROTO_DIR")
    if explicit:
        if not _has_modules(explicit):
            raise StubsUnavailableError(
                f"CKPT_CLIENT_PROTO_DIR={explicit} does not hold the generated ckpt.v1 modules "
                f"(expected {', '.join(m + '.py' for m in _MODULES)} under proto/ckpt/v1/)")
        return explicit
    installed = os.path.join(_package_dir(), "_generated")
    if _has_modules(installed):
        return installed
    bazel = os.path.normpath(os.path.join(_package_dir(), "..", "gen"))
    if _has_modules(bazel):
        return bazel
    root = _proto_root()
    if root is None:
        raise StubsUnavailableError(
            "ckpt_client cannot find proto/ckpt/v1/*.proto to generate its gRPC modules: set "
            "CKPT_CLIENT_PROTO_ROOT to the ckpt repository (the directory holding proto/), or "
            "CKPT_CLIENT_PROTO_DIR to a directory of already generated modules")
    return _generate(root)


def _load_from(directory):
    v1 = os.path.join(directory, "proto", "ckpt", "v1")
    package = types.ModuleType(_PACKAGE)
    package.__path__ = []  # a package, but nothing is found by path: each module is loaded here.
    package.__package__ = _PACKAGE
    sys.modules[_PACKAGE] = package
    loaded = {}
    try:
        for name in _MODULES:
            path = os.path.join(v1, name + ".py")
            with open(path, "rb") as f:
                source = _IMPORT.sub(b"from ckpt_client._pb import ", f.read())
            full_name = f"{_PACKAGE}.{name}"
            module = types.ModuleType(full_name)
            module.__file__ = path
            module.__package__ = _PACKAGE
            module.__loader__ = importlib.machinery.SourceFileLoader(full_name, path)
            sys.modules[full_name] = module
            exec(compile(source, path, "exec"), module.__dict__)
            setattr(package, name, module)
            loaded[name] = module
    except BaseException:
        for name in list(sys.modules):
            if name == _PACKAGE or name.startswith(_PACKAGE + "."):
                del sys.modules[name]
        raise
    return types.SimpleNamespace(directory=directory, **loaded)


def load():
    """The generated modules as a namespace (types_pb2, ..., loader_pb2_grpc); loaded once."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load_from(_locate())
        return _loaded
