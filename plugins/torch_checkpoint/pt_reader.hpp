// A restricted reader for the .pt files the `torch` backend loads: a zip archive of stored
// (uncompressed) records `<prefix>/data.pkl`, `<prefix>/data/<key>` and small records of text
// (`version` or `.data/version`; PyTorch 2.x's `byteorder`, which must say "little",
// `.format_version`, `.storage_alignment` and `.data/serialization_id`), whose data.pkl is a
// protocol-2 pickle of a dict, as keel writes it, as torch::pickle_save wrote it for keel
// before, and as Python's torch.save (PyTorch 1.13 and 2.x) writes a model's or an optimizer's
// state dict: tensors (nn.Parameters too) in dicts, lists and tuples, beside numbers, strings,
// bools and None, which are read and left out. Nothing of the file is handed to LibTorch's
// unpickler: the pickle is read here with an allow-list of opcodes and of globals (none that
// runs code beyond rebuilding a tensor or an empty OrderedDict), and every tensor's sizes,
// strides and storage offset are checked against the byte size of its storage record before a
// tensor is built from it: the view lies inside it and has no more elements than it holds (no
// stride 0 or overlapping view claiming more memory than the file has bytes).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace keel_torch_pt {

struct TensorSpec {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;  // in elements
  uint64_t storage_numel = 0;  // elements in the storage record
  uint64_t data_begin = 0;     // the storage record's bytes in the file: [begin, begin + bytes)
  uint64_t data_bytes = 0;
};

// The tensors of the .pt file `bytes` (named `path` in messages), in the file's order, each
// named by the keys from the root dict down joined with '.' (an int key in decimal, a list's or
// tuple's item by its index: an optimizer's {"state": {0: {"exp_avg": t}}} names t
// "state.0.exp_avg"); a tensor placed twice (tied weights) is named twice. Throws
// std::runtime_error "'<path>': <what is wrong>" (one line, without a hint) for a file that is
// not such an archive or holds anything else: a record, opcode or global outside the lists, a
// big-endian byteorder, a malformed pickle, a tensor that reaches outside its storage, two
// tensors of one name.
std::vector<TensorSpec> read_pt(const std::vector<char>& bytes, const std::string& path);

}  // namespace keel_torch_pt
