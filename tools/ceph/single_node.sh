#!/usr/bin/env bash
# A throwaway single-node Ceph for tests that need a real S3 server (issue #21): one monitor, one
# OSD on memstore and radosgw (beast), all on 127.0.0.1, all state and logs under one directory.
#
# Usage:
#   tools/ceph/single_node.sh start [--memstore-mib N] [--timeout SECONDS] DIR
#   tools/ceph/single_node.sh stop [--keep-logs] DIR
#   tools/ceph/single_node.sh --help
#
# start  creates DIR (it must not exist or be empty), starts ceph-mon, ceph-osd and radosgw as the
#        current user (root or not), each in its own process group, waits until a SigV4-signed S3
#        request succeeds, and writes DIR/env (shell syntax) with S3_ENDPOINT, S3_ACCESS_KEY,
#        S3_SECRET_KEY and S3_REGION (also printed on stdout) and CEPH_CONF for debugging.
#        --memstore-mib   the OSD's memory budget for object data, MiB (default 1024). Past 95%
#                         of it (mon_osd_full_ratio) the cluster is full and S3 writes hang rather
#                         than fail, so size it above the bytes a test keeps stored at once.
#        --timeout        seconds each daemon gets to come up (default 120). On a timeout, or if a
#                         daemon exits, start names it, prints its last log lines, kills what it
#                         started, leaves DIR (logs in DIR/log) and exits 1.
# stop   kills every daemon start left (SIGKILL to each process group: memstore would otherwise
#        spend the shutdown writing every object to DIR) and removes DIR. Idempotent: a missing DIR
#        or daemons already gone are fine. --keep-logs keeps DIR/log and removes the rest.
#
# Needs Debian 12's ceph-mon, ceph-osd, radosgw and ceph-common (16.2), curl >= 7.75 and
# /usr/bin/python3 (the `ceph` CLI's own interpreter). Nothing is written outside DIR and nothing
# listens beyond 127.0.0.1; the OSD takes its ports from Ceph's 6800-7300 range.
set -euo pipefail

readonly kMarker=".ceph_single_node"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

die() {
  echo "single_node.sh: $*" >&2
  exit 1
}

