// keel::testing: unit-test a plugin's components without the kernel.
//
// A test hands the harness the plugin's own descriptor (link the plugin's object files into the
// test and call its keel_plugin_entry(), as projects written by `keel plugins new` do), creates
// a component by kind and name with a few options, calls its slots and checks what comes back:
//
//   #include "keel/testing.hpp"  // before doctest.h: a LibTorch built with glog (Debian's is)
//                                // defines CHECK macros that would silently replace doctest's
//   #define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
//   #include <doctest/doctest.h>
//   extern "C" const keel_plugin_descriptor* keel_plugin_entry(void);  // the plugin under test
//
//   keel::testing::Plugin plugin(keel_plugin_entry());
//   auto scheduler = plugin.create<keel_lr_scheduler>("halving", {{"every", 10}});
//   CHECK(scheduler.call(scheduler->factor, 25) == 0.25);
//
// What the harness does, as the kernel does it:
//  - options: the ones given are checked against the component's schema (known key, type,
//    bounds, finite floats, choices) and every other option takes its schema default; a
//    required option left out is an error. A relative PATH option is made absolute against the
//    working directory. Defaults are read by a small TOML reader (booleans, integers, floats,
//    strings, arrays of numbers: what option defaults are), not by the kernel's TOML parser.
//  - the host (keel_host) works on at::Tensor, as the kernel's does: a keel_tensor* is an
//    at::TensorImpl*, so keel::borrow/adopt/peek (keel/tensor.hpp) convert handles both ways.
//    log lines are kept (log_lines()) instead of printed.
//  - LibTorch's default CPU generator is seeded with Setup::seed before each factory runs.
//  - every failure (a factory or slot returning KEEL_ERR, a slot calling
//    keel_host.report_error, a bad option) throws std::runtime_error naming the component.
// What it leaves out: the kernel's checks of what a component returns (batch shapes, a loss's
// dtype, parameter names, ...), parameter groups (the context has none, so an optimizer sees
// one group), device placement, threads, and the ABI-version negotiation with older plugins.
// So a component that passes here must still pass the kernel's own checks in `keel train`.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "keel/abi.h"
#include "keel/tensor.hpp"

namespace keel::testing {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// An option value as a test writes it: {"lr", 0.1}, {"every", 10}, {"name", "x"},
// {"sizes", std::vector<int64_t>{4, 2}} (each constructor is implicit for that). An integer is
// accepted for a float option.
class Value {
 public:
  using Storage = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>>;
  Value(bool v) : v_(v) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Value(T v) : v_(static_cast<int64_t>(v)) {}
  Value(double v) : v_(v) {}
  Value(const char* v) : v_(std::string(v)) {}
  Value(std::string v) : v_(std::move(v)) {}
  Value(std::vector<int64_t> v) : v_(std::move(v)) {}
  Value(std::vector<double> v) : v_(std::move(v)) {}
  const Storage& storage() const { return v_; }

 private:
  Storage v_;
};
using Options = std::vector<std::pair<std::string, Value>>;

// The create context's fields a test may set.
struct Setup {
  std::string section = "test";  // the manifest section, as messages name it
  uint64_t seed = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string run_dir;  // "": a fresh temporary directory, removed with the instance
  int64_t total_steps = 0;
  int64_t resume_step = 0;
  NamedTensors params;  // optimizer, grad_clipper: the model's parameters (borrowed)
};

// The lines components logged through keel_host.log, as "LEVEL [origin] message".
std::vector<std::string> log_lines();
void clear_log_lines();

namespace detail {

// What a keel_options* points to in the harness (the kernel's own type stays opaque here).
struct OptionValues {
  std::map<std::string, Value::Storage> values;
};

inline const OptionValues* values(const keel_options* o) {
  return reinterpret_cast<const OptionValues*>(o);
}

[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error(message); }

inline std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

inline const char* kind_name(keel_kind kind) {
  static const char* const names[] = {"?",            "model",    "dataset",      "optimizer",
                                      "lr_scheduler", "loss",     "grad_clipper", "mfu",
                                      "profiler",     "checkpoint", "hook"};
  return kind >= KEEL_KIND_MODEL && kind <= KEEL_KIND_HOOK ? names[kind] : names[0];
}

// ---- the TOML subset option defaults are written in -----------------------------------------
class DefaultReader {
 public:
  explicit DefaultReader(std::string text) : s_(std::move(text)) {}

