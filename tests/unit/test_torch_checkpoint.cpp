// The `torch` checkpoint backend, loaded through the registry as the kernel loads it: save then
// load round-trips every dtype bit for bit, the file is a pickled dict of name -> tensor in the
// given order, and a missing tensor, a shape or dtype mismatch, a file that is not such a dict,
// and a failed write are refused with one line that names the file (and the tensor) and ends
// with a hint. Files of Python's torch.save (PyTorch 2.11's, committed in
// tests/fixtures/pt/torch-2.11, and those the build's own Python writes) load tensor by tensor,
// and the build's Python loads keel's with torch.load(weights_only=True).
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "components.hpp"
#include "host.hpp"
#include "keel/tensor.hpp"
#include "loader/registry.hpp"
#include "support.hpp"

namespace unit_torch_checkpoint {  // keel_units is one unity build: each file's names stay its own

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

const keel::Registry& registry() { return keel_test::default_registry(); }

keel::Instance<keel_checkpoint> backend(const char* type = "torch") {
  const keel::Component* c = registry().find(KEEL_KIND_CHECKPOINT, type);
  REQUIRE(c != nullptr);
  static keel_options none;
  keel_create_context ctx{};
  ctx.host = keel::host();
  ctx.options = &none;
  ctx.section = "checkpoint";
  return keel::create_instance<keel_checkpoint>(*c, ctx);
}

using Named = std::vector<std::pair<std::string, at::Tensor>>;

std::vector<keel_named_tensor> handles(const Named& tensors) {
  std::vector<keel_named_tensor> out;
  for (const auto& [name, t] : tensors) out.push_back({name.c_str(), keel::peek(t)});
  return out;
}

// Saves or loads <dir>/<stem>.pt (type "torch") or <dir>/<stem>.safetensors ("safetensors").
void save(const fs::path& dir, const Named& tensors, const char* type = "torch",
          const char* stem = "model") {
  const auto b = backend(type);
  const auto h = handles(tensors);
  b.call("save", b->save, dir.c_str(), stem, h.data(), h.size());
}

void load(const fs::path& dir, const Named& into, const char* type = "torch",
          const char* stem = "model") {
  const auto b = backend(type);
  const auto h = handles(into);
  b.call("load", b->load, dir.c_str(), stem, h.data(), h.size());
}

// Same dtype, same shape, same bytes (NaN and -0.0 included).
bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// The error message `f` throws, checked to be one line that ends with a hint.
template <class F>
std::string error_line(F&& f) {
  const std::string err = keel_test::error_of(f);
  CHECK_MESSAGE(err.find('\n') == std::string::npos, err);
  CHECK_MESSAGE(err.find("; hint: ") != std::string::npos, err);
  return err;
}

// `text` is evaluated once (CHECK_MESSAGE would evaluate it again to print it).
#define CHECK_HAS(text, part)                                              \
  do {                                                                     \
    const std::string text_ = (text);                                      \
    CHECK_MESSAGE(text_.find(part) != std::string::npos, text_);           \
  } while (0)

const std::string kLabel = "[checkpoint] checkpoint 'torch' (plugin keel-torch-checkpoint): ";

}  // namespace

TEST_CASE("save then load gives the same bits for every dtype, 0-dim tensors and views") {
  TempDir d;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor big = at::arange(100000, at::kFloat);
  const Named saved = {
      {"f32", at::tensor({1.5f, -0.0f, nan, 3e38f, 1e-45f}).reshape({5, 1})},
      {"f64", at::randn({3, 4}, at::kDouble)},
      {"i64", at::tensor({std::numeric_limits<int64_t>::min(), int64_t{0}, int64_t{42}})},
      {"bf16", at::randn({2, 3}).to(at::kBFloat16)},
      {"u8", at::tensor({0, 1, 255}, at::kByte)},
      {"scalar", at::scalar_tensor(2.25, at::kFloat)},
      {"i64_scalar", at::scalar_tensor(-7, at::kLong)},
      {"f16", at::randn({4}).to(at::kHalf)},
      {"bool", at::tensor({1, 0}, at::kByte).to(at::kBool)},
      {"empty", at::empty({0, 3})},
      // A non-contiguous view into the middle of a large buffer, with requires_grad.
      {"view", big.slice(0, 1000, 1012).reshape({3, 4}).t().requires_grad_(true)},
  };
  save(d.path, saved);
  const fs::path file = d.path / "model.pt";
  REQUIRE(fs::is_regular_file(file));
  // Only the view's 48 bytes are written, not the 400 kB buffer it points into.
  CHECK(fs::file_size(file) < 20000);

  Named fresh;
  for (const auto& [name, t] : saved) fresh.push_back({name, at::zeros_like(t.detach())});
  load(d.path, fresh);
  for (size_t i = 0; i < saved.size(); ++i) {
    INFO(saved[i].first);
    CHECK(bit_equal(saved[i].second.detach(), fresh[i].second));
  }
  CHECK(fresh[5].second.dim() == 0);
  CHECK(fresh[5].second.item<float>() == 2.25f);

  // The file is what torch.load and torch::pickle_load read: a dict of name -> tensor in the
  // order given, each tensor detached.
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue v = torch::jit::pickle_load(bytes);
  REQUIRE(v.isGenericDict());
  std::vector<std::string> order;
  for (const auto& e : v.toGenericDict()) {
    order.push_back(e.key().toStringRef());
    CHECK_FALSE(e.value().toTensor().requires_grad());
  }
  std::vector<std::string> want;
  for (const auto& [name, t] : saved) want.push_back(name);
  CHECK(order == want);
}