# Two distinct free loopback ports, held open together so they cannot be the same one. Another
# process could take one before the daemon binds it; the daemon then fails loudly and start says so.
free_ports() {
  /usr/bin/python3 - <<'EOF'
import socket
socks = []
for _ in range(2):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# Under `bazel run` the working directory is the runfiles tree; a relative DIR means the caller's.
caller_path() {
  if [[ -n "${BUILD_WORKING_DIRECTORY:-}" && "$1" != /* ]]; then
    echo "$BUILD_WORKING_DIRECTORY/$1"
  else
    echo "$1"
  fi
}

# Random hex of $1 bytes: S3 keys need no more than [0-9A-F] and this avoids tr|head SIGPIPE noise.
random_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

# The daemons' binaries, so stop never signals a process that merely reuses a recorded pid.
daemon_comm() {
  case "$1" in
    mon.a) echo ceph-mon ;;
    osd.0) echo ceph-osd ;;
    client.rgw) echo radosgw ;;
  esac
}

# daemon_alive PID NAME: PID runs NAME's binary and is not a zombie. A zombie has closed its
# sockets and freed its memory; its reaping is up to whoever adopted it (init, after start exits),
# which can take seconds on some machines.
daemon_alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ "${stat##*) }" != Z* && "$(cat "/proc/$1/comm" 2>/dev/null)" == "$(daemon_comm "$2")" ]]
}

# Kills the process group of every daemon recorded in DIR/pids and waits (10 s) until they are gone.
kill_daemons() {
  local dir="$1" pidfile name pid
  [[ -d "$dir/pids" ]] || return 0
  for pidfile in "$dir"/pids/*.pid; do
    [[ -e "$pidfile" ]] || continue
    name="$(basename "$pidfile" .pid)"
    pid="$(cat "$pidfile")"
    if daemon_alive "$pid" "$name"; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      # Reaps our own children (start's failure path) so bash does not report them "Killed".
      { wait "$pid" || true; } 2>/dev/null
    fi
  done
  local deadline=$((SECONDS + 10)) alive
  while :; do
    alive=""
    for pidfile in "$dir"/pids/*.pid; do
      [[ -e "$pidfile" ]] || continue
      name="$(basename "$pidfile" .pid)"
      pid="$(cat "$pidfile")"
      if daemon_alive "$pid" "$name"; then alive="$alive $name($pid)"; fi
    done
    [[ -z "$alive" ]] && break
    ((SECONDS < deadline)) || die "still running after SIGKILL:$alive"
    sleep 0.1
  done
  rm -f "$dir"/pids/*.pid
}

# ---- start ------------------------------------------------------------------------------------

dir=""
conf=""
timeout_s=120
start_ms=0

ceph_cli() { timeout 30 ceph -c "$conf" --connect-timeout 10 "$@"; }

start_daemon() {
  local name="$1"
  shift
  # Without job control a background command is not a group leader, so setsid execs in place and
  # $! is the daemon's pid and its process group id.
  setsid "$@" -c "$conf" -f </dev/null >>"$dir/log/$name.stdout" 2>&1 &
  echo $! >"$dir/pids/$name.pid"
}

# Appends "SECONDS_SINCE_START STEP" to DIR/log/start.log: where start's time goes, on a slow CI.
phase() { echo "$(($(date +%s%N) / 1000000 - start_ms)) ms $1" >>"$dir/log/start.log"; }

# Fails start: names the daemon, shows its log tail, kills what was started, keeps DIR.
fail_daemon() {
  local name="$1" why="$2" f
  {
    echo "single_node.sh: $name $why"
    for f in "$dir/log/$name.log" "$dir/log/$name.stdout"; do
      [[ -s "$f" ]] || continue
      echo "---- last lines of $f"
      tail -n 25 "$f"
    done
    echo "---- state and logs kept in $dir; remove with: $0 stop $dir"
  } >&2
  kill_daemons "$dir" || true
  exit 1
}

# wait_for NAME WHAT CHECK_CMD...: polls CHECK_CMD until it succeeds, the timeout passes or any
# daemon started so far exits (radosgw just waits if the OSD dies); WHAT names what was awaited.
wait_for() {
  local name="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + timeout_s)) pidfile pid rc
  until "$@" >/dev/null 2>&1; do
    for pidfile in "$dir"/pids/*.pid; do
      pid="$(cat "$pidfile")"
      kill -0 "$pid" 2>/dev/null && continue
      rc=0
      wait "$pid" 2>/dev/null || rc=$?
      fail_daemon "$(basename "$pidfile" .pid)" "exited (status $rc) while waiting for $name: $what"
    done
    ((SECONDS < deadline)) || fail_daemon "$name" "not up within ${timeout_s}s: no $what"
    sleep 0.5
  done
}

osd_up() { ceph_cli osd stat -f json | grep -q '"num_up_osds":1'; }
mon_up() { ceph_cli mon stat; }
# Any HTTP status will do (an anonymous GET / is 403 on pacific): the frontend is serving.
http_up() { [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1")" != 000 ]]; }
# A signed ListBuckets. curl 7.88 (Debian 12) does not send x-amz-content-sha256 itself and radosgw
# then rejects the signature (SignatureDoesNotMatch), so callers of curl --aws-sigv4 must set it.
s3_signed_ok() {
  curl -sf -o /dev/null --max-time 10 --aws-sigv4 "aws:amz:$S3_REGION:s3" \
    --user "$S3_ACCESS_KEY:$S3_SECRET_KEY" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
    "$S3_ENDPOINT/"
}

cmd_start() {
  local memstore_mib=1024
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --memstore-mib) memstore_mib="${2:?--memstore-mib needs a value}"; shift 2 ;;
      --timeout) timeout_s="${2:?--timeout needs a value}"; shift 2 ;;
      -h | --help) usage; exit 0 ;;
      -*) die "start: unknown option $1 (see --help)" ;;
      *) [[ -z "$dir" ]] || die "start: one DIR only"; dir="$1"; shift ;;
    esac
  done
  [[ -n "$dir" ]] || die "start: DIR missing (see --help)"
  dir="$(caller_path "$dir")"
  start_ms=$(($(date +%s%N) / 1000000))
  [[ "$memstore_mib" =~ ^[0-9]+$ && "$memstore_mib" -ge 64 ]] || die "--memstore-mib: an integer >= 64"
  [[ "$timeout_s" =~ ^[0-9]+$ && "$timeout_s" -ge 1 ]] || die "--timeout: a positive integer"
  local bin
  for bin in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool uuidgen curl setsid; do
    command -v "$bin" >/dev/null || die "$bin not found: apt-get install ceph-mon ceph-osd radosgw ceph-common"
  done
  if [[ -e "$dir" ]] && [[ -n "$(ls -A "$dir")" ]]; then
    die "start: $dir exists and is not empty (stop it first?)"
  fi
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  conf="$dir/ceph.conf"
  touch "$dir/$kMarker"
  mkdir -p "$dir/log" "$dir/run" "$dir/pids" "$dir/crash" "$dir/mon/a" "$dir/osd/0" "$dir/rgw"

  local ports mon_port rgw_port fsid
  ports="$(free_ports)"
  mon_port="${ports% *}"
  rgw_port="${ports#* }"
  fsid="$(uuidgen)"

  # Admin sockets are Unix sockets, whose paths are limited to 107 bytes; deep test directories
  # (Bazel's) exceed that, and the script needs none of them, so they are dropped then.
  local admin_socket="\$run_dir/\$cluster-\$name.\$pid.asok"
  if ((${#dir} > 60)); then admin_socket=""; fi

  # auth none: everything listens on 127.0.0.1 for one test's life, so cephx would only add keyring
  # plumbing and CLI round trips to start; S3 requests are still signed with the user's keys.
  cat >"$conf" <<EOF
# Written by tools/ceph/single_node.sh for a throwaway test cluster.
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$mon_port]
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
run_dir = $dir/run
admin_socket = $admin_socket
crash_dir = $dir/crash
log_file = $dir/log/\$name.log
mon_cluster_log_file = $dir/log/cluster.log
pid_file = $dir/run/\$name.pid
keyring = $dir/keyring
# One OSD: replicas of one, placement by OSD, and few placement groups, since radosgw creates
# about seven pools and 7 x 32 (the default pg_num) exceeds mon_max_pg_per_osd (250).
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
# A shared CI disk may be fuller than the monitor's default 5% floor; this cluster stores little.
mon_data_avail_crit = 1
mon_data_avail_warn = 2

[mon]
mon_data = $dir/mon/\$id
# The monitor batches map changes for paxos_propose_interval (1 s) before committing; radosgw makes
# about fifteen of them at start (pools, application tags) and more at its first bucket, so the
# default costs ~10 s of start and ~2 s on the first bucket. One monitor needs no batching.
paxos_propose_interval = 0.05

[osd]
osd_data = $dir/osd/\$id
osd_objectstore = memstore
memstore_device_bytes = $((memstore_mib * 1024 * 1024))
osd_crush_initial_weight = 1

[client.rgw]
# radosgw defaults its monitor connections to "secure" mode, which auth none cannot provide; without
# this it retries the monitor forever with "get_initial_auth_request returned -13".
ms_mon_client_mode = crc
rgw_data = $dir/rgw
rgw_frontends = beast endpoint=127.0.0.1:$rgw_port
EOF

  trap 'kill_daemons "$dir"; exit 130' INT TERM

  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$dir/monmap" \
    >>"$dir/log/setup.log" 2>&1 || fail_daemon setup "monmaptool failed"
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >>"$dir/log/mon.a.stdout" 2>&1 ||
    fail_daemon mon.a "--mkfs failed"
  start_daemon mon.a ceph-mon -i a
  wait_for mon.a "answer to 'ceph mon stat'" mon_up
  phase "mon.a answers"

  local osd_uuid osd_id
  osd_uuid="$(uuidgen)"
  osd_id="$(ceph_cli osd new "$osd_uuid" 2>>"$dir/log/setup.log")" ||
    fail_daemon mon.a "refused 'ceph osd new'"
  [[ "$osd_id" == 0 ]] || fail_daemon mon.a "gave OSD id '$osd_id', expected 0"
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$dir/log/osd.0.stdout" 2>&1 ||
    fail_daemon osd.0 "--mkfs failed"
  start_daemon osd.0 ceph-osd -i 0
  wait_for osd.0 "osd.0 up in the OSD map" osd_up
  phase "osd.0 up"

  start_daemon client.rgw radosgw -n client.rgw
  S3_ENDPOINT="http://127.0.0.1:$rgw_port"
  wait_for client.rgw "HTTP answer on $S3_ENDPOINT" http_up "$S3_ENDPOINT/"
  phase "radosgw serves HTTP"

  S3_ACCESS_KEY="$(random_hex 10 | tr 'a-f' 'A-F')"
  S3_SECRET_KEY="$(random_hex 20)"
  timeout 60 radosgw-admin -c "$conf" user create --uid=test --display-name=test \
    --access-key="$S3_ACCESS_KEY" --secret-key="$S3_SECRET_KEY" >>"$dir/log/setup.log" 2>&1 ||
    fail_daemon client.rgw "'radosgw-admin user create' failed (see $dir/log/setup.log)"
  # The region a SigV4 scope names is the zonegroup's api_name ("default" on a fresh cluster).
  S3_REGION="$(timeout 60 radosgw-admin -c "$conf" zonegroup get 2>>"$dir/log/setup.log" |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["api_name"])')" ||
    fail_daemon client.rgw "'radosgw-admin zonegroup get' failed"
  phase "S3 user created, region read"
  wait_for client.rgw "200 to a signed S3 ListBuckets" s3_signed_ok
  phase "signed S3 request answered"

  trap - INT TERM
  cat >"$dir/env" <<EOF
S3_ENDPOINT=$S3_ENDPOINT
S3_ACCESS_KEY=$S3_ACCESS_KEY
S3_SECRET_KEY=$S3_SECRET_KEY
S3_REGION=$S3_REGION
CEPH_CONF=$conf
EOF
  cat "$dir/env"
}

# ---- stop -------------------------------------------------------------------------------------

cmd_stop() {
  local keep_logs=0 target=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --keep-logs) keep_logs=1; shift ;;
      -h | --help) usage; exit 0 ;;
      -*) die "stop: unknown option $1 (see --help)" ;;
      *) [[ -z "$target" ]] || die "stop: one DIR only"; target="$1"; shift ;;
    esac
  done
  [[ -n "$target" ]] || die "stop: DIR missing (see --help)"
  target="$(caller_path "$target")"
  [[ -e "$target" ]] || return 0
  [[ -e "$target/$kMarker" ]] || die "stop: $target was not made by start (no $kMarker); not touching it"
  kill_daemons "$target"
  if ((keep_logs)); then
    find "$target" -mindepth 1 -maxdepth 1 ! -name log ! -name "$kMarker" -exec rm -rf {} +
  else
    rm -rf "$target"
  fi
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
