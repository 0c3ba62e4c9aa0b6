#!/usr/bin/env python3
"""Writes a copy of a llama GGUF whose blocks are repeated K times.

    python3 -m venv .cache/gguf-venv && .cache/gguf-venv/bin/pip install gguf
    .cache/gguf-venv/bin/python scripts/deepen-gguf.py \
        .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf .cache/models/smollm2-x8.gguf 8

SmolLM2 (98 MB) fits a server's last-level cache; repeated 8 times (240 blocks, 564 MB) it
decodes from memory, as the models a lab serves do. Its tokenizer, head and block weights are
the original's, so tb serves it like any model (its text is nonsense): pipeline-bench --model
compares placement's predicted tokens/s with the observed rate on it.
"""
import re
import sys

import gguf


def main() -> None:
    if len(sys.argv) != 4 or not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
        sys.exit("usage: deepen-gguf.py IN.gguf OUT.gguf K (K >= 1)")
    src, dst, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    count_key = f"{arch}.block_count"
    if count_key not in reader.fields:
        sys.exit(f"{src}: no {count_key} in the header")
    blocks = reader.fields[count_key].contents()
    writer = gguf.GGUFWriter(dst, arch=arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == count_key:
            value = blocks * k
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    tensors = []
    for t in reader.tensors:
        m = re.match(r"blk\.(\d+)\.(.*)", t.name)
        if m is None:
            tensors.append((t.name, t))
            continue
        for rep in range(k):
            tensors.append((f"blk.{int(m.group(1)) + rep * blocks}.{m.group(2)}", t))
    for name, t in tensors:
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, t in tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    print(f"{dst}: {blocks * k} blocks")


if __name__ == "__main__":
    main()
