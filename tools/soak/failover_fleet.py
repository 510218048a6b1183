"""The set-up of the store_failover campaign (store_failover.py): two checkpoint_store
processes, each on a "host" of its own (a network namespace), sharing one bucket (libs/s3's fake
S3 server) and a real etcd on this side."""

import os
import socket
import time

import soak_lib

LEASE_TTL = 2.0
# The writer puts a snapshot of its index beside the log every this many changes, so a new disk
# replays at most this many records (the fake S3 server serves ~45 a second) after loading it.
SNAPSHOT_EVERY = 300


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _repo_file(lib, path):
    """A source file the campaign runs (the fake S3 server): in the runfiles under `bazel run`,
    else in the source tree."""
    candidates = [os.path.join(lib.repo_root, path)]
    if os.environ.get("RUNFILES_DIR"):
        candidates.insert(0, os.path.join(os.environ["RUNFILES_DIR"], "ckpt", path))
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    raise FileNotFoundError(f"{path}: looked in {', '.join(candidates)}")


class Hosts:
    """Each store on a "host" of its own: a network namespace joined to this one by a veth pair
    (as tests/multinode_test.cc does), the store at HOST_IP on its side, etcd and the bucket
    reached through GATEWAY_IP on ours. Taking this side's end of the pair down partitions the
    store from etcd, the bucket and every client at once, while it runs on. Needs root."""

    def __init__(self, lib, names):
        self.lib = lib
        tag = f"cf{os.getpid() % 100000}"
        octet = 200 + os.getpid() % 50
        self.names = names
        self.namespace = {name: f"{tag}{name}" for name in names}
        self.veth = {name: (f"{tag}{name}h", f"{tag}{name}n") for name in names}
        self.gateway = {name: f"10.{octet}.{i + 1}.1" for i, name in enumerate(names)}
        self.address = {name: f"10.{octet}.{i + 1}.2" for i, name in enumerate(names)}
        self.made = []

    def ip(self, *args):
        result = self.lib.run(["ip", *args], timeout=30)
        if not result.ok:
            raise soak_lib.StartError(f"`ip {' '.join(args)}` failed: {result.describe()}")

    def create(self):
        for name in self.names:
            ns, (outside, inside) = self.namespace[name], self.veth[name]
            self.ip("netns", "add", ns)
            self.made.append(ns)
            self.ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self.ip("link", "set", inside, "netns", ns)
            self.ip("addr", "add", f"{self.gateway[name]}/30", "dev", outside)
            self.ip("link", "set", outside, "up")
            self.ip("-n", ns, "addr", "add", f"{self.address[name]}/30", "dev", inside)
            self.ip("-n", ns, "link", "set", inside, "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", ns, "route", "add", "default", "via", self.gateway[name])

    def wrapper(self, name):
        return ["ip", "netns", "exec", self.namespace[name]]

    def cut(self, name):
        self.ip("link", "set", self.veth[name][0], "down")

    def heal(self, name):
        self.ip("link", "set", self.veth[name][0], "up")

    def delete(self):
        for ns in self.made:
            self.lib.run(["sh", "-c", f"ip netns pids {ns} | xargs -r kill -9; ip netns del {ns}"],
                         timeout=30)
        self.made = []


class Fleet:
    """etcd, the bucket and the stores, by name, each store on its own host (Hosts)."""

    def __init__(self, lib):
        self.lib = lib
        self.dir = lib.work_dir
        self.ports = {"a": _free_port(), "b": _free_port()}
        self.hosts = Hosts(lib, sorted(self.ports))
        self.stores = {}
        self.disks = {"a": 0, "b": 0}
        self.etcd = None
        self.s3 = None
        self.s3_endpoint = None
        self.etcd_endpoint = None

    def start_services(self):
        self.hosts.create()
        client, peer = _free_port(), _free_port()
        self.etcd_port = client
        self.etcd_endpoint = f"http://127.0.0.1:{client}"
        self.etcd = self.lib.spawn(
            ["etcd", "--name=n1", f"--data-dir={self.dir}/etcd",
             f"--listen-client-urls=http://0.0.0.0:{client}",
             f"--advertise-client-urls={self.etcd_endpoint}",
             f"--listen-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=n1=http://127.0.0.1:{peer}", "--log-level=warn"], name="etcd")
        port_file = os.path.join(self.dir, "s3.port")
        self.s3 = self.lib.spawn(
            [self.lib.python, _repo_file(self.lib, "libs/s3/testdata/fake_s3_server.py"),
             f"--port_file={port_file}", "--host=0.0.0.0", "--bucket=failover",
             "--access_key=AKIDSOAK",
             "--secret_key=soak/secret"], name="fake_s3")
        with open(os.path.join(self.dir, "credentials"), "w") as f:
            f.write("[default]\naws_access_key_id = AKIDSOAK\n"
                    "aws_secret_access_key = soak/secret\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(port_file) and open(port_file).read().strip():
                self.s3_port = int(open(port_file).read().strip())
                self.s3_endpoint = f"http://127.0.0.1:{self.s3_port}"
                break
            time.sleep(0.05)
        if self.s3_endpoint is None:
            raise soak_lib.StartError(f"the fake S3 server did not start: {self.s3.log_tail()}")
        # etcd answers on its client URL once it serves.
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", client), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise soak_lib.StartError(f"etcd did not start: {self.etcd.log_tail()}")

    def start(self, name, new_disk=False):
        if new_disk:
            self.disks[name] += 1
        home = os.path.join(self.dir, f"{name}-disk{self.disks[name]}")
        os.makedirs(home, exist_ok=True)
        # On its host: etcd and the bucket through the gateway, clients at its own address.
        gateway = self.hosts.gateway[name]
        flags = [f"--listen=0.0.0.0:{self.ports[name]}",
                 f"--advertise_address={self.address(name)}",
                 f"--chunks_s3_endpoint=http://{gateway}:{self.s3_port}",
                 "--chunks_s3_bucket=failover", "--chunks_s3_prefix=fleet/",
                 f"--chunks_s3_credentials_file={self.dir}/credentials",
                 f"--etcd_endpoints=http://{gateway}:{self.etcd_port}",
                 f"--writer_lease_ttl={LEASE_TTL:g}s", "--follow_interval=100ms",
                 f"--change_log_snapshot_every={SNAPSHOT_EVERY}", "--shutdown_grace=1s"]
        # A new disk replays the whole log before it serves.
        self.stores[name] = self.lib.start_store(os.path.join(home, "index"), flags,
                                                 start_timeout=300.0,
                                                 wrapper=self.hosts.wrapper(name))
        return self.stores[name]

    def address(self, name):
        return f"{self.hosts.address[name]}:{self.ports[name]}"

    def addresses(self):
        return ",".join(self.address(name) for name in sorted(self.ports))

    def role(self, name):
        """"writer", "follower" or None: what the store's log said last."""
        text = self.stores[name].log_tail(64 << 10)
        writer = text.rfind("checkpoint_store: the writer")
        follower = text.rfind("checkpoint_store: a follower")
        if writer < 0 and follower < 0:
            return None
        return "writer" if writer > follower else "follower"

    def wait_for_role(self, name, role, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stores[name].poll() is not None:
                return False
            if self.role(name) == role:
                return True
            time.sleep(0.02)
        return False