TEST_CASE("load copies only the tensors asked for, by name, in any order") {
  TempDir d;
  save(d.path, {{"a", at::full({2}, 1.0)}, {"b", at::full({3}, 2.0)}});
  const Named into = {{"b", at::zeros({3})}};
  load(d.path, into);
  CHECK(at::equal(into[0].second, at::full({3}, 2.0)));
}

TEST_CASE("a missing tensor, a shape or a dtype mismatch names the tensor and both sides") {
  TempDir d;
  save(d.path, {{"w", at::zeros({2, 3})}});
  const std::string file = (d.path / "model.pt").string();

  CHECK(error_line([&] { load(d.path, {{"w", at::zeros({2, 3})}, {"b", at::zeros({3})}}); }) ==
        kLabel + "load failed: '" + file + "' has no tensor 'b'; hint: was it saved by a "
        "different model?");
  CHECK(error_line([&] { load(d.path, {{"w", at::zeros({3, 2})}}); }) ==
        kLabel + "load failed: '" + file + "': tensor 'w' is stored as Float [2, 3] but the model "
        "expects Float [3, 2]; hint: was it saved by a different model config or dtype?");
  const std::string dtype =
      error_line([&] { load(d.path, {{"w", at::zeros({2, 3}, at::kDouble)}}); });
  CHECK_HAS(dtype, "tensor 'w' is stored as Float [2, 3] but the model expects Double [2, 3]");
}

TEST_CASE("a file that is not a pickled dict of name -> tensor is refused, naming the file") {
  TempDir d;
  const std::string file = (d.path / "model.pt").string();
  const Named into = {{"w", at::zeros({2})}};
  auto write = [&](const std::string& bytes) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  };
  auto write_pickle = [&](const c10::IValue& v) {
    const std::vector<char> b = torch::jit::pickle_save(v);
    write(std::string(b.begin(), b.end()));
  };
  const std::string not_zip = kLabel + "load failed: '" + file + "': not a zip archive (no "
                              "end-of-central-directory record at its end: truncated, or not a "
                              ".pt file); hint: keel loads only .pt files that hold a dict of "
                              "tensors (nested dicts and lists too)";

  write("this is not a zip archive");
  CHECK_HAS(error_line([&] { load(d.path, into); }), not_zip);
  write("");
  CHECK_HAS(error_line([&] { load(d.path, into); }), not_zip);

  // A valid file cut in half (the zip directory at its end is gone).
  save(d.path, {{"w", at::ones({1000})}});
  const std::string whole = keel_test::read(file);
  write(whole.substr(0, whole.size() / 2));
  CHECK_HAS(error_line([&] { load(d.path, into); }), not_zip);

  write_pickle(c10::List<at::Tensor>({at::zeros({2})}));
  CHECK_HAS(error_line([&] { load(d.path, into); }),
            "load failed: '" + file + "': data.pkl, byte 2: global "
            "'torch.jit._pickle.build_tensorlist', which is not on keel's allow-list");
  c10::Dict<std::string, int64_t> ints;
  ints.insert("w", 3);
  write_pickle(ints);
  const std::string err = error_line([&] { load(d.path, into); });
  CHECK_HAS(err, "load failed: '" + file + "': data.pkl, byte ");
  CHECK_HAS(err, ": restore_type_tag of anything but a Dict[str, Tensor]; hint: ");
}

