"""keel's safetensors files read with only json, struct and numpy (no torch, no safetensors
package): an 8-byte little-endian header length, the JSON header, then each tensor's raw
little-endian bytes at its data_offsets. Shared by the Python tests."""
import collections
import json
import os
import struct

import numpy as np

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "BOOL": 1}
NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
         "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_raw(path):
    """{name: (dtype name, shape, raw bytes as a uint8 array)} in header order."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = collections.OrderedDict()
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = np.frombuffer(data[begin:end], dtype=np.uint8)
        assert raw.size == ITEMSIZE[entry["dtype"]] * int(np.prod(entry["shape"])), name
        out[name] = (entry["dtype"], list(entry["shape"]), raw)
    return out


def read_arrays(path):
    """{name: numpy array} in header order (BF16, which numpy lacks, is refused)."""
    return collections.OrderedDict(
        (name, raw.view(NUMPY[dtype]).reshape(shape))
        for name, (dtype, shape, raw) in read_raw(path).items())


def read_checkpoint(checkpoint, group="model"):
    """{name: numpy array} of a keel checkpoint directory's `group` ("model" or "optimizer"),
    whole: each tensor assembled from the chunks its commit.json indexes (every rank's rows,
    with shards), read from their objects' .safetensors files."""
    with open(os.path.join(checkpoint, "commit.json")) as f:
        record = json.load(f)
    files, out = {}, collections.OrderedDict()
    for name, entry in sorted(record["chunks"].get(group, {}).items()):
        whole = np.zeros(entry["shape"], dtype=NUMPY[entry["dtype"]])
        for chunk in entry["chunks"]:
            obj = chunk["object"]
            if obj not in files:
                files[obj] = read_arrays(os.path.join(checkpoint, obj + ".safetensors"))
            part = files[obj][name]
            assert list(part.shape) == chunk["size"], (name, obj)
            index = tuple(slice(o, o + s) for o, s in zip(chunk["offset"], chunk["size"]))
            whole[index] = part
        out[name] = whole
    return out
