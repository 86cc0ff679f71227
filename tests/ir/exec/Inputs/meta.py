"""Prints KEY=VALUE for the named metadata keys of a safetensors file."""
import json
import struct
import sys

with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    meta = json.loads(f.read(n)).get("__metadata__", {})
for k in sys.argv[2:]:
    print("%s=%s" % (k, meta.get(k)))
