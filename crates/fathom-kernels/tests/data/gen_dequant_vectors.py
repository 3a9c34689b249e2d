#!/usr/bin/env python3
"""Regenerates dequant_vectors.bin: random ggml blocks of every weight type
fathom-kernels reads, with their values as the `gguf` Python package (an
implementation independent of ours) dequantizes them.

    pip install gguf numpy
    python3 crates/fathom-kernels/tests/data/gen_dequant_vectors.py

File layout (little-endian): b"FKDQ", u32 version (1), u32 entry count;
per entry: u32 ggml type id, u32 value count, u32 byte count, the block
bytes, then the values as f32.
"""

import pathlib
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# type -> (values per block, bytes per block, offsets of f16 scales)
LAYOUTS = {
    T.F32: (1, 4, []),
    T.F16: (1, 2, []),
    T.BF16: (1, 2, []),
    T.Q4_0: (32, 18, [0]),
    T.Q4_1: (32, 20, [0, 2]),
    T.Q5_0: (32, 22, [0]),
    T.Q5_1: (32, 24, [0, 2]),
    T.Q8_0: (32, 34, [0]),
    T.Q2_K: (256, 84, [80, 82]),
    T.Q3_K: (256, 110, [108]),
    T.Q4_K: (256, 144, [0, 2]),
    T.Q5_K: (256, 176, [0, 2]),
    T.Q6_K: (256, 210, [208]),
    # The e8m0 scale byte is set below, not as an f16.
    T.MXFP4: (32, 17, []),
}


def blocks(rng: np.random.Generator, qtype: T) -> np.ndarray:
    per, size, scales = LAYOUTS[qtype]
    if qtype == T.F32:
        return rng.standard_normal(256).astype(np.float32).view(np.uint8)
    if qtype == T.F16:
        v = rng.standard_normal(256).astype(np.float16)
        # Zeros, infinities and subnormals too.
        v[:6] = np.array([0.0, -0.0, np.inf, -np.inf, 6e-8, -3e-5], dtype=np.float16)
        return v.view(np.uint8)
    if qtype == T.BF16:
        v = rng.standard_normal(256).astype(np.float32).view(np.uint32)
        return (v >> 16).astype(np.uint16).view(np.uint8)
    n = 8 if per == 32 else 4
    data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    if qtype == T.MXFP4:
        # Scales around real weights' (2^-8 .. 2^-4), and the subnormal,
        # smallest normal and largest exponents.
        data[:, 0] = rng.integers(120, 125, size=n, dtype=np.uint8)
        data[:4, 0] = [0, 1, 2, 254]
    for at in scales:
        s = (rng.uniform(-1.0, 1.0, size=n) / 64.0).astype(np.float16)
        data[:, at:at + 2] = s.view(np.uint8).reshape(n, 2)
    return data.reshape(-1)


def main() -> None:
    rng = np.random.default_rng(20240601)
    out = bytearray(b"FKDQ")
    out += struct.pack("<II", 1, len(LAYOUTS))
    for qtype in LAYOUTS:
        raw = blocks(rng, qtype)
        values = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(-1)
        out += struct.pack("<III", int(qtype), values.size, raw.size)
        out += raw.tobytes()
        out += values.astype("<f4").tobytes()
    path = pathlib.Path(__file__).with_name("dequant_vectors.bin")
    path.write_bytes(bytes(out))
    print(f"wrote {path} ({len(out)} bytes)")


if __name__ == "__main__":
    main()
