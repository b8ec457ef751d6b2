"""What the multi-process and language-model tests of tests/cli share: Debian's torchrun
command (it needs `--redirects 1 --tee 1`: docs/distributed.md), a free local port for a
rendezvous, and a token file as `keel prepare` writes one."""
import json
import os
import socket

TORCHRUN = ["torchrun", "--no_python", "--redirects", "1", "--tee", "1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tokens(directory, tokens, vocab):
    """`tokens` (integers < vocab) as DIRECTORY/tokens.bin (uint16) with its vocab.json; returns
    the path of tokens.bin."""
    path = os.path.join(directory, "tokens.bin")
    tokens.astype("<u2").tofile(path)
    with open(os.path.join(directory, "vocab.json"), "w") as f:
        json.dump({"format": "keel-tokens", "version": 1, "dtype": "uint16", "size": vocab,
                   "tokens": len(tokens)}, f)
    return path
