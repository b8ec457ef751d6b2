"""Fashion-MNIST for the Python tests, read by hand from the gzipped IDX files of Debian's
dataset-fashion-mnist and scaled with the operations of keel's fashion_mnist plugin, in the same
order: x / 255, then (x - 0.2860) / 0.3530, in float32; labels as int64."""
import gzip
import struct

import numpy as np
import torch

DATA_DIR = "/usr/share/datasets/fashion-mnist"
_RAW = {}


def _read(split):
    """uint8 images [N, 1, 28, 28] and labels [N] of `split` ("train" or "test"), read once."""
    if split not in _RAW:
        stem = f"{DATA_DIR}/{'train' if split == 'train' else 't10k'}"
        with gzip.open(f"{stem}-images-idx3-ubyte.gz") as f:
            raw = f.read()
        magic, n, rows, cols = struct.unpack(">IIII", raw[:16])
        assert (magic, rows, cols) == (2051, 28, 28)
        images = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 1, rows, cols)
        with gzip.open(f"{stem}-labels-idx1-ubyte.gz") as f:
            raw = f.read()
        magic, n_labels = struct.unpack(">II", raw[:8])
        assert magic == 2049 and n_labels == n
        _RAW[split] = (images, np.frombuffer(raw, dtype=np.uint8, offset=8))
    return _RAW[split]


def fashion_mnist(split, limit):
    """The first `limit` samples of `split` as float [N, 1, 28, 28] and int64 [N] tensors."""
    images, labels = _read(split)
    x = torch.from_numpy(images[:limit].copy()).to(torch.float32).div_(255)
    x.sub_(0.2860).div_(0.3530)
    y = torch.from_numpy(labels[:limit].copy()).to(torch.int64)
    return x, y