  Value::Storage read() {
    Value::Storage v = value();
    space();
    if (i_ != s_.size()) bad("unexpected text after the value");
    return v;
  }

 private:
  Value::Storage value() {
    space();
    for (const bool b : {true, false}) {
      const char* word = b ? "true" : "false";
      if (rest(word)) {
        i_ += std::strlen(word);
        return b;
      }
    }
    if (peek() == '"' || peek() == '\'') return string();
    if (peek() == '[') return array();
    return scalar();
  }
  Value::Storage array() {
    ++i_;  // '['
    std::vector<int64_t> ints;
    std::vector<double> floats;
    bool all_ints = true;
    for (;;) {
      space();
      if (peek() == ']') break;
      const Value::Storage e = scalar();
      if (const auto* i = std::get_if<int64_t>(&e)) {
        ints.push_back(*i);
        floats.push_back(static_cast<double>(*i));
      } else {
        all_ints = false;
        floats.push_back(std::get<double>(e));
      }
      space();
      if (peek() == ',') ++i_;
      else if (peek() != ']') bad("expected ',' or ']' in the array");
    }
    ++i_;  // ']'
    if (all_ints) return ints;
    return floats;
  }
  Value::Storage scalar() {
    size_t end = i_;
    while (end < s_.size() && std::strchr("+-_.0123456789abcdefinoxABCDEF", s_[end])) ++end;
    std::string t;
    for (size_t k = i_; k < end; ++k)
      if (s_[k] != '_') t += s_[k];
    if (t.empty()) bad("expected a value");
    i_ = end;
    const std::string digits = t[0] == '+' || t[0] == '-' ? t.substr(1) : t;
    if (digits == "inf" || digits == "nan") return std::strtod(t.c_str(), nullptr);
    int base = 10;
    if (digits.size() > 2 && digits[0] == '0' && std::strchr("xob", digits[1])) {
      base = digits[1] == 'x' ? 16 : digits[1] == 'o' ? 8 : 2;
      t = digits.substr(2);
    }
    char* stop = nullptr;
    errno = 0;
    if (base != 10 || t.find_first_of(".eE") == std::string::npos) {
      const long long v = std::strtoll(t.c_str(), &stop, base);
      if (*stop != '\0' || errno != 0) bad("not an integer");
      return static_cast<int64_t>(v);
    }
    const double v = std::strtod(t.c_str(), &stop);
    if (*stop != '\0') bad("not a number");
    return v;
  }
  Value::Storage string() {
    const char quote = s_[i_++];
    std::string out;
    while (i_ < s_.size() && s_[i_] != quote) {
      char c = s_[i_++];
      if (c != '\\' || quote == '\'') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      c = s_[i_++];
      switch (c) {
        case 'b': out += '\b'; break;
        case 't': out += '\t'; break;
        case 'n': out += '\n'; break;
        case 'f': out += '\f'; break;
        case 'r': out += '\r'; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case 'u':
        case 'U': utf8(c == 'u' ? 4 : 8, out); break;
        default: bad(std::string("unknown escape \\") + c);
      }
    }
    if (i_ >= s_.size()) bad("unterminated string");
    ++i_;
    return out;
  }
  void utf8(size_t digits, std::string& out) {
    if (i_ + digits > s_.size()) bad("short \\u escape");
    const unsigned long cp = std::strtoul(s_.substr(i_, digits).c_str(), nullptr, 16);
    i_ += digits;
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool rest(const char* word) const { return s_.compare(i_, std::strlen(word), word) == 0; }
  [[noreturn]] void bad(const std::string& what) const {
    fail("'" + s_ + "': " + what + " (at byte " + std::to_string(i_) + ")");
  }

  std::string s_;
  size_t i_ = 0;
};

// ---- options: the given ones checked against the schema, defaults for the rest --------------
inline const char* type_name(keel_option_type t) {
  switch (t) {
    case KEEL_OPT_BOOL: return "bool";
    case KEEL_OPT_INT: return "integer";
    case KEEL_OPT_FLOAT: return "float";
    case KEEL_OPT_STRING: return "string";
    case KEEL_OPT_INT_LIST: return "list of integers";
    case KEEL_OPT_FLOAT_LIST: return "list of floats";
    case KEEL_OPT_PATH: return "path";
  }
  return "?";
}

// `v` as option `o` holds it; throws naming the option on a type, bound or choice mismatch.
inline Value::Storage convert(const keel_option_desc& o, const Value::Storage& v) {
  const std::string key = o.key;
  auto check = [&](double x) {
    if (o.type == KEEL_OPT_FLOAT || o.type == KEEL_OPT_FLOAT_LIST)
      if (!std::isfinite(x)) fail("option '" + key + "' must be finite, got " + number(x));
    if (o.min <= o.max && (x < o.min || x > o.max))
      fail("option '" + key + "' must be in [" + number(o.min) + ", " + number(o.max) +
           "], got " + number(x));
  };
  switch (o.type) {
    case KEEL_OPT_BOOL:
      if (std::holds_alternative<bool>(v)) return v;
      break;
    case KEEL_OPT_INT:
      if (const auto* i = std::get_if<int64_t>(&v)) {
        check(double(*i));
        return v;
      }
      break;
    case KEEL_OPT_FLOAT:
      if (const auto* i = std::get_if<int64_t>(&v)) {
        check(double(*i));
        return double(*i);
      }
      if (const auto* d = std::get_if<double>(&v)) {
        check(*d);
        return v;
      }
      break;
    case KEEL_OPT_STRING:
      if (const auto* s = std::get_if<std::string>(&v)) {
        if (o.choices == nullptr) return v;
        const std::string choices = std::string("|") + o.choices + "|";
        if (choices.find("|" + *s + "|") != std::string::npos) return v;
        fail("option '" + key + "' must be one of " + o.choices + ", got \"" + *s + "\"");
      }
      break;
    case KEEL_OPT_PATH:
      if (const auto* s = std::get_if<std::string>(&v)) {
        if (s->empty()) return v;
        return std::filesystem::absolute(*s).lexically_normal().string();
      }
      break;
    case KEEL_OPT_INT_LIST:
      if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
        for (int64_t x : *l) check(double(x));
        return v;
      }
      break;
    case KEEL_OPT_FLOAT_LIST:
      if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
        std::vector<double> out(l->begin(), l->end());
        for (double x : out) check(x);
        return out;
      }
      if (const auto* l = std::get_if<std::vector<double>>(&v)) {
        for (double x : *l) check(x);
        return v;
      }
      break;
  }
  fail("option '" + key + "' is a " + type_name(o.type) + ", given another type");
}

inline std::vector<const keel_option_desc*> schema(const keel_component_desc& c) {
  std::vector<const keel_option_desc*> out;
  const char* p = reinterpret_cast<const char*>(c.options);
  for (uint32_t i = 0; i < c.option_count; ++i)
    out.push_back(reinterpret_cast<const keel_option_desc*>(p + size_t(i) * c.option_size));
  return out;
}

inline OptionValues validate(const keel_component_desc& c, const Options& given) {
  const std::vector<const keel_option_desc*> opts = schema(c);
  std::string keys;
  for (const auto* o : opts) keys += (keys.empty() ? "" : ", ") + std::string(o->key);
  OptionValues out;
  for (const auto& [key, value] : given) {
    const keel_option_desc* o = nullptr;
    for (const auto* d : opts)
      if (key == d->key) o = d;
    if (o == nullptr)
      fail("unknown option '" + key + "' (the component has: " + (keys.empty() ? "none" : keys) +
           ")");
    if (out.values.count(key)) fail("option '" + key + "' given twice");
    out.values[key] = convert(*o, value.storage());
  }
  for (const auto* o : opts) {
    if (out.values.count(o->key)) continue;
    if (o->default_toml == nullptr)
      fail("option '" + std::string(o->key) + "' is required (it has no default): give it");
    try {
      out.values[o->key] = convert(*o, DefaultReader(o->default_toml).read());
    } catch (const std::exception& e) {
      fail("the schema default of option '" + std::string(o->key) + "' is invalid: " + e.what());
    }
  }
  return out;
}

// ---- the host -------------------------------------------------------------------------------
inline const at::TensorImpl* impl(const keel_tensor* t) {
  return reinterpret_cast<const at::TensorImpl*>(t);
}
inline keel_dtype tensor_dtype(const keel_tensor* t) {
  const at::ScalarType st = c10::typeMetaToScalarType(impl(t)->dtype());
  for (const auto& d : kDtypes)
    if (d.torch == st) return d.keel;
  return KEEL_DTYPE_UNKNOWN;
}
inline int32_t tensor_ndim(const keel_tensor* t) { return static_cast<int32_t>(impl(t)->dim()); }
inline int64_t tensor_size(const keel_tensor* t, int32_t dim) {
  return dim < 0 || dim >= impl(t)->dim() ? -1 : impl(t)->size(dim);
}
inline int64_t tensor_numel(const keel_tensor* t) { return impl(t)->numel(); }
inline void* tensor_cpu_data(const keel_tensor* t) {
  const at::Tensor x = borrow(t);
  return x.is_cpu() && x.is_contiguous() ? x.data_ptr() : nullptr;
}
inline keel_tensor* tensor_contiguous_cpu(const keel_tensor* t) {
  try {
    return give(borrow(t).to(at::kCPU).contiguous());
  } catch (...) {
    return nullptr;
  }
}
inline keel_tensor* tensor_from_buffer(keel_dtype dtype, const int64_t* shape, int32_t ndim,
                                       const void* data) {
  try {
    if (ndim < 0 || (ndim > 0 && shape == nullptr)) return nullptr;
    for (const auto& d : kDtypes)
      if (d.keel == dtype) {
        at::Tensor out = at::zeros(at::IntArrayRef(shape, static_cast<size_t>(ndim)), d.torch);
        if (data != nullptr) std::memcpy(out.data_ptr(), data, out.nbytes());
        return give(std::move(out));
      }
    return nullptr;
  } catch (...) {
    return nullptr;
  }
}
inline keel_tensor* tensor_retain(keel_tensor* t) {
  if (t != nullptr) c10::raw::intrusive_ptr::incref(reinterpret_cast<at::TensorImpl*>(t));
  return t;
}
inline void tensor_release(keel_tensor* t) { adopt(t); }

template <class T>
const T* option(const keel_options* o, const char* key) {
  if (o == nullptr || key == nullptr) return nullptr;
  const auto it = values(o)->values.find(key);
  return it == values(o)->values.end() ? nullptr : std::get_if<T>(&it->second);
}
inline int option_bool(const keel_options* o, const char* key, int* out) {
  const bool* v = option<bool>(o, key);
  if (v != nullptr) *out = *v ? 1 : 0;
  return v != nullptr;
}
inline int option_int(const keel_options* o, const char* key, int64_t* out) {
  const int64_t* v = option<int64_t>(o, key);
  if (v != nullptr) *out = *v;
  return v != nullptr;
}
inline int option_float(const keel_options* o, const char* key, double* out) {
  const double* v = option<double>(o, key);
  if (v != nullptr) *out = *v;
  return v != nullptr;
}
inline const char* option_string(const keel_options* o, const char* key) {
  const std::string* v = option<std::string>(o, key);
  return v != nullptr ? v->c_str() : nullptr;
}
inline int64_t option_list_size(const keel_options* o, const char* key) {
  if (const auto* v = option<std::vector<int64_t>>(o, key)) return static_cast<int64_t>(v->size());
  if (const auto* v = option<std::vector<double>>(o, key)) return static_cast<int64_t>(v->size());
  return -1;
}
inline int option_list_int(const keel_options* o, const char* key, int64_t i, int64_t* out) {
  const auto* v = option<std::vector<int64_t>>(o, key);
  if (v == nullptr || i < 0 || i >= static_cast<int64_t>(v->size())) return 0;
  *out = (*v)[static_cast<size_t>(i)];
  return 1;
}
inline int option_list_float(const keel_options* o, const char* key, int64_t i, double* out) {
  if (const auto* v = option<std::vector<double>>(o, key)) {
    if (i < 0 || i >= static_cast<int64_t>(v->size())) return 0;
    *out = (*v)[static_cast<size_t>(i)];
    return 1;
  }
  int64_t x = 0;
  if (!option_list_int(o, key, i, &x)) return 0;
  *out = static_cast<double>(x);
  return 1;
}

// A string a plugin handed over, read up to `capacity - 1` bytes (abi.h: strings are bounded).
inline std::string bounded(const char* s, size_t capacity) {
  return s == nullptr ? std::string() : std::string(s, strnlen(s, capacity - 1));
}

struct LogStore {
  std::mutex mutex;
  std::vector<std::string> lines;
};
inline LogStore& log_store() {
  static LogStore store;
  return store;
}
inline void log(keel_log_level level, const char* origin, const char* message) {
  static const char* const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  const char* name = level >= KEEL_LOG_DEBUG && level <= KEEL_LOG_ERROR ? names[level] : "?";
  const std::string line = std::string(name) + " [" +
                           (origin ? bounded(origin, KEEL_NAME_CAPACITY) : "plugin") + "] " +
                           bounded(message, KEEL_STRING_CAPACITY);
  std::lock_guard<std::mutex> lock(log_store().mutex);
  log_store().lines.push_back(line);
}

// keel_host.report_error: per thread, the first report since the last take counts.
inline thread_local std::string reported_error;
inline thread_local bool reported = false;
inline void report_error(const char* message) {
  if (reported) return;
  reported = true;
  reported_error = bounded(message, KEEL_ERROR_CAPACITY);
  if (reported_error.empty()) reported_error = "(no message)";
}
inline bool take_reported(std::string& message) {
  if (!reported) return false;
  reported = false;
  message = std::move(reported_error);
  return true;
}

inline const keel_host* host() {
  static const keel_host table = {
      sizeof(keel_host), KEEL_ABI_MAJOR,        KEEL_ABI_MINOR,     TORCH_VERSION,
      tensor_dtype,      tensor_ndim,           tensor_size,        tensor_numel,
      tensor_cpu_data,   tensor_contiguous_cpu, tensor_from_buffer, tensor_retain,
      tensor_release,    option_bool,           option_int,         option_float,
      option_string,     option_list_size,      option_list_int,    option_list_float,
      log,               report_error,
  };
  return &table;
}

// ---- instances ------------------------------------------------------------------------------
template <class Abi>
struct KindOf;
#define KEEL_TESTING_KIND(STRUCT, KIND) \
  template <>                          \
  struct KindOf<STRUCT> {              \
    static constexpr keel_kind value = KIND; \
  }
KEEL_TESTING_KIND(keel_model, KEEL_KIND_MODEL);
KEEL_TESTING_KIND(keel_dataset, KEEL_KIND_DATASET);
KEEL_TESTING_KIND(keel_optimizer, KEEL_KIND_OPTIMIZER);
KEEL_TESTING_KIND(keel_lr_scheduler, KEEL_KIND_LR_SCHEDULER);
KEEL_TESTING_KIND(keel_loss, KEEL_KIND_LOSS);
KEEL_TESTING_KIND(keel_grad_clipper, KEEL_KIND_GRAD_CLIPPER);
KEEL_TESTING_KIND(keel_mfu, KEEL_KIND_MFU);
KEEL_TESTING_KIND(keel_profiler, KEEL_KIND_PROFILER);
KEEL_TESTING_KIND(keel_checkpoint, KEEL_KIND_CHECKPOINT);
KEEL_TESTING_KIND(keel_hook, KEEL_KIND_HOOK);
#undef KEEL_TESTING_KIND

// What an instance's create context points to, kept for the instance's life.
struct Keep {
  OptionValues options;
  std::string section, run_dir;
  bool own_run_dir = false;
  NamedTensors params;
  std::vector<keel_tensor*> param_handles;
  std::vector<const char*> param_names;
  ~Keep() {
    std::error_code ec;
    if (own_run_dir) std::filesystem::remove_all(run_dir, ec);
  }
};

inline std::string temporary_directory() {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string pattern = (base / "keel-testing-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    fail("cannot create a temporary run directory under " + base.string() + ": " +
         std::strerror(errno));
  return pattern;
}

}  // namespace detail

