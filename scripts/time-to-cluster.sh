#!/usr/bin/env bash
# Follow docs/real-macs.md steps 6 and 7 on loopback — three controllers (the first forms the
# cluster, two join with its join token) and three nodelets joined with single-use tokens —
# and print each command the docs give with the time since the first, until every node is
# Ready. Each "Mac" is its own 127.0.x.y address; services managers are left out (the commands
# are what `tbctl install` would run). Everything stops and is removed at the end.
#
#   cargo build --workspace --bins && scripts/time-to-cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${TB_BIN_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/debug}"
for b in tb-controller tb-nodelet tbctl; do
  [ -x "$bin/$b" ] || { echo "no $bin/$b: run cargo build --workspace --bins first" >&2; exit 1; }
done
lab=$(mktemp -d "${TMPDIR:-/tmp}/tb-time.XXXXXX")
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$lab"
}
trap stop EXIT
# tbctl keeps its contexts under $HOME: a fresh one, as on a new laptop.
export HOME="$lab/home"
mkdir -p "$HOME"
tbctl() { "$bin/tbctl" "$@"; }

n=0
t0=$(date +%s.%N)
step() {
  n=$((n + 1))
  printf '%7.2f s  %2d  %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$n" "$*"
}
wait_for() { # seconds, command...
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "timed out: $*" >&2; exit 1; }
    sleep 0.05
  done
}

step "mkdir -p c1 && chmod 700 c1"
mkdir -p "$lab/c1" && chmod 700 "$lab/c1"
step "tb-controller --data-dir c1 --listen 127.0.1.1:7400"
"$bin/tb-controller" --data-dir "$lab/c1" --listen 127.0.1.1:7400 >"$lab/c1.log" 2>&1 &
pids+=($!)
wait_for 30 test -s "$lab/c1/admin.token"
step "tbctl config set-context lab --server 127.0.1.1:7400"
tbctl config set-context lab --server 127.0.1.1:7400 >/dev/null
step "tbctl config use-context lab"
tbctl config use-context lab >/dev/null
step "tbctl login --ca-cert ca.pem --token-file admin.token"
tbctl login --ca-cert "$lab/c1/ca.pem" --token-file "$lab/c1/admin.token" >/dev/null
step "tbctl cluster join-token --out join.token"
tbctl cluster join-token --out "$lab/join.token" >/dev/null
for i in 2 3; do
  mkdir -p "$lab/c$i" && chmod 700 "$lab/c$i"
  step "tb-controller --id $i --listen 127.0.1.$i:7400 --join https://127.0.1.1:7400 --token-file join.token"
  "$bin/tb-controller" --id "$i" --data-dir "$lab/c$i" --listen "127.0.1.$i:7400" \
    --join https://127.0.1.1:7400 --token-file "$lab/join.token" >"$lab/c$i.log" 2>&1 &
  pids+=($!)
done
voters() { [ "$(tbctl cluster status -o json 2>/dev/null | grep -c '"role": *"voter"')" = 3 ]; }
wait_for 60 voters
step "tbctl cluster status   (3 voters)"
for i in 1 2 3; do
  step "tbctl token create --node mac$i > mac$i.token"
  tbctl token create --node "mac$i" >"$lab/mac$i.token" 2>/dev/null
  step "tb-nodelet --controller 127.0.1.1:7400 --name mac$i --ca-cert ca.pem --join-token-file mac$i.token …"
  "$bin/tb-nodelet" --controller 127.0.1.1:7400 --name "mac$i" --data-dir "$lab/n$i" \
    --listen "127.0.2.$i:7600" --probe-port $((17700 + i)) \
    --port-range "$((33000 + i * 100))-$((33099 + i * 100))" \
    --ca-cert "$lab/c1/ca.pem" --join-token-file "$lab/mac$i.token" >"$lab/n$i.log" 2>&1 &
  pids+=($!)
done
ready() { [ "$(tbctl get nodes 2>/dev/null | awk '$2 == "True"' | wc -l)" -ge 3 ]; }
wait_for 120 ready
step "tbctl get nodes   (3 Ready)"
tbctl get nodes
tbctl cluster status
echo "$n commands; $(echo "$(date +%s.%N) - $t0" | bc | xargs printf '%.2f') s from the first to three controllers and three Ready nodes"
