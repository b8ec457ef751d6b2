#!/usr/bin/env python3
"""Rewrites the DT_RUNPATH (or DT_RPATH) string of an ELF64 little-endian file in place.

    set_runpath.py FILE NEW_PATH

tools/gpu_check/pack.sh uses it on the bundle's copies of keel and its plugins: the build here
points them at this machine's virtual environment, which the GPU machine does not have, and keel
refuses a plugin whose RUNPATH names a directory that does not exist (docs/plugins.md,
"Discovery"). No patchelf is needed: the new string overwrites the old one inside .dynstr,
padded with NUL bytes, so it must not be longer than the old one; nothing else in the file moves.
A string of .dynstr may be shared by suffix with another name, so pack.sh compares `readelf -d`
(less the path line), `--dyn-syms` and `-V` before and after. Exits 1 with one line when the
file has no such entry, the new path is longer, or the file is not ELF64 little-endian.
"""
import struct
import sys

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 5, 10, 15, 29


def fail(message):
    print(f"set_runpath: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 3:
        fail("usage: set_runpath.py FILE NEW_PATH")
    path, new = sys.argv[1], sys.argv[2].encode()
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        fail(f"{path} is not an ELF64 little-endian file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        fail(f"{path} has no dynamic section")
    entries = {}
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == DT_NULL:
            break
        entries.setdefault(tag, val)
    tag = DT_RUNPATH if DT_RUNPATH in entries else DT_RPATH if DT_RPATH in entries else None
    if tag is None or DT_STRTAB not in entries:
        fail(f"{path} has no DT_RUNPATH or DT_RPATH entry to rewrite")
    strtab = next((off + entries[DT_STRTAB] - vaddr for vaddr, off, size in loads
                   if vaddr <= entries[DT_STRTAB] < vaddr + size), None)
    if strtab is None:
        fail(f"{path}: DT_STRTAB lies in no loaded segment")
    start = strtab + entries[tag]
    end = data.index(b"\0", start)
    if end > strtab + entries.get(DT_STRSZ, end - strtab + 1):
        fail(f"{path}: the path string runs past .dynstr")
    if len(new) > end - start:
        fail(f"{path}: '{new.decode()}' is longer than the {end - start} bytes of "
             f"'{data[start:end].decode(errors='replace')}'")
    data[start:end] = new + b"\0" * (end - start - len(new))
    with open(path, "r+b") as f:
        f.write(data)


if __name__ == "__main__":
    main()
