"""A checkpoint as someone handing it over can make one: its commit record edited and every
checksum redone to match (test_checkpoint_robustness.py's HandedCheckpoint, test_export.py's
handed checkpoints). XXH3-64 comes from the system's libxxhash (keel links it) through ctypes."""
import ctypes
import json
import os

_LIB = None


def xxh3(data):
    """XXH3-64 of `data` (bytes) as keel writes it: 16 lowercase hex digits."""
    global _LIB
    if _LIB is None:
        _LIB = ctypes.CDLL("libxxhash.so.0")
        _LIB.XXH3_64bits.restype = ctypes.c_uint64
        _LIB.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return "%016x" % _LIB.XXH3_64bits(data, len(data))


def recommit(ckpt, edit=None):
    """Applies edit(record) (when given) to <ckpt>/commit.json, re-lists the size and checksum
    of every file it lists, and rewrites the record's own checksum beside it
    (commit.json.xxh3) where there is one."""
    path = os.path.join(ckpt, "commit.json")
    with open(path) as f:
        record = json.load(f)
    if edit is not None:
        edit(record)
    for e in record["files"]:
        with open(os.path.join(ckpt, e["name"]), "rb") as f:
            data = f.read()
        e["size"], e["xxh3"] = len(data), xxh3(data)
    text = json.dumps(record, indent=1).encode() + b"\n"
    with open(path, "wb") as f:
        f.write(text)
    if os.path.exists(path + ".xxh3"):
        with open(path + ".xxh3", "w") as f:
            f.write(f"xxh3:{xxh3(text)}\n")
