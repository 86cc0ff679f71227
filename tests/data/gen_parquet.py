#!/usr/bin/env python3
"""gen_parquet.py: writes the Parquet files of tests/data/parquet/ and the
alpaca Parquet files beside gen_golden.py's inputs.

    .venv/bin/python tests/data/gen_parquet.py      (then gen_golden.py)

Needs pyarrow. Every file is small (a few KB) and committed; this script is
how they were made.

  alpaca_small.snappy.parquet   gen_golden.py's alpaca rows: SNAPPY, data pages v1, dictionary
                                pages, 4 row groups, the optional "input" column with nulls
  alpaca_small.zstd.parquet     ZSTD, data pages v2, PLAIN only, 3 row groups, pages of about
                                64 bytes (several per column chunk)
  alpaca_small.mapped.parquet   the same rows as columns q, ctx, a (and id INT64, n INT32,
                                score DOUBLE, ok BOOLEAN), UNCOMPRESSED, v2, dictionary for q only
  parquet/types.CODEC.vN.parquet  INT32, INT64, FLOAT, DOUBLE, BOOLEAN and string columns with
                                nulls, for each codec and page version; types.expected.json
                                holds their values
  parquet/nested.parquet        a list<struct> column (ShareGPT conversations): listed, not read
  parquet/gzip.parquet, delta.parquet, binary.parquet
                                a GZIP codec, DELTA_BINARY_PACKED, a binary (non-string)
                                column: each an error to read
  parquet/bad_*.parquet         malformed files, from a small writer below (pyarrow writes
                                only good ones): each must be a clear error, never a crash
"""
import json
import os
import struct
import sys

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_golden import ALPACA  # noqa: E402

OUT = os.path.join(HERE, "parquet")


def alpaca_table(names=("instruction", "input", "output")):
    return pa.table({names[0]: pa.array([r["instruction"] for r in ALPACA], pa.string()),
                     names[1]: pa.array([r["input"] for r in ALPACA], pa.string()),
                     names[2]: pa.array([r["output"] for r in ALPACA], pa.string())})


def write_alpaca():
    t = alpaca_table()
    pq.write_table(t, os.path.join(HERE, "alpaca_small.snappy.parquet"), compression="snappy",
                   data_page_version="1.0", use_dictionary=True, row_group_size=5)
    pq.write_table(t, os.path.join(HERE, "alpaca_small.zstd.parquet"), compression="zstd",
                   data_page_version="2.0", use_dictionary=False, row_group_size=7, data_page_size=64)
    m = alpaca_table(("q", "ctx", "a"))
    n = len(ALPACA)
    m = m.append_column("id", pa.array(range(1000, 1000 + n), pa.int64()))
    m = m.append_column("n", pa.array([i if i % 3 else None for i in range(n)], pa.int32()))
    m = m.append_column("score", pa.array([i / 4 for i in range(n)], pa.float64()))
    m = m.append_column("ok", pa.array([i % 2 == 0 for i in range(n)], pa.bool_()))
    pq.write_table(m, os.path.join(HERE, "alpaca_small.mapped.parquet"), compression="none",
                   data_page_version="2.0", use_dictionary=["q"])


def write_types():
    cols = {
        "i32": pa.array([1, -2, None, 2147483647, -2147483648, 0, 7], pa.int32()),
        "i64": pa.array([None, 1 << 40, -(1 << 62), 3, 4, None, 5], pa.int64()),
        "f32": pa.array([1.5, None, -0.25, 3.0e38, 0.0, 1e-7, 2.0], pa.float32()),
        "f64": pa.array([0.1, 1e300, None, -2.5, 0.0, 3.0, None], pa.float64()),
        "b": pa.array([True, False, None, True, True, False, None], pa.bool_()),
        "s": pa.array(["a", None, "", "ünïcödé ✓", "x" * 300, None, "last"], pa.string()),
        "req": pa.array(["r0", "r1", "r2", "r0", "r1", "r2", "r0"], pa.string()),
    }
    t = pa.table(cols).cast(pa.schema([pa.field(k, v.type, nullable=k != "req") for k, v in cols.items()]))
    for codec in ("none", "snappy", "zstd"):
        for v in ("1.0", "2.0"):
            pq.write_table(t, os.path.join(OUT, f"types.{codec}.v{v[0]}.parquet"), compression=codec,
                           data_page_version=v, row_group_size=3, use_dictionary=codec != "zstd")
    expected = {k: [None if x is None else (float(x) if isinstance(x, float) else x) for x in v.to_pylist()]
                for k, v in cols.items()}
    with open(os.path.join(OUT, "types.expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False)
        f.write("\n")


def write_unsupported():
    conv = pa.array([[{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]],
                    pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())])))
    pq.write_table(pa.table({"conversations": conv, "id": pa.array([1], pa.int64())}),
                   os.path.join(OUT, "nested.parquet"))
    t = pa.table({"instruction": ["a", "b"], "output": ["c", "d"], "id": pa.array([1, 2], pa.int64())})
    pq.write_table(t, os.path.join(OUT, "gzip.parquet"), compression="gzip")
    pq.write_table(t, os.path.join(OUT, "delta.parquet"), use_dictionary=False,
                   column_encoding={"id": "DELTA_BINARY_PACKED"}, compression="none")
    pq.write_table(pa.table({"instruction": pa.array([b"\x00\xff"], pa.binary()), "output": ["x"]}),
                   os.path.join(OUT, "binary.parquet"), compression="none")


