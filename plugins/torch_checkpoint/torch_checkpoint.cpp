// checkpoint component `torch`: <dir>/<stem>.pt holds the tensors as a dict of name -> tensor,
// written as Python's torch.save writes a dict of tensors (a protocol-2 pickle naming only
// torch._utils._rebuild_tensor_v2, collections.OrderedDict and torch.<Type>Storage, in
// LibTorch's zip archive), so that Python's `torch.load(path, weights_only=True)` returns the
// state dict (in the given order), in PyTorch 1.13 and 2.x alike. Loading never hands the file
// to LibTorch's unpickler: pt_reader.cpp reads the archive and its pickle with allow-lists
// (what keel writes, what torch::pickle_save wrote for keel before, and what Python's
// torch.save writes for state dicts) and checks every tensor against its storage; the tensors
// are then built here from the checked bytes.
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <caffe2/serialize/inline_container.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "keel/plugin.hpp"
#include "pt_reader.hpp"

namespace {

const char* const kSaveHint =
    "; hint: check that the run directory is writable and has space (disk full?)";
const char* const kLoadHint =
    "; hint: point it at a checkpoint directory written with [checkpoint] type = \"torch\" "
    "(runs/<name>/checkpoints/step-<N>)";
const char* const kFormatHint =
    "; hint: keel loads only .pt files that hold a dict of tensors (nested dicts and lists "
    "too), as [checkpoint] type = \"torch\" writes them (or Python's torch.save of a model's "
    "or an optimizer's state_dict()); if this one came from elsewhere, load it in Python and "
    "save its state dict again";

std::string describe(c10::ScalarType dtype, at::IntArrayRef sizes) {
  std::ostringstream s;
  s << dtype << " " << sizes;
  return s.str();
}

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

// ---- data.pkl as Python's torch.save writes a dict of tensors (protocol 2) -----------------

// The storage class Python names for a dtype: those of keel's dtypes (keel/tensor.hpp), and the
// others pt_reader.cpp reads; nullptr for the rest.
const char* storage_class(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Double: return "DoubleStorage";
    case c10::ScalarType::Float: return "FloatStorage";
    case c10::ScalarType::Half: return "HalfStorage";
    case c10::ScalarType::BFloat16: return "BFloat16Storage";
    case c10::ScalarType::Long: return "LongStorage";
    case c10::ScalarType::Int: return "IntStorage";
    case c10::ScalarType::Short: return "ShortStorage";
    case c10::ScalarType::Char: return "CharStorage";
    case c10::ScalarType::Byte: return "ByteStorage";
    case c10::ScalarType::Bool: return "BoolStorage";
    case c10::ScalarType::ComplexFloat: return "ComplexFloatStorage";
    case c10::ScalarType::ComplexDouble: return "ComplexDoubleStorage";
    default: return nullptr;
  }
}

class Pickle {
 public:
  Pickle() { out_ = "\x80\x02"; }  // PROTO 2
  std::string& out() { return out_; }
  void raw(const char* s) { out_ += s; }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {  // BININT: 4 bytes, little-endian
      out_ += 'J';
      bytes(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
    } else {  // LONG1 of 8 bytes, two's complement
      out_ += "\x8a\x08";
      bytes(static_cast<uint64_t>(v), 8);
    }
  }
  void text(const std::string& s) {  // BINUNICODE
    out_ += 'X';
    bytes(s.size(), 4);
    out_ += s;
  }
  void ints(at::IntArrayRef v) {  // a tuple of ints
    out_ += '(';
    for (const int64_t x : v) integer(x);
    out_ += 't';
  }

 private:
  void bytes(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) out_ += static_cast<char>((v >> (8 * k)) & 0xff);
  }
  std::string out_;
};

void write_file(const std::string& path, const std::vector<char>& bytes) {
  FilePtr f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) throw std::runtime_error("cannot create '" + path + "': " + std::strerror(errno) + kSaveHint);
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
    throw std::runtime_error("writing '" + path + "' failed: " + std::strerror(errno) + kSaveHint);
  if (std::fclose(f.release()) != 0)  // flushes: a full disk may show only here
    throw std::runtime_error("closing '" + path + "' failed: " + std::strerror(errno) + kSaveHint);
}

