// checkpoint component `torch`: <dir>/<stem>.pt holds the tensors as a dict of name -> tensor,
// written by torch::pickle_save, so that Python's `torch.load(path)` returns the state dict
// (in the given order) and `torch::pickle_load` reads it back here.
#include <torch/serialize.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "keel/plugin.hpp"

namespace {

const char* const kSaveHint =
    "; hint: check that the run directory is writable and has space (disk full?)";
const char* const kLoadHint =
    "; hint: point it at a checkpoint directory written with [checkpoint] type = \"torch\" "
    "(runs/<name>/checkpoints/step-<N>)";

std::string describe(const at::Tensor& t) {
  std::ostringstream s;
  s << t.scalar_type() << " " << t.sizes();
  return s.str();
}

// An exception's message on one line: LibTorch's may span lines (a context, or a type string
// with a marker under it) and quote bytes of the file. Control characters become spaces, runs
// of spaces one, and the result is cut to 200 bytes.
std::string one_line(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  const std::string msg = c10e ? c10e->what_without_backtrace() : e.what();
  std::string out;
  for (char c : msg) {
    const bool space = static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == ' ';
    if (!space) out += c;
    else if (!out.empty() && out.back() != ' ') out += ' ';
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (out.size() > 200) out = out.substr(0, 200) + "...";
  return out.empty() ? "no message" : out;
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
  // Only regular files are read: opening a FIFO would block.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno) + kLoadHint);
  if (!S_ISREG(st.st_mode))
    throw std::runtime_error("cannot read '" + path + "': not a regular file" + kLoadHint);
  FilePtr f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno) + kLoadHint);
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
    c10::IValue value;
    try {
      value = torch::pickle_load(bytes);
    } catch (const std::exception& e) {
      throw std::runtime_error("'" + path + "' is not a torch checkpoint (torch::pickle_load: " +
                               one_line(e) + ")" + kLoadHint);
    }
    if (!value.isGenericDict())
      throw std::runtime_error("'" + path + "' holds a " + value.tagKind() +
                               ", not a dict of name -> tensor" + kLoadHint);
    std::map<std::string, at::Tensor> stored;
    for (const auto& entry : value.toGenericDict()) {
      if (!entry.key().isString() || !entry.value().isTensor())
        throw std::runtime_error("'" + path + "' holds a dict of " + entry.key().tagKind() +
                                 " -> " + entry.value().tagKind() +
                                 ", not a dict of name -> tensor" + kLoadHint);
      stored[entry.key().toStringRef()] = entry.value().toTensor();
    }

    at::NoGradGuard no_grad;
    for (const auto& [name, target] : into) {
      auto it = stored.find(name);
      if (it == stored.end())
        throw std::runtime_error("'" + path + "' has no tensor '" + name +
                                 "'; hint: was it saved by a different model?");
      const at::Tensor& src = it->second;
      if (src.scalar_type() != target.scalar_type() || src.sizes() != target.sizes())
        throw std::runtime_error("'" + path + "': tensor '" + name + "' is stored as " +
                                 describe(src) + " but the model expects " + describe(target) +
                                 "; hint: was it saved by a different model config or dtype?");
      target.copy_(src);
    }
  }
};

const keel_component_desc kComponents[] = {
    keel::component<TorchCheckpoint>(
        "torch", "checkpoints as .pt files (torch::pickle_save; Python: torch.load)"),
};

}  // namespace

KEEL_PLUGIN("keel-torch-checkpoint", "0.1.0", "torch .pt checkpoint backend", kComponents)
