#include "checkpoint/meta.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <toml++/toml.h>

#include "config/split_name.hpp"
#include "error.hpp"
#include "text/text.hpp"

namespace keel {
namespace {

using text::located;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw Error(text::one_line(where + ": invalid checkpoint metadata: " + what));
}

// A TOML basic string ("..." with escapes).
std::string quoted(const std::string& s) {
  std::ostringstream out;
  out << toml::toml_formatter{toml::value<std::string>(s), toml::format_flags::none};
  return out.str();
}

// A TOML float that reads back to the same double.
std::string real(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// Reads one table against the keys it must hold (in `keys`, for messages), nothing else.
class Reader {
 public:
  Reader(const toml::table& t, const std::string& path, std::string table,
         const std::vector<std::string>& keys)
      : t_(t), path_(path), table_(std::move(table)), keys_(text::join(keys)) {
    for (const auto& [k, v] : t) {
      bool known = false;
      for (const std::string& key : keys) known = known || k.str() == key;
      if (!known)
        fail(located(path, k.source()), "unknown key " + quoted(std::string(k.str())) + in() +
                                       " (expected " + keys_ + ")");
    }
  }
  bool has(const char* key) const { return t_.get(key) != nullptr; }
  const toml::node& node(const char* key) const {
    const toml::node* n = t_.get(key);
    if (n == nullptr)
      fail(located(path_, t_.source()), std::string("no '") + key + "'" + in() + " (expected " + keys_ + ")");
    return *n;
  }
  int64_t integer(const char* key, int64_t min = 0) const {
    const toml::node& n = node(key);
    const auto* i = n.as_integer();
    if (i == nullptr || i->get() < min)
      fail(located(path_, n.source()),
           fmt::format("'{}'{} must be an integer >= {}", key, in(), min));
    return i->get();
  }
  double real(const char* key) const {
    const toml::node& n = node(key);
    if (const auto* f = n.as_floating_point()) return f->get();
    fail(located(path_, n.source()), std::string("'") + key + "'" + in() + " must be a float");
  }
  std::string string(const char* key) const {
    const toml::node& n = node(key);
    const auto* s = n.as_string();
    if (s == nullptr) fail(located(path_, n.source()), std::string("'") + key + "'" + in() + " must be a string");
    return s->get();
  }
  const toml::array& array(const char* key) const {
    const toml::node& n = node(key);
    const auto* a = n.as_array();
    if (a == nullptr) fail(located(path_, n.source()), std::string("'") + key + "'" + in() + " must be a list");
    return *a;
  }
  std::vector<std::string> strings(const char* key) const {
    std::vector<std::string> out;
    for (const toml::node& o : array(key)) {
      const auto* s = o.as_string();
      if (s == nullptr) fail(located(path_, o.source()), std::string("'") + key + "'" + in() + " must be a list of strings");
      out.push_back(s->get());
    }
    return out;
  }
  const toml::table& table(const char* key) const {
    const toml::node& n = node(key);
    const auto* t = n.as_table();
    if (t == nullptr) fail(located(path_, n.source()), std::string("'") + key + "'" + in() + " must be a table");
    return *t;
  }
  const std::string& path() const { return path_; }

 private:
  std::string in() const { return table_.empty() ? "" : " in [" + table_ + "]"; }
  const toml::table& t_;
  const std::string& path_;
  std::string table_, keys_;
};

MetricList metrics(const Reader& parent, const char* split) {
  const Reader r(parent.table(split), parent.path(), std::string("metrics.") + split,
                 {"keys", "values"});
  const std::vector<std::string> keys = r.strings("keys");
  const toml::array& values = r.array("values");
  if (values.size() != keys.size())
    fail(located(r.path(), values.source()),
         fmt::format("[metrics.{}] has {} keys but {} values", split, keys.size(), values.size()));
  MetricList out;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto* f = values[i].as_floating_point();
    if (f == nullptr) fail(located(r.path(), values[i].source()), "metric values must be floats");
    out.emplace_back(keys[i], f->get());
  }
  return out;
}

std::string write_metrics(const char* split, const MetricList& m) {
  std::string keys, values;
  for (size_t i = 0; i < m.size(); ++i) {
    keys += (i ? ", " : "") + quoted(m[i].first);
    values += (i ? ", " : "") + real(m[i].second);
  }
  return "\n[metrics." + std::string(split) + "]\nkeys = [" + keys + "]\nvalues = [" + values +
         "]\n";
}

bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Named values in order, the names equal and the values the same: a record (MetricList), or
// the evaluation sets' records by split.
template <class Value>
bool same(const std::vector<std::pair<std::string, Value>>& a,
          const std::vector<std::pair<std::string, Value>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !same(a[i].second, b[i].second)) return false;
  return true;
}

}  // namespace

bool operator==(const CheckpointMeta& a, const CheckpointMeta& b) {
  return a.run_id == b.run_id && a.step == b.step && a.epoch == b.epoch &&
         a.epoch_batches == b.epoch_batches && a.epoch_samples == b.epoch_samples &&
         a.global_batch == b.global_batch && a.samples == b.samples && a.tokens == b.tokens &&
         a.skipped_steps == b.skipped_steps && a.last_eval_step == b.last_eval_step &&
         a.world_size == b.world_size &&
         a.objects == b.objects && a.keel_version == b.keel_version &&
         a.manifest_hash == b.manifest_hash && same(a.loss_scale, b.loss_scale) &&
         a.loss_scale_clean_steps == b.loss_scale_clean_steps &&
         same(a.window.loss, b.window.loss) && same(a.window.grad_norm, b.window.grad_norm) &&
         a.window.steps == b.window.steps && a.window.norms == b.window.norms &&
         a.window.samples == b.window.samples && a.window.tokens == b.window.tokens &&
         a.plugins == b.plugins && same(a.train_metrics, b.train_metrics) &&
         same(a.eval_metrics, b.eval_metrics);
}

