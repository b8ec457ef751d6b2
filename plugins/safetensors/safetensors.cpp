// checkpoint component: the safetensors format (https://github.com/huggingface/safetensors).
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header (padded with spaces to
// a multiple of 8), then the tensors' raw little-endian bytes, back to back, in header order.
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/plugin.hpp"
#include "keel/tensor.hpp"
#include "safetensors_header.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the safetensors plugin assumes a little-endian host"
#endif

namespace {

// The dtypes LibTorch can load and save here are keel's (keel::kDtypes, keel/tensor.hpp); the
// format defines more (safetensors_header.cpp): a checkpoint holding those is read, but not
// loaded into a model.
using keel::dtype_of;

using keel_safetensors::shape_string;

// ---------------------------------------------------------------------------------------------
// File access.
// ---------------------------------------------------------------------------------------------
class File {
 public:
  File(const std::string& path, const char* mode) : path_(path) {
    if (mode[0] == 'r') {
      // Only regular files are read, never through a symbolic link (the checkpoint's own file,
      // as its commit record verified it), and opening does not block (a FIFO would).
      const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0 && errno == ELOOP)
        throw std::runtime_error("cannot read '" + path + "': a symbolic link, not a file of "
                                 "the checkpoint; hint: copy the checkpoint with its files "
                                 "(cp -rL)");
      struct stat st {};
      if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        ::close(fd);
        throw std::runtime_error("cannot read '" + path + "': not a regular file; hint: point "
                                 "it at a checkpoint directory (runs/<name>/checkpoints/step-<N>)");
      }
      f_ = fd >= 0 ? ::fdopen(fd, mode) : nullptr;
      if (fd >= 0 && f_ == nullptr) ::close(fd);
    } else {
      f_ = std::fopen(path.c_str(), mode);
    }
    if (f_ == nullptr)
      throw std::runtime_error(
          "cannot open '" + path + "': " + std::strerror(errno) +
          (mode[0] == 'r' ? "; hint: point it at a checkpoint directory that holds this file "
                            "(runs/<name>/checkpoints/step-<N>)"
                          : "; hint: check that the run directory is writable and has space"));
  }
  ~File() {
    if (f_) std::fclose(f_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  void write(const void* data, size_t n) {
    if (n > 0 && std::fwrite(data, 1, n, f_) != n)
      throw std::runtime_error("writing '" + path_ + "' failed (disk full?)");
  }
  void read(void* data, size_t n, const char* what) {
    if (n > 0 && std::fread(data, 1, n, f_) != n)
      throw std::runtime_error("'" + path_ + "': cannot read " + what + " (file truncated?)");
  }
  void seek(uint64_t pos) {
    if (fseeko(f_, static_cast<off_t>(pos), SEEK_SET) != 0)
      throw std::runtime_error("'" + path_ + "': seek failed");
  }
  uint64_t size() {
    if (fseeko(f_, 0, SEEK_END) != 0) throw std::runtime_error("'" + path_ + "': seek failed");
    const off_t n = ftello(f_);
    seek(0);
    return static_cast<uint64_t>(n);
  }
  void close() {
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0)
      throw std::runtime_error("closing '" + path_ + "' failed (disk full?)");
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

class SafeTensors : public keel::Checkpoint {
 public:
  explicit SafeTensors(const keel::Context&) {}

  void save(const std::string& dir, const std::string& stem,
            const keel::NamedTensors& tensors) override {
    const std::string path = dir + "/" + stem + ".safetensors";
    std::vector<at::Tensor> data;
    std::set<std::string> seen;
    // Tensors in the given order, then __metadata__ (ordered_json keeps insertion order).
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    uint64_t offset = 0;
    for (const auto& [name, tensor] : tensors) {
      if (!seen.insert(name).second)
        throw std::runtime_error("saving '" + path + "': tensor name '" + name +
                                 "' appears twice; names must be unique");
      if (name == "__metadata__")
        throw std::runtime_error("saving '" + path +
                                 "': '__metadata__' is reserved and cannot name a tensor");
      const keel::Dtype* d = dtype_of(tensor.scalar_type());
      if (d == nullptr)
        throw std::runtime_error("saving '" + path + "': tensor '" + name +
                                 "' has unsupported dtype " +
                                 std::string(at::toString(tensor.scalar_type())) +
                                 " (supported: F32 F64 F16 BF16 I64 I32 I8 U8 BOOL)");
      at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
      const uint64_t n = t.nbytes();
      header.push_back({name,
                        {{"dtype", d->name},
                         {"shape", t.sizes().vec()},
                         {"data_offsets", {offset, offset + n}}}});
      offset += n;
      data.push_back(std::move(t));
    }
    header["__metadata__"] = {{"format", "pt"}};
    std::string text;
    try {
      text = header.dump();
    } catch (const nlohmann::json::type_error&) {  // a name that is not UTF-8
      throw std::runtime_error("saving '" + path +
                               "': a tensor name is not valid UTF-8, which the format requires");
    }
    text.append((8 - text.size() % 8) % 8, ' ');

    File f(path, "wb");
    unsigned char len[8];
    for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>(text.size() >> (8 * k));
    f.write(len, 8);
    f.write(text.data(), text.size());
    for (const at::Tensor& t : data) f.write(t.data_ptr(), t.nbytes());
    f.close();
  }

  void load(const std::string& dir, const std::string& stem,
            const keel::NamedTensors& into) override {
    const std::string path = dir + "/" + stem + ".safetensors";
    File f(path, "rb");
    const uint64_t file_size = f.size();
    std::string prefix(std::min<uint64_t>(file_size, keel_safetensors::kLengthBytes), '\0');
    f.read(&prefix[0], prefix.size(), "the header length");
    const uint64_t n = keel_safetensors::read_header_size(prefix, file_size, path);
    std::string text(n, '\0');
    f.read(&text[0], n, "the header");
    const keel_safetensors::Header header = keel_safetensors::parse_header(text, file_size, path);

    std::map<std::string, const keel_safetensors::TensorEntry*> by_name;
    for (const auto& e : header.tensors) by_name[e.name] = &e;

    at::NoGradGuard no_grad;
    for (const auto& [name, target] : into) {
      auto it = by_name.find(name);
      if (it == by_name.end())
        throw std::runtime_error("'" + path + "' has no tensor '" + name +
                                 "' (was it saved by a different model?)");
      const keel_safetensors::TensorEntry& e = *it->second;
      const keel::Dtype* want = dtype_of(target.scalar_type());
      if (want == nullptr || std::string(e.dtype->name) != want->name)
        throw std::runtime_error(
            "'" + path + "': tensor '" + name + "' is stored as " + e.dtype->name +
            " but the model expects " +
            (want ? want->name : std::string(at::toString(target.scalar_type()))) +
            " (was it saved with a different dtype setting?)");
      if (target.sizes().vec() != e.shape)
        throw std::runtime_error("'" + path + "': tensor '" + name + "' has shape " +
                                 shape_string(e.shape) + " but the model expects " +
                                 shape_string(target.sizes().vec()) +
                                 " (was it saved by a different model config?)");
      at::Tensor buf = at::empty(e.shape, at::TensorOptions().dtype(target.scalar_type()));
      f.seek(header.data_start() + e.begin);
      f.read(buf.data_ptr(), e.end - e.begin, "tensor data");
      target.copy_(buf);
    }
  }
};

const keel_component_desc kComponents[] = {
    keel::component<SafeTensors>("safetensors", "checkpoints in the safetensors format"),
};

}  // namespace

KEEL_PLUGIN("keel-safetensors", "0.1.0", "safetensors checkpoint backend", kComponents)
