#!/usr/bin/env bash
# Run every bench binary in smoke mode: the same code paths as a real run, with tiny sizes, so a
# bench that no longer starts (a changed flag, a new default such as TLS) fails CI instead of
# rotting. Smoke numbers measure nothing. Each bench prints its table and exits non-zero when a
# part cannot run; a peer CI installs (etcd, Slurm) missing is a failure.
#
#   scripts/bench-smoke.sh                # every bench
#   scripts/bench-smoke.sh controller jobs  # only the benches whose names contain these words
#
# Debug binaries (what scripts/test.sh builds): a smoke run checks that a bench works, not how
# fast. Every bench runs even when one fails; the summary lists each one's time and outcome.
set -uo pipefail
cd "$(dirname "$0")/.."

# The engine benches use SmolLM2 (fetched once; scripts/test.sh has usually done it).
scripts/fetch-model.sh >/dev/null || { echo "bench-smoke: fetching the model failed" >&2; exit 1; }

# The same build as scripts/test.sh (all workspace binaries, default features), so after the
# tests this is a no-op.
cargo build --workspace --bins || exit 1
bin="${CARGO_TARGET_DIR:-$PWD/target}/debug"

# name|command: one bench each.
benches=(
  "controller-bench|$bin/controller-bench --smoke --tb-controller $bin/tb-controller"
  "jobs-bench|$bin/jobs-bench --smoke --tb-controller $bin/tb-controller --tb-nodelet $bin/tb-nodelet"
  "scheduler-bench|$bin/scheduler-bench --smoke"
  "scheduler-bench --raft|$bin/scheduler-bench --smoke --raft --tb-controller $bin/tb-controller"
  "placement-bench|$bin/placement-bench --smoke --markdown"
  "pipeline-bench|$bin/pipeline-bench --smoke --shard-bin $bin/tb-shard"
  "serve-bench|$bin/serve-bench --smoke --shard-bin $bin/tb-shard"
  "tb-enginebench|$bin/tb-enginebench --smoke"
  "tb-trainbench|$bin/tb-trainbench --smoke"
  "tb-trainbench-dp|$bin/tb-trainbench-dp --smoke"
  "tb-collbench|$bin/tb-collbench --smoke"
  "tb-chaos|$bin/tb-chaos --smoke"
)

# wanted NAME [WORD...]: no words, or NAME contains one of them.
wanted() {
  local name="$1"; shift
  [ "$#" -eq 0 ] && return 0
  for w in "$@"; do [[ "$name" == *"$w"* ]] && return 0; done
  return 1
}

summary=()
failed=0
start_all=$SECONDS
for entry in "${benches[@]}"; do
  name="${entry%%|*}"
  cmd="${entry#*|}"
  wanted "$name" "$@" || continue
  echo
  echo "== $name: $cmd"
  t0=$SECONDS
  # shellcheck disable=SC2086 # the command is split into words on purpose
  if $cmd; then
    outcome="ok"
  else
    outcome="FAILED (exit $?)"
    failed=1
  fi
  summary+=("$(printf '%-24s %4d s  %s' "$name" $((SECONDS - t0)) "$outcome")")
done

echo
echo "== bench smoke summary ($((SECONDS - start_all)) s)"
printf '%s\n' "${summary[@]}"
exit "$failed"