CheckpointMeta read_checkpoint_meta(std::string_view text, const std::string& path) {
  toml::table t;
  try {
    t = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    fail(located(path, e.source()), "not valid TOML: " + std::string(e.description()));
  }
  const Reader r(t, path, "",
                 {"run_id", "step", "epoch", "epoch_batches", "epoch_samples", "global_batch",
                  "samples", "tokens",
                  "skipped_steps", "last_eval_step", "world_size", "objects", "keel_version",
                  "manifest_hash",
                  "loss_scale", "loss_scale_clean_steps", "window", "plugins", "metrics"});
  CheckpointMeta m;
  m.run_id = r.string("run_id");
  m.step = r.integer("step");
  m.epoch = r.integer("epoch");
  m.epoch_batches = r.integer("epoch_batches");
  // Checkpoints written before the global sample cursor have neither: 0, unknown.
  m.epoch_samples = r.has("epoch_samples") ? r.integer("epoch_samples") : 0;
  m.global_batch = r.has("global_batch") ? r.integer("global_batch") : 0;
  m.samples = r.integer("samples");
  m.tokens = r.integer("tokens");
  m.skipped_steps = r.integer("skipped_steps");
  m.last_eval_step = r.integer("last_eval_step", -1);
  // Checkpoints written before data parallelism have no world_size: one process saved them.
  m.world_size = r.has("world_size") ? r.integer("world_size", 1) : 1;
  m.objects = r.strings("objects");
  m.keel_version = r.string("keel_version");
  m.manifest_hash = r.string("manifest_hash");
  m.loss_scale = r.real("loss_scale");
  m.loss_scale_clean_steps = r.integer("loss_scale_clean_steps");
  const Reader w(r.table("window"), path, "window",
                 {"loss", "grad_norm", "steps", "norms", "samples", "tokens"});
  m.window.loss = w.real("loss");
  m.window.grad_norm = w.real("grad_norm");
  m.window.steps = w.integer("steps");
  m.window.norms = w.integer("norms");
  m.window.samples = w.integer("samples");
  m.window.tokens = w.integer("tokens");
  for (const auto& [name, version] : r.table("plugins")) {
    const auto* v = version.as_string();
    if (v == nullptr) fail(located(path, version.source()), "[plugins] values must be version strings");
    m.plugins.emplace_back(std::string(name.str()), v->get());
  }
  // [metrics.train], then one table per evaluation set (older keel wrote [metrics.test] always,
  // empty when the run had not evaluated: read as no record).
  const toml::table& mt = r.table("metrics");
  std::vector<std::string> splits = {"train"};
  for (const auto& [name, record] : mt) {
    if (name.str() == "train") continue;
    if (!valid_split_name(std::string(name.str())))
      fail(located(path, name.source()),
           "[metrics." + text::printable(std::string(name.str())) + "]: not an evaluation set's "
           "name (" + std::string(kSplitNameRule) + ")");
    splits.emplace_back(name.str());
  }
  const Reader mr(mt, path, "metrics", splits);
  m.train_metrics = metrics(mr, "train");
  std::vector<std::pair<int64_t, std::pair<std::string, MetricList>>> by_line;  // written order
  for (size_t i = 1; i < splits.size(); ++i) {
    MetricList record = metrics(mr, splits[i].c_str());
    if (record.empty()) continue;
    by_line.push_back({mt.get(splits[i])->source().begin.line, {splits[i], std::move(record)}});
  }
  std::stable_sort(by_line.begin(), by_line.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [line, record] : by_line) m.eval_metrics.push_back(std::move(record));
  return m;
}

std::string write_checkpoint_meta(const CheckpointMeta& m) {
  std::string out = "run_id = " + quoted(m.run_id) + "\nstep = " + std::to_string(m.step) +
                    "\nepoch = " + std::to_string(m.epoch) +
                    "\nepoch_batches = " + std::to_string(m.epoch_batches) +
                    "\nepoch_samples = " + std::to_string(m.epoch_samples) +
                    "\nglobal_batch = " + std::to_string(m.global_batch) +
                    "\nsamples = " + std::to_string(m.samples) +
                    "\ntokens = " + std::to_string(m.tokens) +
                    "\nskipped_steps = " + std::to_string(m.skipped_steps) +
                    "\nlast_eval_step = " + std::to_string(m.last_eval_step) +
                    "\nworld_size = " + std::to_string(m.world_size) + "\nobjects = [";
  for (size_t i = 0; i < m.objects.size(); ++i) out += (i ? ", " : "") + quoted(m.objects[i]);
  out += "]\nkeel_version = " + quoted(m.keel_version) +
         "\nmanifest_hash = " + quoted(m.manifest_hash) + "\nloss_scale = " + real(m.loss_scale) +
         "\nloss_scale_clean_steps = " + std::to_string(m.loss_scale_clean_steps) +
         "\n\n[window]\nloss = " + real(m.window.loss) +
         "\ngrad_norm = " + real(m.window.grad_norm) +
         "\nsteps = " + std::to_string(m.window.steps) +
         "\nnorms = " + std::to_string(m.window.norms) +
         "\nsamples = " + std::to_string(m.window.samples) +
         "\ntokens = " + std::to_string(m.window.tokens) + "\n\n[plugins]\n";
  for (const auto& [name, version] : m.plugins) out += quoted(name) + " = " + quoted(version) + "\n";
  out += write_metrics("train", m.train_metrics);
  for (const auto& [split, record] : m.eval_metrics) out += write_metrics(split.c_str(), record);
  return out;
}

}  // namespace keel