namespace {

// ---- crafted .pt files: a pickle written opcode by opcode, in a zip that LibTorch's own
// writer makes (so that the old reader, which checks CRCs, got past the archive) ----

std::string u32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string str(const std::string& v) { return "X" + u32(static_cast<uint32_t>(v.size())) + v; }
std::string i64(int64_t v) {  // LONG1, 8 bytes
  std::string s = "\x8a\x08";
  for (int i = 0; i < 8; ++i) s += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  return s;
}
std::string tuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (int64_t x : v) s += i64(x);
  return s + "t";
}

struct Geometry {
  std::vector<int64_t> sizes = {2, 3}, strides = {3, 1};
  int64_t offset = 0, numel = 6;
};

// A tensor as Python's torch.save writes it: _rebuild_tensor_v2 of storage '0'.
std::string tensor_value(const Geometry& g, const std::string& storage_class = "FloatStorage") {
  return "ctorch._utils\n_rebuild_tensor_v2\n((" + str("storage") + "ctorch\n" + storage_class +
         "\n" + str("0") + str("cpu") + i64(g.numel) + "tQ" + i64(g.offset) + tuple(g.sizes) +
         tuple(g.strides) + "\x89" "ccollections\nOrderedDict\n)RtR";
}

// {"w": tensor} as Python's torch.save writes a dict.
std::string tensor_pickle(const Geometry& g, const std::string& storage_class = "FloatStorage") {
  return "\x80\x02}(" + str("w") + tensor_value(g, storage_class) + "u.";
}

std::string archive(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter w([&](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return n;
  });
  for (const auto& [name, data] : records) w.writeRecord(name, data.data(), data.size());
  w.writeEndOfFile();
  return out;
}

std::string floats(int n) {  // n floats 0, 1, 2, ...
  std::string s(static_cast<size_t>(n) * 4, '\0');
  for (int i = 0; i < n; ++i) {
    const float f = static_cast<float>(i);
    std::memcpy(&s[static_cast<size_t>(i) * 4], &f, 4);
  }
  return s;
}

std::string pt(const Geometry& g, int data_floats = 6) {
  return archive({{"data.pkl", tensor_pickle(g)}, {"data/0", floats(data_floats)}});
}

}  // namespace