inline std::vector<std::string> log_lines() {
  std::lock_guard<std::mutex> lock(detail::log_store().mutex);
  return detail::log_store().lines;
}
inline void clear_log_lines() {
  std::lock_guard<std::mutex> lock(detail::log_store().mutex);
  detail::log_store().lines.clear();
}

// One component instance (Abi: keel_loss, keel_hook, ...); destroyed with this object.
template <class Abi>
class Instance {
 public:
  Instance(Abi* vt, std::shared_ptr<detail::Keep> keep, std::string where)
      : vt_(vt), keep_(std::move(keep)), where_(std::move(where)) {}
  Instance(Instance&& other) noexcept
      : vt_(std::exchange(other.vt_, nullptr)),
        keep_(std::move(other.keep_)),
        where_(std::move(other.where_)) {}
  Instance& operator=(Instance&&) = delete;
  Instance(const Instance&) = delete;
  ~Instance() {
    if (vt_ != nullptr) vt_->destroy(vt_->self);
  }

  // The C struct: its slots, e.g. `loss->compute`.
  Abi* operator->() const { return vt_; }
  Abi& operator*() const { return *vt_; }
  // The run directory the component was created with.
  const std::string& run_dir() const { return keep_->run_dir; }
  // "loss 'my_loss' (plugin my-losses)", as error messages name the component.
  const std::string& name() const { return where_; }

