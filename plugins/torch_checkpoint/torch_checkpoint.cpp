// checkpoint component `torch`: <dir>/<stem>.pt holds the tensors as a dict of name -> tensor,
// written by torch::pickle_save, so that Python's `torch.load(path)` returns the state dict
// (in the given order). Loading never hands the file to LibTorch's unpickler: pt_reader.cpp
// reads the archive and its pickle with allow-lists (what torch::pickle_save writes here, and
// what Python's torch.save writes for a state dict) and checks every tensor against its
// storage; the tensors are then built here from the checked bytes.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/serialize.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
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
    "; hint: keel loads only .pt files that hold a dict of name -> tensor, as [checkpoint] type "
    "= \"torch\" writes them (or Python's torch.save(model.state_dict(), path)); if this one "
    "came from elsewhere, load it in Python and save its state dict again";

std::string describe(c10::ScalarType dtype, at::IntArrayRef sizes) {
  std::ostringstream s;
  s << dtype << " " << sizes;
  return s.str();
}

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

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
    c10::Dict<std::string, at::Tensor> dict;  // keeps insertion order
    for (const auto& [name, tensor] : tensors) {
      at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
      // The pickler writes a tensor's whole storage: copy a view of a larger buffer so the
      // file holds only this tensor's bytes.
      if (t.storage_offset() != 0 || t.storage().nbytes() != t.nbytes()) t = t.clone();
      if (!dict.insert(name, std::move(t)).second)
        throw std::runtime_error("saving '" + path + "': tensor name '" + name +
                                 "' appears twice; hint: names must be unique");
    }
    write_file(path, torch::pickle_save(dict));
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
        "torch", "checkpoints as .pt files (torch::pickle_save; Python: torch.load)"),
};

}  // namespace

KEEL_PLUGIN("keel-torch-checkpoint", "0.1.0", "torch .pt checkpoint backend", kComponents)
