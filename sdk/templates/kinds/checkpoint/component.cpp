#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kChecksum = keel::opt_bool(
    "checksum", "true", "store a checksum of each tensor's bytes, which load verifies");

// Each object ("model", "optimizer", ...) is one file, <stem>.tensors: the 8 bytes "KEELTNS1", a
// byte that is 1 when tensors carry checksums, then per tensor its name length (uint32), name,
// dtype (int32, at::ScalarType), dimension count (int32), sizes (int64 each), byte count
// (uint64), with checksums the FNV-1a hash of its bytes (uint64), and its bytes; integers in
// the machine's byte order. load verifies the checksums a file carries.
class @{Class} final : public keel::Checkpoint {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx) : checksum_(ctx.get(kChecksum)) {}

  void save(const std::string& dir, const std::string& stem,
            const keel::NamedTensors& tensors) override {
    std::string out = kMagic;
    out += checksum_ ? '\1' : '\0';
    for (const auto& [name, tensor] : tensors) {
      const at::Tensor t = tensor.contiguous();  // CPU tensors (abi.h)
      put<uint32_t>(out, static_cast<uint32_t>(name.size()));
      out += name;
      put<int32_t>(out, static_cast<int32_t>(t.scalar_type()));
      put<int32_t>(out, static_cast<int32_t>(t.dim()));
      for (int64_t size : t.sizes()) put<int64_t>(out, size);
      const size_t bytes = t.nbytes();
      const char* data = static_cast<const char*>(t.data_ptr());
      put<uint64_t>(out, bytes);
      if (checksum_) put<uint64_t>(out, fnv1a(data, bytes));
      if (bytes > 0) out.append(data, bytes);
    }
    const std::string path = dir + "/" + stem + ".tensors";
    std::ofstream file(path, std::ios::binary);
    file.write(out.data(), static_cast<std::streamsize>(out.size()));
    file.close();
    if (!file) throw std::runtime_error("writing '" + path + "' failed");
  }

  void load(const std::string& dir, const std::string& stem,
            const keel::NamedTensors& into) override {
    const std::string path = dir + "/" + stem + ".tensors";
    std::ifstream file(path, std::ios::binary);
    if (!file) throw std::runtime_error("cannot open '" + path + "'");
    const std::string bytes{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
    Reader r{bytes, path};
    if (r.take(kMagic.size()) != kMagic)
      throw std::runtime_error("'" + path + "' is not a @{component} file");
    const bool checksums = r.get<uint8_t>() != 0;
    std::map<std::string, Stored> stored;
    while (!r.done()) {
      Stored s;
      const std::string name = r.take(r.get<uint32_t>());
      s.dtype = static_cast<at::ScalarType>(r.get<int32_t>());
      s.sizes.resize(static_cast<size_t>(r.get<int32_t>()));
      for (int64_t& size : s.sizes) size = r.get<int64_t>();
      const uint64_t count = r.get<uint64_t>();
      s.checksum = checksums ? r.get<uint64_t>() : 0;
      s.data = r.take(count);
      stored[name] = std::move(s);
    }
    for (const auto& [name, tensor] : into) {
      const auto it = stored.find(name);
      if (it == stored.end())
        throw std::runtime_error("'" + path + "' holds no tensor '" + name + "'");
      const Stored& s = it->second;
      if (s.dtype != tensor.scalar_type() || at::IntArrayRef(s.sizes) != tensor.sizes()) {
        std::ostringstream m;
        m << "tensor '" << name << "' is stored as " << s.dtype << " " << at::IntArrayRef(s.sizes)
          << ", expected " << tensor.scalar_type() << " " << tensor.sizes();
        throw std::runtime_error(m.str());
      }
      if (checksums && fnv1a(s.data.data(), s.data.size()) != s.checksum)
        throw std::runtime_error("tensor '" + name + "' in '" + path +
                                 "' does not match its checksum: the file is damaged");
      at::Tensor value = at::empty(tensor.sizes(), at::TensorOptions().dtype(s.dtype));
      if (value.nbytes() != s.data.size())
        throw std::runtime_error("tensor '" + name + "' in '" + path + "' has the wrong size");
      if (!s.data.empty()) std::memcpy(value.data_ptr(), s.data.data(), s.data.size());
      tensor.detach().copy_(value);  // into the kernel's own tensor, on its device
    }
  }

 private:
  struct Stored {
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> sizes;
    uint64_t checksum = 0;
    std::string data;
  };
  // Reads the file's fields in order; a field past the end is an error naming the file.
  struct Reader {
    const std::string& bytes;
    const std::string& path;
    size_t pos = 0;
    bool done() const { return pos == bytes.size(); }
    std::string take(size_t n) {
      if (n > bytes.size() - pos) throw std::runtime_error("'" + path + "' is truncated");
      pos += n;
      return bytes.substr(pos - n, n);
    }
    template <class T>
    T get() {
      T v;
      std::memcpy(&v, take(sizeof v).data(), sizeof v);
      return v;
    }
  };
  template <class T>
  static void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  static uint64_t fnv1a(const char* p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
    return h;
  }

  inline static const std::string kMagic = "KEELTNS1";
  bool checksum_;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kChecksum};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