  // Calls a slot that reports failure through keel_error (pass every argument but `self` and
  // the keel_error): throws std::runtime_error with the component's message on KEEL_ERR.
  template <class... P, class... A>
  void call(keel_status (*slot)(void*, P...), A&&... args) const {
    static_assert(sizeof...(A) + 1 == sizeof...(P), "pass every argument but self and err");
    if (slot == nullptr) detail::fail(where_ + ": this optional slot is not provided (NULL)");
    keel_error err;
    err.message[0] = '\0';
    if (slot(vt_->self, std::forward<A>(args)..., &err) != KEEL_OK) {
      err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
      detail::fail(where_ + ": " + (err.message[0] ? err.message : "failed without a message"));
    }
  }
  // Calls any other slot (pass every argument but `self`) and returns its result; throws when
  // the slot reported an error through keel_host.report_error.
  template <class R, class... P, class... A>
  R call(R (*slot)(void*, P...), A&&... args) const {
    if (slot == nullptr) detail::fail(where_ + ": this optional slot is not provided (NULL)");
    std::string message;
    detail::take_reported(message);  // drop a report left over from elsewhere
    if constexpr (std::is_void_v<R>) {
      slot(vt_->self, std::forward<A>(args)...);
      if (detail::take_reported(message)) detail::fail(where_ + ": " + message);
    } else {
      R result = slot(vt_->self, std::forward<A>(args)...);
      if (detail::take_reported(message)) detail::fail(where_ + ": " + message);
      return result;
    }
  }