# ---- a small Parquet writer for malformed files ----------------------------------------------
# Thrift's compact protocol, by hand: field headers (delta << 4 | type),
# zigzag varints, lists as (count << 4 | element type).

T_I32, T_I64, T_BINARY, T_LIST, T_STRUCT = 5, 6, 8, 9, 12


class Thrift:
    def __init__(self):
        self.b = bytearray()
        self.last = [0]

    def varint(self, v):
        while True:
            c = v & 0x7F
            v >>= 7
            self.b.append(c | (0x80 if v else 0))
            if not v:
                return

    def field(self, fid, ftype):
        delta = fid - self.last[-1]
        if 0 < delta <= 15:
            self.b.append(delta << 4 | ftype)
        else:
            self.b.append(ftype)
            self.varint((fid << 1) ^ (fid >> 15))
        self.last[-1] = fid

    def int(self, fid, v, ftype=T_I32):
        self.field(fid, ftype)
        self.varint((v << 1) ^ (v >> 63))

    def binary(self, fid, s):
        self.field(fid, T_BINARY)
        self.varint(len(s))
        self.b += s

    def begin(self, fid):
        self.field(fid, T_STRUCT)
        self.last.append(0)

    def end(self):
        self.b.append(0)
        self.last.pop()

    def list(self, fid, etype, n):
        self.field(fid, T_LIST)
        if n < 15:
            self.b.append(n << 4 | etype)
        else:
            self.b.append(0xF0 | etype)
            self.varint(n)

    def elem(self):  # a struct inside a list
        self.last.append(0)


def plain_strings(vals):
    return b"".join(struct.pack("<I", len(v)) + v for v in vals)


def rle_run(count, value):  # one RLE run, bit width 1
    t = Thrift()
    t.varint(count << 1)
    return bytes(t.b) + bytes([value])


def page_header(ptype, usize, csize, nvals, encoding, dict_page=False):
    t = Thrift()
    t.int(1, ptype)
    t.int(2, usize)
    t.int(3, csize)
    t.begin(7 if dict_page else 5)
    t.int(1, nvals)
    t.int(2, encoding)
    if not dict_page:
        t.int(3, 3)  # RLE definition levels
        t.int(4, 3)
    t.end()
    t.b.append(0)
    return bytes(t.b)


def mini_parquet(values=(b"alpha", b"beta", b"gamma"), optional=False, nulls=(), codec=0, dictionary=False,
                 knobs=None):
    """One BYTE_ARRAY column "output" (and nothing else) in one row group and
    one data page; knobs change one thing to make a malformed file."""
    k = knobs or {}
    rows = len(values) + len(nulls)
    present = list(values)
    dict_page = b""
    if dictionary:
        uniq = sorted(set(present))
        dvals = plain_strings(uniq)
        dict_page = page_header(2, len(dvals), len(dvals), len(uniq), 0, dict_page=True) + dvals
        idx = [uniq.index(v) for v in present]
        if "dict_index" in k:
            idx[-1] = k["dict_index"]
        body = bytes([8])  # bit width 8: each RLE run's value is one byte
        for i in idx:
            body += rle_run(1, i)
        encoding = 8
    else:
        body = plain_strings(present)
        if "value_len" in k:
            body = struct.pack("<I", k["value_len"]) + body[4:]
        encoding = 0
    if optional:  # values first, then the nulls
        if "def_count" in k:
            levels = rle_run(k["def_count"], 1)
        else:
            levels = rle_run(len(values), 1) + (rle_run(len(nulls), 0) if nulls else b"")
        body = struct.pack("<I", len(levels)) + levels + body
    raw = body
    if codec == 1:
        body = k.get("snappy", snappy_literal(raw))
    data_hdr = page_header(0, len(raw), k.get("page_csize", len(body)), k.get("num_values", rows), encoding)
    out = bytearray(b"PAR1")
    dict_off = len(out) if dictionary else None
    out += dict_page
    data_off = len(out)
    out += data_hdr + body
    chunk_len = len(out) - (dict_off if dictionary else data_off)
    t = Thrift()
    t.int(1, 1)
    t.list(2, T_STRUCT, 2)
    t.elem()
    t.binary(4, b"schema")
    t.int(5, k.get("num_children", 1))
    t.end()
    t.elem()
    t.int(1, k.get("type", 6))
    t.int(3, 1 if optional else 0)
    t.binary(4, b"output")
    t.int(6, 0)  # UTF8
    t.end()
    t.int(3, k.get("file_rows", rows), T_I64)
    t.list(4, T_STRUCT, 1)
    t.elem()
    t.list(1, T_STRUCT, 1)
    t.elem()
    t.int(2, data_off, T_I64)
    t.begin(3)
    t.int(1, 6)
    t.list(2, T_I32, 2)
    t.varint(0)
    t.varint(3 << 1)
    t.list(3, T_BINARY, 1)
    t.varint(6)
    t.b += b"output"
    t.int(4, codec)
    t.int(5, k.get("chunk_values", rows), T_I64)
    t.int(6, chunk_len, T_I64)
    t.int(7, k.get("chunk_len", chunk_len), T_I64)
    t.int(9, k.get("data_off", data_off), T_I64)
    if dictionary:
        t.int(11, dict_off, T_I64)
    t.end()
    t.end()  # ColumnChunk
    t.int(2, len(out), T_I64)
    t.int(3, rows, T_I64)
    t.end()  # RowGroup
    t.b.append(0)
    footer = bytes(t.b)
    if "footer" in k:
        footer = k["footer"](footer)
    out += footer + struct.pack("<I", k.get("footer_len", len(footer))) + k.get("magic", b"PAR1")
    return bytes(out)