TEST_CASE("crafted .pt files are refused with one line each, before any tensor is built") {
  TempDir d;
  const std::string file = (d.path / "model.pt").string();
  auto write = [&](const std::string& bytes) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  };

  // The crafted form itself loads: {"w": [2, 3]} over floats 0..5, and a strided view with an
  // offset into a larger storage gathers the right elements.
  write(pt({}));
  Named into = {{"w", at::zeros({2, 3})}};
  load(d.path, into);
  CHECK(at::equal(into[0].second, at::arange(6, at::kFloat).reshape({2, 3})));
  write(pt({{2, 3}, {1, 2}, 1, 12}, 12));  // element [i][j] = 1 + i + 2 j
  load(d.path, into);
  CHECK(at::equal(into[0].second,
                  at::tensor({1.f, 3.f, 5.f, 2.f, 4.f, 6.f}).reshape({2, 3})));

  const int64_t big = int64_t{1} << 60;
  const std::string good_pkl = tensor_pickle({});
  const struct {
    const char* name;
    std::string bytes;
    std::string phrase;
  } cases[] = {
      {"huge stride", pt({{2, 3}, {big, 1}}),
       "a tensor of sizes [2, 3], strides [1152921504606846976, 1], storage offset 0 on storage "
       "'0' of 6 elements: it reaches element 1152921504606846978, past the storage's end"},
      {"stride overflowing 64 bits", pt({{3}, {INT64_MAX}}), "its extent overflows 64 bits"},
      {"stride beyond the storage (reads the heap)", pt({{2, 3}, {64, 1}}),
       "it reaches element 66, past the storage's end"},
      // issue 43, finding 8: a 2.5 KB .pt whose stride-0 tensor claimed [2^28, 2] over one
      // element had --resume touch 2 GB; a tensor's elements must be in its storage.
      {"stride 0 over one element", pt({{2, 3}, {0, 0}, 0, 1}, 1),
       "a tensor of sizes [2, 3], strides [0, 0], storage offset 0 on storage '0' of 1 elements: "
       "its 6 elements are more than its storage holds (a view repeating elements, such as "
       "stride 0, is not a tensor keel loads)"},
      {"overlapping strides", pt({{2, 3}, {1, 1}, 0, 4}, 4),
       "its 6 elements are more than its storage holds"},
      {"negative size", pt({{-1, 3}, {3, 1}}), ": a negative size"},
      {"negative stride", pt({{2, 3}, {-3, 1}}), ": a negative stride"},
      {"negative storage offset", pt({{2, 3}, {3, 1}, -1}), ": a negative storage offset"},
      {"storage offset beyond", pt({{2, 3}, {3, 1}, 100}),
       "it reaches element 105, past the storage's end"},
      {"offset of an empty tensor beyond", pt({{0, 3}, {3, 1}, 7}),
       "the offset lies past the storage's end"},
      {"sizes and strides of different lengths", pt({{2, 3}, {3}}),
       "sizes and strides differ in length"},
      {"storage record shorter than its numel", pt({{2, 3}, {3, 1}, 0, 1000}),
       "record 'archive/data/0' holds 24 bytes, but its storage of 1000 Float elements needs "
       "4000"},
      {"numel whose byte size overflows", pt({{1}, {1}, 0, INT64_MAX}),
       "but its storage of 9223372036854775807 Float elements needs more"},
      {"empty pickle stack", archive({{"data.pkl", "\x80\x02."}, {"data/0", floats(6)}}),
       "data.pkl, byte 2: STOP with 0 values and 0 marks on the stack"},
      {"pop from an empty stack", archive({{"data.pkl", "\x80\x02s."}}),
       "data.pkl, byte 2: a pop from an empty stack"},
      {"os.system", archive({{"data.pkl", "\x80\x02" "cos\nsystem\n" + str("true") + "\x85R."}}),
       "data.pkl, byte 2: global 'os.system', which is not on keel's allow-list"},
      {"builtins.eval", archive({{"data.pkl", "\x80\x02" "cbuiltins\neval\n" + str("1") + "\x85R."}}),
       "global 'builtins.eval', which is not on keel's allow-list"},
      {"a storage class called", archive({{"data.pkl", "\x80\x02" "ctorch\nFloatStorage\n)R."}}),
       "data.pkl, byte 23: a call of 'torch.FloatStorage'"},
      {"protocol 4", archive({{"data.pkl", "\x80\x04}."}}), "pickle protocol other than 2"},
      {"truncated pickle", archive({{"data.pkl", good_pkl.substr(0, 7)}, {"data/0", floats(6)}}),
       "the pickle ends early (truncated?)"},
      {"truncated archive", pt({}).substr(0, pt({}).size() - 30), "not a zip archive"},
      {"extra unlisted record",
       archive({{"data.pkl", good_pkl}, {"data/0", floats(6)}, {"extra.so", "\x7f" "ELF"}}),
       "record 'archive/extra.so' is not one that keel or torch.save writes"},
      // PyTorch 2.x's records: a byte order other than little-endian is refused, not swapped.
      {"big-endian byteorder record",
       archive({{"data.pkl", good_pkl}, {"data/0", floats(6)}, {"byteorder", "big"}}),
       "record 'archive/byteorder' says 'big': its tensors' bytes are big-endian, and keel reads "
       "little-endian .pt files only"},
      {"unknown byteorder", archive({{"data.pkl", good_pkl}, {"data/0", floats(6)}, {"byteorder", "pdp\n"}}),
       "record 'archive/byteorder' holds 'pdp', not a byte order ('little')"},
      {".format_version out of range",
       archive({{"data.pkl", good_pkl}, {"data/0", floats(6)}, {".format_version", "99"}}),
       "record 'archive/.format_version' holds '99', not a file format version from 1 to 10"},
      // Nested values (an optimizer's state dict): the names they make, lists, int keys.
      {"a list inside itself",
       archive({{"data.pkl", std::string("\x80\x02}(") + str("w") + std::string("]q\0h\0a", 6) + "u."}}),
       "a list inside itself"},
      {"append to a list already placed",
       archive({{"data.pkl", std::string("\x80\x02}(") + str("w") + std::string("]q\0u", 4) +
                                 std::string("h\0", 2) + "Na."}}),
       "APPEND(S) on a list already placed inside another value"},
      {"an int key and a string key alike",
       archive({{"data.pkl", "\x80\x02}(K\x07N" + str("7") + "Nu."}}), "the dict key '7' twice"},
      {"two tensors one name once nested",
       archive({{"data.pkl", "\x80\x02}(" + str("a.b") + tensor_value({}) + str("a") + "}" +
                                 str("b") + tensor_value({}) + "su."},
                {"data/0", floats(6)}}),
       "data.pkl names two tensors 'a.b'"},
      {"a float as a dict key", archive({{"data.pkl", "\x80\x02}(G" + std::string(8, '\0') + "Nu."}}),
       "a dict key that is a float"},
      {"_rebuild_parameter of a non-tensor",
       archive({{"data.pkl", "\x80\x02}(" + str("w") + "ctorch._utils\n_rebuild_parameter\n(N\x89}tRu."}}),
       "_rebuild_parameter called with other arguments than (tensor, requires_grad, empty hooks)"},
      // Lists each holding the one before 64 times: 64^5 values to walk from 700 bytes.
      {"a list of lists shared many times", [] {
         std::string pkl = std::string("\x80\x02}(") + str("w0") + std::string("]q\0", 3);
         for (char level = 1; level <= 5; ++level) {
           pkl += str("w" + std::to_string(level)) + "](";
           for (int k = 0; k < 64; ++k) pkl += std::string("h") + static_cast<char>(level - 1);
           pkl += std::string("eq") + level;
         }
         return archive({{"data.pkl", pkl + "u."}});
       }(),
       "data.pkl: naming its tensors walks over 4194304 values"},
      // A dict with a 1 MiB key placed 65 times in a list: 65 MiB of names from a 1 MiB file.
      {"names of over 64 MiB", [] {
         std::string pkl = std::string("\x80\x02}(") + str("w") + "](}" +
                           str(std::string(1 << 20, 'k')) + "Nsq\x01";
         for (int k = 0; k < 64; ++k) pkl += "h\x01";
         return archive({{"data.pkl", pkl + "eu."}});
       }(),
       "data.pkl: naming its tensors makes over 67108864 bytes of names"},
      {"data record the pickle does not name",
       archive({{"data.pkl", good_pkl}, {"data/0", floats(6)}, {"data/1", floats(6)}}),
       "record 'archive/data/1' is not a storage data.pkl names"},
      {"missing data record", archive({{"data.pkl", good_pkl}}),
       "data.pkl names storage '0', but there is no record 'archive/data/0'"},
      {"bool storage holding 7", archive({{"data.pkl", tensor_pickle({}, "BoolStorage")},
                                          {"data/0", std::string(5, '\1') + "\7"}}),
       "holds a bool that is neither 0 nor 1"},
      {"a dict inside itself",
       archive({{"data.pkl", std::string("\x80\x02}q\0(", 6) + str("w") +
                                                std::string("h\0u.", 4)}}), "a dict inside itself"},
  };
  for (const auto& c : cases) {
    INFO(std::string(c.name));
    write(c.bytes);
    Named target = {{"w", at::zeros({2, 3})}};
    const std::string err = error_line([&] { load(d.path, target); });
    CHECK_HAS(err, kLabel + "load failed: '" + file + "': ");
    CHECK_HAS(err, c.phrase);
    CHECK(at::equal(target[0].second, at::zeros({2, 3})));  // nothing was copied
  }
}

