#!/usr/bin/env bash
# Fuzz every parser that takes outside input (manifests, lab files, GGUF headers, transport
# frames and bootstrap messages, OpenAI request bodies, cron expressions) for SECONDS each
# (default 60) and print a table: target, seeds, executions, executions per second, distinct
# outcomes, findings. See docs/fuzzing.md.
#
#   scripts/fuzz.sh            # 60 s per target
#   scripts/fuzz.sh 10         # what CI runs
#   scripts/fuzz.sh 300 gguf_engine   # one target, longer
#
# Exits 1 when anything was found; each finding is saved under fuzz/findings/TARGET/ (ignored by
# git): fix the parser, then move the file to fuzz/regressions/TARGET/ so that
# `cargo test -p tb-fuzz` replays it on every build. TB_FUZZ_SEED repeats a run.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
target="${2:-all}"
# The workspace's build (the same features as scripts/test.sh's, so after the tests this is a
# no-op; `-p tb-fuzz` alone would unify features differently and compile its dependencies again).
cargo build --workspace --bins
bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/tb-fuzz"
args=("$target" --seconds "$seconds")
if [ -n "${TB_FUZZ_SEED:-}" ]; then
  args+=(--seed "$TB_FUZZ_SEED")
fi
"$bin" "${args[@]}"