 private:
  Abi* vt_;
  std::shared_ptr<detail::Keep> keep_;
  std::string where_;
};

// keel_named_tensor entries borrowing `tensors` (which must outlive this object), for the
// checkpoint and state_load slots.
class NamedHandles {
 public:
  explicit NamedHandles(const NamedTensors& tensors) {
    for (const auto& [name, tensor] : tensors) entries_.push_back({name.c_str(), peek(tensor)});
  }
  const keel_named_tensor* data() const { return entries_.data(); }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<keel_named_tensor> entries_;
};

// Calls a component's state_save slot (models, datasets, optimizers; abi.h "Component state
// for exact resume") and returns copies of the entries it put, as a checkpoint holds them.
template <class Abi>
NamedTensors save_state(const Instance<Abi>& c) {
  NamedTensors out;
  keel_state_writer writer{};
  writer.struct_size = sizeof writer;
  writer.host_data = &out;
  writer.put = [](keel_state_writer* w, const char* name, keel_tensor* t) -> int {
    auto* entries = static_cast<NamedTensors*>(w->host_data);
    if (name == nullptr || *name == '\0' || t == nullptr) return 0;
    for (const auto& e : *entries)
      if (e.first == name) return 0;
    entries->emplace_back(name, borrow(t).detach().to(at::kCPU).clone());
    return 1;
  };
  c.call(c->state_save, &writer);
  return out;
}