TEST_CASE("only regular files are read; a missing file is named") {
  TempDir d;
  const Named into = {{"w", at::zeros({2})}};
  CHECK_HAS(error_line([&] { load(d.path, into); }),
            "cannot open '" + (d.path / "model.pt").string() + "': No such file or directory; hint: ");
  fs::create_directory(d.path / "model.pt");
  CHECK_HAS(error_line([&] { load(d.path, into); }),
            "cannot read '" + (d.path / "model.pt").string() + "': not a regular file; hint: ");
}

TEST_CASE("a failed write or close, or a duplicate name, fails the save naming the file") {
  TempDir d;
  const std::string file = (d.path / "model.pt").string();
  CHECK(error_line([&] { save(d.path / "missing", {{"w", at::zeros({2})}}); }) ==
        kLabel + "save failed: cannot create '" + (d.path / "missing/model.pt").string() +
        "': No such file or directory; hint: check that the run directory is writable and has "
        "space (disk full?)");
  // /dev/full accepts the open and refuses every write with ENOSPC: a small file fails when
  // stdio flushes its buffer at close, a large one already in fwrite.
  fs::create_symlink("/dev/full", file);
  CHECK(error_line([&] { save(d.path, {{"w", at::zeros({2})}}); }) ==
        kLabel + "save failed: closing '" + file + "' failed: No space left on device; hint: "
        "check that the run directory is writable and has space (disk full?)");
  CHECK_HAS(error_line([&] { save(d.path, {{"w", at::zeros({1 << 20})}}); }),
            "save failed: writing '" + file + "' failed: No space left on device; hint: ");
  fs::remove(file);
  CHECK_HAS(error_line([&] { save(d.path, {{"w", at::zeros({2})}, {"w", at::zeros({2})}}); }),
            "save failed: saving '" + file + "': tensor name 'w' appears twice; hint: ");
}

