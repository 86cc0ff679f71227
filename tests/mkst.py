#!/usr/bin/env python3
"""Writes a small safetensors file from the command line, for tests.

usage: mkst.py OUT.safetensors NAME=DTYPE:SHAPE:VALUES ... [--meta KEY=VALUE]

DTYPE is F32, F64, BF16, F16, I64 or I32; SHAPE is dims joined by 'x'
(e.g. 2x3), or 'scalar'; VALUES are comma-separated numbers (nan, inf,
-inf allowed), or 'zeros', or 'range' (0, 1, 2, ...), or 'rand:SEED' or
'rand:SEED:SCALE' (deterministic pseudo-random values in [-SCALE, SCALE)). bf16 values are
rounded to nearest even from f32.
"""
import json
import math
import struct
import sys

FMT = {"F32": ("f", 4), "F64": ("d", 8), "I64": ("q", 8), "I32": ("i", 4)}


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    if math.isnan(x):
        return ((u >> 16) & 0x8000) | 0x7FC0
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def encode(dtype, values):
    if dtype == "BF16":
        return b"".join(struct.pack("<H", bf16_bits(v)) for v in values)
    if dtype == "F16":
        return b"".join(struct.pack("<e", v) for v in values)
    code, _ = FMT[dtype]
    if code in "qi":
        values = [int(v) for v in values]
    return struct.pack("<%d%s" % (len(values), code), *values)


def main():
    out, args = sys.argv[1], sys.argv[2:]
    header, blobs, offset, meta = {}, [], 0, {}
    i = 0
    while i < len(args):
        if args[i] == "--meta":
            k, v = args[i + 1].split("=", 1)
            meta[k] = v
            i += 2
            continue
        name, spec = args[i].split("=", 1)
        dtype, shape, vals = spec.split(":", 2)
        dims = [] if shape == "scalar" else [int(d) for d in shape.split("x")]
        n = 1
        for d in dims:
            n *= d
        if vals == "zeros":
            values = [0.0] * n
        elif vals == "range":
            values = [float(k) for k in range(n)]
        elif vals.startswith("rand:"):
            parts = vals.split(":")
            state, scale = int(parts[1]) * 2654435761 + 1, float(parts[2]) if len(parts) > 2 else 1.0
            values = []
            for _ in range(n):
                state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
                values.append(((state >> 40) / float(1 << 24) * 2 - 1) * scale)
        else:
            values = [float(v) for v in vals.split(",")] if vals else []
        if len(values) != n:
            sys.exit("mkst: %s has %d values for shape %s" % (name, len(values), dims))
        data = encode(dtype, values)
        header[name] = {"dtype": dtype, "shape": dims, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
        i += 1
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


if __name__ == "__main__":
    main()