// Calls a component's state_load slot with `state` (as save_state returned it).
template <class Abi>
void load_state(const Instance<Abi>& c, const NamedTensors& state) {
  const NamedHandles handles(state);
  c.call(c->state_load, handles.data(), handles.size());
}

// A plugin, from its descriptor (the value of its keel_plugin_entry()).
class Plugin {
 public:
  explicit Plugin(const keel_plugin_descriptor* descriptor) : d_(descriptor) {
    if (d_ == nullptr) detail::fail("keel_plugin_entry() returned NULL");
    if (d_->abi_major != KEEL_ABI_MAJOR || d_->abi_minor > KEEL_ABI_MINOR)
      detail::fail("the plugin declares ABI " + std::to_string(d_->abi_major) + "." +
                   std::to_string(d_->abi_minor) + ", this SDK speaks " +
                   std::to_string(KEEL_ABI_MAJOR) + "." + std::to_string(KEEL_ABI_MINOR));
    if (d_->components == nullptr || d_->component_size < sizeof(keel_component_desc))
      detail::fail("the plugin's descriptor has no components array of keel_component_desc");
  }
  const keel_plugin_descriptor& descriptor() const { return *d_; }

  // The component of `kind` named `name`; throws naming the plugin's components otherwise.
  const keel_component_desc& component(keel_kind kind, const std::string& name) const {
    std::string all;
    const char* p = reinterpret_cast<const char*>(d_->components);
    for (uint32_t i = 0; i < d_->component_count; ++i) {
      const auto& c =
          *reinterpret_cast<const keel_component_desc*>(p + size_t(i) * d_->component_size);
      if (c.kind == kind && c.name != nullptr && name == c.name) return c;
      all += (all.empty() ? "" : ", ") + std::string(detail::kind_name(c.kind)) + " " +
             (c.name ? c.name : "?");
    }
    detail::fail(std::string("plugin ") + d_->name + " has no " + detail::kind_name(kind) +
                 " named '" + name + "' (it has: " + (all.empty() ? "none" : all) + ")");
  }