def snappy_literal(raw):
    """Snappy's raw format as literals only: a valid encoding of raw."""
    t = Thrift()
    t.varint(len(raw))
    out = bytes(t.b)
    for i in range(0, len(raw), 60):
        chunk = raw[i:i + 60]
        out += bytes([(len(chunk) - 1) << 2]) + chunk
    return out


def write_malformed():
    good = mini_parquet()
    # the writer's good files read back in pyarrow as what they hold
    for name, data, want in (("mini_plain.parquet", good, ["alpha", "beta", "gamma"]),
                             ("mini_optional.parquet", mini_parquet(optional=True, nulls=(None,)),
                              ["alpha", "beta", "gamma", None]),
                             ("mini_dict.parquet", mini_parquet(dictionary=True, values=(b"b", b"a", b"b")),
                              ["b", "a", "b"]),
                             ("mini_snappy.parquet", mini_parquet(codec=1), ["alpha", "beta", "gamma"])):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        got = pq.read_table(os.path.join(OUT, name)).column("output").to_pylist()
        assert got == want, (name, got)
    bad = {
        "bad_magic.parquet": b"PAR2" + good[4:],
        "bad_tail.parquet": good[:-4] + b"PARX",
        "truncated.parquet": good[: len(good) // 2],
        "short.parquet": b"PAR1PAR1",
        "bad_footer_len.parquet": mini_parquet(knobs={"footer_len": 1 << 20}),
        "bad_offset.parquet": mini_parquet(knobs={"data_off": 1 << 30}),
        "bad_chunk_len.parquet": mini_parquet(knobs={"chunk_len": 1 << 20}),
        "bad_page_size.parquet": mini_parquet(knobs={"page_csize": 4000}),
        "bad_footer.parquet": mini_parquet(knobs={"footer": lambda f: f[:8] + b"\x1f\xff\xff\xff\x0f" + f[8:]}),
        "bad_snappy.parquet": mini_parquet(codec=1, knobs={"snappy": b"\x1b\x0d\x05\x00"}),
        "bad_dict_index.parquet": mini_parquet(dictionary=True, values=(b"b", b"a", b"b"), knobs={"dict_index": 9}),
        "bad_def_levels.parquet": mini_parquet(optional=True, nulls=(None,), knobs={"def_count": 2}),
        "bad_value_len.parquet": mini_parquet(knobs={"value_len": 1000}),
        "bad_rows.parquet": mini_parquet(knobs={"file_rows": 5}),
        "bad_num_values.parquet": mini_parquet(knobs={"chunk_values": 2}),
        "bad_type.parquet": mini_parquet(knobs={"type": 2}),
        "bad_schema.parquet": mini_parquet(knobs={"num_children": 7}),
    }
    for name, data in bad.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    write_alpaca()
    write_types()
    write_unsupported()
    write_malformed()
    for name in sorted(os.listdir(OUT)) + [n for n in os.listdir(HERE) if n.endswith(".parquet")]:
        p = os.path.join(OUT, name) if os.path.exists(os.path.join(OUT, name)) else os.path.join(HERE, name)
        print(f"{os.path.relpath(p, HERE)}: {os.path.getsize(p)} bytes")


if __name__ == "__main__":
    main()