namespace {

// ---- .pt files written by Python's torch.save: tests/fixtures/pt/write_pt.py writes each
// <stem>.pt beside a <stem>.safetensors of the same tensors under keel's names for them
// (nested keys joined with '.', list items by index); every tensor here is loaded from both,
// by the two backends, and compared bit for bit ----

struct PyTensor {
  const char* stem;
  const char* name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

std::vector<PyTensor> python_tensors() {
  using at::kFloat;
  std::vector<PyTensor> t = {
      {"dtypes", "f32", kFloat, {2, 3}},         {"dtypes", "f64", at::kDouble, {3}},
      {"dtypes", "f16", at::kHalf, {4}},         {"dtypes", "bf16", at::kBFloat16, {2, 2}},
      {"dtypes", "i64", at::kLong, {3}},         {"dtypes", "i32", at::kInt, {2}},
      {"dtypes", "i8", at::kChar, {3}},          {"dtypes", "u8", at::kByte, {3}},
      {"dtypes", "bool", at::kBool, {4}},        {"dtypes", "scalar", kFloat, {}},
      {"dtypes", "empty", kFloat, {0, 3}},       {"dtypes", "view", kFloat, {4, 3}},
      {"nested", "encoder.layer.weight", kFloat, {2, 3}},
      {"nested", "encoder.layer.bias", at::kBFloat16, {2}},
      {"nested", "encoder.scale", at::kHalf, {3}},  // an nn.Parameter
      {"nested", "blocks.0", at::kLong, {3}},    {"nested", "blocks.1", at::kBool, {2}},
      {"nested", "pair.0", at::kChar, {2}},      {"nested", "3.x", at::kInt, {1}},
      {"nested", "tied_a", kFloat, {2, 2}},      {"nested", "tied_b", kFloat, {2, 2}},
      {"model", "0.weight", kFloat, {3, 4}},     {"model", "0.bias", kFloat, {3}},
      {"model", "1.weight", kFloat, {3}},        {"model", "1.bias", kFloat, {3}},
      {"model", "1.running_mean", kFloat, {3}},  {"model", "1.running_var", kFloat, {3}},
      {"model", "1.num_batches_tracked", at::kLong, {}},
      {"model", "2.weight", kFloat, {2, 3}},     {"model", "2.bias", kFloat, {2}},
  };
  // AdamW's state per parameter of the model above, in its order.
  const std::vector<std::vector<int64_t>> params = {{3, 4}, {3}, {3}, {3}, {2, 3}, {2}};
  static std::vector<std::string> names;  // the table points into it
  if (names.empty())
    for (size_t i = 0; i < params.size(); ++i)
      for (const char* field : {"step", "exp_avg", "exp_avg_sq"})
        names.push_back("state." + std::to_string(i) + "." + field);
  for (size_t i = 0; i < names.size(); ++i) {
    const bool step = i % 3 == 0;
    t.push_back({"adamw", names[i].c_str(), kFloat,
                 step ? std::vector<int64_t>{} : params[i / 3]});
  }
  return t;
}

// Every tensor of the table, loaded from <dir>/<stem>.pt by the torch backend, equals the one
// loaded from <dir>/<stem>.safetensors, and holds the values (not the zeros it started as).
void check_python_files(const fs::path& dir) {
  const std::vector<PyTensor> table = python_tensors();
  for (const char* stem : {"dtypes", "nested", "model", "adamw"}) {
    Named from_pt, from_st;
    std::vector<std::string> labels;
    for (const PyTensor& t : table)
      if (std::string(t.stem) == stem) {
        from_pt.push_back({t.name, at::zeros(t.shape, at::TensorOptions().dtype(t.dtype))});
        from_st.push_back({t.name, at::zeros(t.shape, at::TensorOptions().dtype(t.dtype))});
        labels.push_back(dir.filename().string() + "/" + stem + ".pt: " + t.name);
      }
    INFO((dir / stem).string());
    CHECK_NOTHROW(load(dir, from_pt, "torch", stem));
    CHECK_NOTHROW(load(dir, from_st, "safetensors", stem));
    for (size_t i = 0; i < from_pt.size(); ++i) {
      INFO(labels[i]);
      CHECK(bit_equal(from_pt[i].second, from_st[i].second));
      const at::Tensor c = from_st[i].second.contiguous();
      const auto* p = static_cast<const unsigned char*>(c.data_ptr());
      CHECK((c.nbytes() == 0 || std::any_of(p, p + c.nbytes(), [](unsigned char b) { return b; })));
    }
  }
}

}  // namespace

TEST_CASE("PyTorch 2.11's torch.save files load tensor by tensor: dtypes, nested, a module's and "
          "an optimizer's state dicts") {
  const fs::path dir = fs::path(KEEL_SOURCE_ROOT) / "tests/fixtures/pt/torch-2.11";
  CHECK(keel_test::read(dir / "torch_version.txt").rfind("2.11.", 0) == 0);
  // What sets these files apart from 1.13's: the records torch.save writes since 2.x.
  const std::string pt = keel_test::read(dir / "model.pt");
  for (const char* record : {"model/byteorder", "model/.data/serialization_id",
                             "model/.format_version", "model/.storage_alignment"})
    CHECK_MESSAGE(pt.find(record) != std::string::npos, record);
  check_python_files(dir);

  // The same file with its serialization id's first digit made an 'x' is refused, one line.
  TempDir d;
  std::string bad = pt;
  const std::string id = "model/.data/serialization_id";
  const size_t at = bad.find(id);  // in the local header, whose fixed part is 30 bytes
  REQUIRE(at != std::string::npos);
  REQUIRE(at >= 30);
  const size_t extra = static_cast<unsigned char>(bad[at - 30 + 28]) |
                       static_cast<size_t>(static_cast<unsigned char>(bad[at - 30 + 29])) << 8;
  bad[at + id.size() + extra] = 'x';
  std::ofstream(d.path / "model.pt", std::ios::binary) << bad;
  CHECK_HAS(error_line([&] { load(d.path, {{"0.bias", at::zeros({3})}}); }),
            "load failed: '" + (d.path / "model.pt").string() + "': record "
            "'model/.data/serialization_id' holds 'x");
}

TEST_CASE("the build's Python: its torch.save files load here, and keel's .pt loads there with "
          "torch.load(weights_only=True)") {
  TempDir d;
  fs::create_directories(d.path / "keel");
  at::Tensor big = at::arange(30, at::kFloat);
  const Named keel_tensors = {
      {"f32", at::randn({2, 3})},
      {"f64", at::randn({3}, at::kDouble)},
      {"f16", at::randn({4}).to(at::kHalf)},
      {"bf16", at::randn({2, 2}).to(at::kBFloat16)},
      {"i64", at::tensor({std::numeric_limits<int64_t>::min(), int64_t{5}})},
      {"i32", at::tensor({-3, 4}, at::kInt)},
      {"i8", at::tensor({-128, 127}, at::kChar)},
      {"u8", at::tensor({0, 255}, at::kByte)},
      {"bool", at::tensor({1, 0, 1}, at::kByte).to(at::kBool)},
      {"scalar", at::scalar_tensor(-1.5, at::kFloat)},
      {"empty", at::empty({0, 2})},
      {"view", big.slice(0, 3, 15).reshape({3, 4}).t()},
  };
  save(d.path / "keel", keel_tensors, "torch", "model");
  save(d.path / "keel", keel_tensors, "safetensors", "model");
  const std::string cmd = std::string("'") + KEEL_TORCH_PYTHON + "' '" KEEL_SOURCE_ROOT
                          "/tests/fixtures/pt/write_pt.py' '" + (d.path / "python").string() +
                          "' '" + (d.path / "keel").string() + "' 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) text += buf;
  REQUIRE_MESSAGE(pclose(p) == 0, cmd << " failed:\n" << text);
  MESSAGE("the Python's torch: " << keel_test::read(d.path / "python/torch_version.txt").substr(0, 40));
  check_python_files(d.path / "python");
}

}  // namespace unit_torch_checkpoint