  // Creates the component of Abi's kind named `name` with `options` (the others take their
  // schema defaults) and the context fields of `setup`.
  template <class Abi>
  Instance<Abi> create(const std::string& name, const Options& options = {},
                       const Setup& setup = {}) const {
    const keel_kind kind = detail::KindOf<Abi>::value;
    const keel_component_desc& c = component(kind, name);
    const std::string where = std::string(detail::kind_name(kind)) + " '" + name + "' (plugin " +
                              d_->name + ")";
    auto keep = std::make_shared<detail::Keep>();
    try {
      keep->options = detail::validate(c, options);
    } catch (const std::exception& e) {
      detail::fail(where + ": " + e.what());
    }
    keep->section = setup.section;
    keep->run_dir = setup.run_dir;
    if (keep->run_dir.empty()) {
      keep->run_dir = detail::temporary_directory();
      keep->own_run_dir = true;
    }
    keep->params = setup.params;
    for (const auto& [pname, tensor] : keep->params) {
      keep->param_handles.push_back(peek(tensor));
      keep->param_names.push_back(pname.c_str());
    }

    keel_create_context ctx{};
    ctx.struct_size = sizeof ctx;
    ctx.host = detail::host();
    ctx.options = reinterpret_cast<const keel_options*>(&keep->options);
    ctx.section = keep->section.c_str();
    ctx.seed = setup.seed;
    ctx.rank = setup.rank;
    ctx.world_size = setup.world_size;
    ctx.run_dir = keep->run_dir.c_str();
    ctx.params = keep->param_handles.data();
    ctx.param_names = keep->param_names.data();
    ctx.param_count = keep->param_handles.size();
    ctx.total_steps = setup.total_steps;
    ctx.resume_step = setup.resume_step;

    at::manual_seed(setup.seed);
    keel_error err;
    err.message[0] = '\0';
    void* out = nullptr;
    if (c.create(&ctx, &out, &err) != KEEL_OK) {
      err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
      detail::fail(where + ": " + (err.message[0] ? err.message : "failed without a message"));
    }
    auto* vt = static_cast<Abi*>(out);
    if (vt == nullptr) detail::fail(where + ": the factory returned KEEL_OK and no instance");
    if (vt->struct_size < sizeof(Abi) || vt->destroy == nullptr)
      detail::fail(where + ": the instance's struct_size is " + std::to_string(vt->struct_size) +
                   ", smaller than this SDK's struct (" + std::to_string(sizeof(Abi)) +
                   "), or it has no destroy slot");
    return Instance<Abi>(vt, std::move(keep), where);
  }

 private:
  const keel_plugin_descriptor* d_;
};

}  // namespace keel::testing