std::vector<char> read_file(const std::string& path) {
  // Only regular files are read, never through a symbolic link (the checkpoint's own file, as
  // its commit record verified it), and opening does not block (a FIFO would).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ELOOP)
    throw std::runtime_error("cannot read '" + path + "': a symbolic link, not a file of the "
                             "checkpoint" + std::string(kLoadHint));
  if (fd < 0)
    throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno) + kLoadHint);
  FilePtr f(::fdopen(fd, "rb"), &std::fclose);
  if (!f) {
    ::close(fd);
    throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno) + kLoadHint);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw std::runtime_error("cannot read '" + path + "': not a regular file" + kLoadHint);
  std::vector<char> bytes(static_cast<size_t>(st.st_size));
  if (std::fread(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
    throw std::runtime_error("'" + path + "': cannot read " + std::to_string(bytes.size()) +
                             " bytes (file truncated while reading?)" + kLoadHint);
  return bytes;
}

class TorchCheckpoint : public keel::Checkpoint {
 public:
  explicit TorchCheckpoint(const keel::Context&) {}

  void save(const std::string& dir, const std::string& stem,
            const keel::NamedTensors& tensors) override {
    const std::string path = dir + "/" + stem + ".pt";
    // {name: _rebuild_tensor_v2(storage k, 0, sizes, strides, False, OrderedDict()), ...}, the
    // k-th tensor's bytes in the record data/<k>, each tensor contiguous and alone in its
    // storage (a view of a larger buffer is copied, so the file holds only its bytes).
    Pickle p;
    p.raw("}(");  // EMPTY_DICT, MARK
    std::set<std::string> names;
    std::vector<at::Tensor> storages;
    for (const auto& [name, tensor] : tensors) {
      if (!names.insert(name).second)
        throw std::runtime_error("saving '" + path + "': tensor name '" + name +
                                 "' appears twice; hint: names must be unique");
      const char* cls = storage_class(tensor.scalar_type());
      if (cls == nullptr)
        throw std::runtime_error("saving '" + path + "': tensor '" + name + "' has dtype " +
                                 std::string(c10::toString(tensor.scalar_type())) +
                                 ", which a .pt file of keel's does not hold; hint: use one of "
                                 "keel's dtypes");
      at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
      if (t.storage_offset() != 0 || t.storage().nbytes() != t.nbytes()) t = t.clone();
      p.text(name);
      p.raw("ctorch._utils\n_rebuild_tensor_v2\n((");  // GLOBAL, MARK, MARK
      p.text("storage");
      p.raw("ctorch\n");
      p.raw(cls);
      p.raw("\n");
      p.text(std::to_string(storages.size()));
      p.text("cpu");
      p.integer(t.numel());
      p.raw("tQ");  // TUPLE (the persistent id), BINPERSID
      p.integer(0);
      p.ints(t.sizes());
      p.ints(t.strides());
      p.raw("\x89" "ccollections\nOrderedDict\n)RtR");  // False, OrderedDict(), TUPLE, REDUCE
      storages.push_back(std::move(t));
    }
    p.raw("u.");  // SETITEMS, STOP

    std::vector<char> bytes;
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) -> size_t {
      bytes.insert(bytes.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
      return n;
    });
    writer.writeRecord("data.pkl", p.out().data(), p.out().size());
    for (size_t k = 0; k < storages.size(); ++k)
      writer.writeRecord("data/" + std::to_string(k), storages[k].data_ptr(),
                         storages[k].nbytes());
    writer.writeEndOfFile();  // version (and, from LibTorch 2.x, byteorder and an id)
    write_file(path, bytes);
  }

  void load(const std::string& dir, const std::string& stem,
            const keel::NamedTensors& into) override {
    const std::string path = dir + "/" + stem + ".pt";
    const std::vector<char> bytes = read_file(path);
    std::vector<keel_torch_pt::TensorSpec> specs;
    try {
      specs = keel_torch_pt::read_pt(bytes, path);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(e.what() + std::string(kFormatHint));
    }
    std::map<std::string, const keel_torch_pt::TensorSpec*> stored;
    for (const auto& spec : specs) stored[spec.name] = &spec;

    at::NoGradGuard no_grad;
    for (const auto& [name, target] : into) {
      auto it = stored.find(name);
      if (it == stored.end())
        throw std::runtime_error("'" + path + "' has no tensor '" + name +
                                 "'; hint: was it saved by a different model?");
      const keel_torch_pt::TensorSpec& src = *it->second;
      if (src.dtype != target.scalar_type() || at::IntArrayRef(src.sizes) != target.sizes())
        throw std::runtime_error("'" + path + "': tensor '" + name + "' is stored as " +
                                 describe(src.dtype, src.sizes) + " but the model expects " +
                                 describe(target.scalar_type(), target.sizes()) +
                                 "; hint: was it saved by a different model config or dtype?");
      // read_pt checked that the view lies inside the storage record's bytes.
      at::Tensor storage = at::empty({static_cast<int64_t>(src.storage_numel)},
                                     at::TensorOptions().dtype(src.dtype));
      if (src.data_bytes > 0)
        std::memcpy(storage.data_ptr(), bytes.data() + src.data_begin, src.data_bytes);
      target.copy_(storage.as_strided(src.sizes, src.strides, src.storage_offset));
    }
  }
};

const keel_component_desc kComponents[] = {
    keel::component<TorchCheckpoint>(
        "torch", "checkpoints as .pt files (Python: torch.load(path, weights_only=True))"),
};

}  // namespace

KEEL_PLUGIN("keel-torch-checkpoint", "0.1.0", "torch .pt checkpoint backend", kComponents)
