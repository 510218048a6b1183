"""The client as a team installs it: `pip install ./clients/python` into a fresh virtual
environment (--system-site-packages for Debian's torch, grpcio and protobuf; --no-build-isolation
and --no-index: offline, with Debian's setuptools), then used from outside the repository against
a real checkpoint_store and loader: a load through the loader, a manifest from the store, and an
alias set. The gRPC modules must come from inside the installed package (generated at build time), not
from protoc at run time nor from the repository.
"""
import glob
import os
import shutil
import subprocess
import textwrap
import time
import unittest

import torch

ROOT = os.getcwd()  # the runfiles root (tests/run_python.sh)
STORE_BIN = os.path.join(ROOT, "services/checkpoint_store/checkpoint_store")
LOADER_BIN = os.path.join(ROOT, "services/loader/loader")
CKPT_BIN = os.path.join(ROOT, "tools/ckpt/ckpt")
TMP = os.environ.get("TEST_TMPDIR") or "/tmp/ckpt_install_test"


def run(*args, **kwargs):
    result = subprocess.run(list(args), capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout[-4000:]}{result.stderr[-4000:]}")
    return result.stdout


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def start(name, binary, flags):
    """A service binary on 127.0.0.1, port 0; (process, address)."""
    port_file = os.path.join(TMP, f"{name}.port")
    log_path = os.path.join(TMP, f"{name}.log")
    with open(log_path, "ab") as log:
        process = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                                    "--shutdown_grace=1s"] + flags, stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not read_text(port_file):
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{name} did not start:\n{read_text(log_path)[-3000:]}")
        time.sleep(0.02)
    return process, f"127.0.0.1:{read_text(port_file)}"


class InstallTest(unittest.TestCase):
    def setUp(self):
        self.processes = []

    def tearDown(self):
        for process in reversed(self.processes):
            process.terminate()
            process.wait(timeout=15)

    def test_pip_install_then_load_and_change_from_outside_the_repository(self):
        # A checkout of just what the build reads: the package and the .proto files, as regular
        # files (Bazel's runfiles are symlinks into the source tree, which the build must not write).
        source = os.path.join(TMP, "checkout")
        shutil.rmtree(source, ignore_errors=True)
        package = os.path.join(source, "clients", "python")
        shutil.copytree(os.path.join(ROOT, "clients", "python", "ckpt_client"),
                        os.path.join(package, "ckpt_client"))
        for name in ("pyproject.toml", "setup.py", "README.md"):
            shutil.copy(os.path.join(ROOT, "clients", "python", name), package)
        os.makedirs(os.path.join(source, "proto", "ckpt", "v1"))
        for proto in glob.glob(os.path.join(ROOT, "proto", "ckpt", "v1", "*.proto")):
            shutil.copy(proto, os.path.join(source, "proto", "ckpt", "v1"))

        venv = os.path.join(TMP, "venv")
        shutil.rmtree(venv, ignore_errors=True)
        run("/usr/bin/python3", "-m", "venv", "--system-site-packages", venv)
        python = os.path.join(venv, "bin", "python")
        def tree(top):
            return sorted(os.path.relpath(os.path.join(where, name), top)
                          for where, dirs, files in os.walk(top) for name in dirs + files)

        before = tree(source)
        run(python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
            "--disable-pip-version-check", package)
        # The build leaves the checkout as it was: no build/, no *.egg-info.
        self.assertEqual(tree(source), before)

        # Real services with one version in them, put in by `ckpt import` from a torch.save file.
        store, store_address = start("store", STORE_BIN, [f"--store_dir={TMP}/db"])
        self.processes.append(store)
        loader, loader_address = start("loader", LOADER_BIN, [f"--store={store_address}"])
        self.processes.append(loader)
        torch.manual_seed(3)
        state = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32)).state_dict()
        saved = os.path.join(TMP, "net.pt")
        torch.save({"module." + k: v for k, v in state.items()}, saved)
        run(CKPT_BIN, "import", saved, "--model", "installed-net", f"--store={store_address}")

        # From outside the repository, with nothing of it on the path, no protoc cache to fall
        # back on, and PATH without protoc.
        outside = os.path.join(TMP, "elsewhere")
        os.makedirs(outside, exist_ok=True)
        script = textwrap.dedent(f"""
            import os, sys, torch
            import ckpt_client
            from ckpt_client import _stubs
            assert ckpt_client.__file__.startswith({venv!r}), ckpt_client.__file__
            modules = _stubs.load().directory
            assert modules == os.path.join(os.path.dirname(ckpt_client.__file__), "_generated"), modules
            print("version", ckpt_client.__version__)
            expected = torch.load({saved!r})
            with ckpt_client.Client(store={store_address!r}, loader={loader_address!r}) as client:
                got = client.load_state_dict("installed-net@1")
                assert sorted(got) == sorted(k[len("module."):] for k in expected), sorted(got)
                for key, tensor in expected.items():
                    assert torch.equal(got[key[len("module."):]], tensor), key
                assert len(client.manifest("installed-net@1").tensors) == len(expected)
                client.set_alias("installed-net@1", "production", reason="installed client")
                assert client.resolve("installed-net@production") == 1
            print("ok")
        """)
        environment = {"PATH": "/nonexistent", "HOME": outside,
                       "XDG_CACHE_HOME": os.path.join(outside, "no-cache")}
        output = run(python, "-c", script, cwd=outside, env=environment)
        self.assertIn("ok", output)
        self.assertFalse(os.path.exists(os.path.join(outside, "no-cache", "ckpt_client")),
                         "the installed client generated modules at run time")


if __name__ == "__main__":
    unittest.main(verbosity=2)
