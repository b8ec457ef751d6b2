#include "run/tables.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "bounded.hpp"
#include "error.hpp"
#include "host.hpp"
#include "keel/tensor.hpp"
#include "run/checkpointing.hpp"
#include "run/parameters.hpp"
#include "run/plugin_state.hpp"
#include "run/run.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

constexpr const char* kTablesObject = "tables";
constexpr const char* kStateObject = "sparse_optimizer";

std::string table_label(const SparseTables& sparse, const keel_sparse_table* t) {
  return sparse.owner + ": table '" + t->name + "'";
}

// (1.11) Whether `touched` hands the table's rows as tensors (a table of 1.10 never does), and
// where the table says its rows live.
bool rows_as_tensors(const keel_sparse_table* t) {
  return KEEL_HAS_FIELD(t, keel_sparse_table, rows_as_tensors) && t->rows_as_tensors != 0;
}
std::string rows_device(const keel_sparse_table* t) {
  return KEEL_HAS_FIELD(t, keel_sparse_table, device) && t->device
             ? bounded(t->device, KEEL_NAME_CAPACITY)
             : std::string("cpu");
}

// Calls a slot of table `t` that reports errors; throws keel::Error naming the model and table.
template <class... Slot, class... Args>
void call_table(const SparseTables& sparse, const keel_sparse_table* t, const char* what,
                keel_status (*slot)(void*, Slot...), Args&&... args) {
  keel_error err;
  err.message[0] = '\0';
  const keel_status st = slot(t->self, std::forward<Args>(args)..., &err);
  err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
  const std::string reported = take_reported_error();
  if (st == KEEL_OK && reported.empty()) return;
  const std::string why = err.message[0] ? err.message
                          : !reported.empty()
                              ? reported
                              : "no message (the table returned KEEL_ERR and left keel_error "
                                "empty)";
  throw Error(table_label(sparse, t) + ": " + what + " failed: " + why);
}

bool valid_table_name(const char* name) {
  if (!name || !terminated_within(name, KEEL_NAME_CAPACITY) || !*name) return false;
  for (const char* p = name; *p; ++p)
    if (!std::isalnum(static_cast<unsigned char>(*p)) && !std::strchr("_.-", *p)) return false;
  return true;
}

// Table `i` of the model, checked: a full struct with every slot, a valid unique name, dim >= 1.
const keel_sparse_table* checked_table(const Run& run, size_t i, std::set<std::string>& names) {
  const Instance<keel_model>& model = run.components.model;
  const keel_sparse_table* t = model.get("table", model->table, i);
  const std::string which = "table(" + std::to_string(i) + ")";
  if (!t) throw model.error(which + " returned NULL; a model offers table_count tables");
  if (t->struct_size < sizeof(keel_sparse_table))
    throw model.error(fmt::format("{}: keel_sparse_table is {} bytes, ABI 1.9 needs {}; hint: "
                                  "rebuild the plugin against this SDK", which, t->struct_size,
                                  sizeof(keel_sparse_table)));
  if (!valid_table_name(t->name))
    throw model.error(fmt::format("{}: name \"{}\" is not 1 to {} letters, digits, '_', '.' or "
                                  "'-'", which, bounded(t->name ? t->name : "", 40),
                                  KEEL_NAME_CAPACITY - 1));
  if (!names.insert(t->name).second)
    throw model.error(which + ": two tables are named '" + std::string(t->name) +
                      "'; every table needs its own name (checkpoints store it under it)");
  if (t->dim < 1)
    throw model.error(fmt::format("{} '{}': dim is {}; a row holds dim >= 1 floats", which,
                                  t->name, t->dim));
  if (!t->reserve_slots || !t->touched || !t->end_step || !t->stats || !t->save || !t->load)
    throw model.error(which + " '" + t->name + "': a slot is NULL; every slot of "
                      "keel_sparse_table is required");
  return t;
}

// The model's tables (none when it offers no table_count/table).
std::vector<const keel_sparse_table*> model_tables(const Run& run) {
  const Instance<keel_model>& model = run.components.model;
  const bool count = KEEL_HAS_SLOT(model, keel_model, table_count);
  if (count != KEEL_HAS_SLOT(model, keel_model, table))
    throw model.error(std::string("has ") + (count ? "table_count" : "table") + " without " +
                      (count ? "table" : "table_count") + " (ABI 1.9 tables: both or neither)");
  std::vector<const keel_sparse_table*> out;
  if (!count) return out;
  const size_t n = model.get("table_count", model->table_count);
  std::set<std::string> names;
  for (size_t i = 0; i < n; ++i) out.push_back(checked_table(run, i, names));
  return out;
}

std::string table_names(const std::vector<const keel_sparse_table*>& tables) {
  std::vector<std::string> names;
  for (const auto* t : tables) names.emplace_back(t->name);
  return text::join(names);
}

// The table an entry "<table>.<entry>" belongs to (the longest name that prefixes it), or null.
const keel_sparse_table* table_of(const SparseTables& s, const std::string& entry) {
  const keel_sparse_table* best = nullptr;
  for (const auto* t : s.tables) {
    const size_t n = std::strlen(t->name);
    if (entry.size() > n + 1 && entry.compare(0, n, t->name) == 0 && entry[n] == '.' &&
        (!best || n > std::strlen(best->name)))
      best = t;
  }
  return best;
}

// One saved part (object `stem`) given to every table: each its own entries, unprefixed.
void load_part(Run& run, const CommitRecord& rec, const std::string& dir, const std::string& stem) {
  TensorList part = allocate(rec, stem);
  if (part.empty()) return;
  run.components.store->load(dir, stem, part);
  const SparseTables& s = run.sparse;
  for (const auto& [name, t] : part)
    if (!table_of(s, name))
      throw Error(dir + ": object '" + stem + "' holds entry '" + name + "', which belongs to "
                  "no table of " + run.components.model.label() + " (tables: " +
                  table_names(s.tables) + "); hint: resume with the model options the "
                  "checkpoint was saved with");
  for (const auto* table : s.tables) {
    TensorList mine;
    for (const auto& [name, t] : part)
      if (table_of(s, name) == table) mine.emplace_back(name.substr(std::strlen(table->name) + 1), t);
    if (mine.empty()) continue;
    const std::vector<keel_named_tensor> named = as_named(mine);
    // The part named, so that a refusal ("id 3 is twice in the part's ids") says which file.
    const std::string what = "load of " + dir + "'s object '" + stem + "'";
    call_table(run.sparse, table, what.c_str(), table->load, named.data(), named.size());
  }
}

// The saved parts of the tables in `rec`, in rank order: "tables", "rank1.tables", ...
std::vector<std::string> saved_parts(const CommitRecord& rec) {
  std::vector<std::pair<long, std::string>> found;
  const std::string suffix = std::string(".") + kTablesObject;
  for (const auto& [stem, tensors] : rec.tensors) {
    if (stem == kTablesObject) found.emplace_back(0, stem);
    const bool ranked = stem.rfind("rank", 0) == 0 && stem.size() > 4 + suffix.size() &&
                        stem.compare(stem.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (!ranked) continue;
    const std::string digits = stem.substr(4, stem.size() - 4 - suffix.size());
    if (digits.find_first_not_of("0123456789") == std::string::npos)
      found.emplace_back(std::stol(digits), stem);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [r, stem] : found) out.push_back(std::move(stem));
  return out;
}

}  // namespace

void create_sparse_optimizer(Run& run) {
  const RunConfig& config = run.config;
  SparseTables& s = run.sparse;
  s.tables = model_tables(run);
  s.owner = run.components.model.label();
  if (s.any() && !config.sparse_optimizer)
    throw run.components.model.error(fmt::format(
        "has {} sparse embedding table(s) ({}), which only a [sparse_optimizer] trains, and the "
        "manifest has none; hint: add [sparse_optimizer] with type = \"adagrad\" (or \"adamw\")",
        s.tables.size(), table_names(s.tables)));
  if (!s.any() && config.sparse_optimizer)
    throw Error(config.manifest_path + ": [sparse_optimizer] is set, but " +
                run.components.model.label() + " has no sparse embedding tables for it to "
                "update; hint: remove [sparse_optimizer]");
  if (!s.any()) return;
  if (config.train.precision == Precision::kFp16)
    throw run.components.model.error(
        "has sparse embedding tables, whose gradients fp16 loss scaling would leave scaled; "
        "hint: use [train] precision = \"bf16\" or \"fp32\"");
  keel_create_context ctx = context(run, *config.sparse_optimizer);
  ctx.tables = s.tables.data();
  ctx.table_count = s.tables.size();
  Instance<keel_sparse_optimizer>& opt = run.components.sparse_optimizer;
  opt = create_instance<keel_sparse_optimizer>(*config.sparse_optimizer->component, ctx);
  // A sparse optimizer of 1.10 or older reads the rows through host pointers only.
  for (const keel_sparse_table* t : s.tables)
    if (rows_as_tensors(t) && opt.abi_minor() < 11)
      throw opt.error(fmt::format(
          "was built for plugin ABI 1.{}, whose sparse optimizers read a table's rows through "
          "host pointers, but {} hands its rows as tensors (it keeps them on {}); hint: rebuild "
          "the sparse optimizer against this keel's SDK (ABI 1.11: it takes "
          "keel_sparse_rows.row_values when rows_as_tensors is set), or have the model keep the "
          "table in host memory and hand host pointers",
          opt.abi_minor(), table_label(run.sparse, t), rows_device(t)));
  s.base_lr = opt.get("get_lr", opt->get_lr);
  if (!std::isfinite(s.base_lr) || s.base_lr < 0)
    throw opt.error("get_lr returned " + text::number(s.base_lr) +
                    "; a learning rate is finite and >= 0");
  // The names in full in run.log; on the console the first two and the last (26 for dlrm),
  // and where the first table keeps its rows (as tensors: on its device).
  const std::string names = table_names(s.tables);
  const size_t n = s.tables.size();
  const keel_sparse_table* first = s.tables[0];
  const std::string where = rows_as_tensors(first) ? "rows as tensors on " + rows_device(first)
                                                   : std::string("rows in host memory");
  if (n <= 3) {
    spdlog::info("{} updates {} sparse table(s): {} ({})", opt.label(), n, names, where);
  } else {
    spdlog::info("{} updates {} sparse tables: {}, {}, ..., {} ({})", opt.label(), n,
                 s.tables[0]->name, s.tables[1]->name, s.tables[n - 1]->name, where);
    spdlog::debug("{} updates {} sparse tables: {}", opt.label(), n, names);
  }
}

double sparse_grad_squares(const SparseTables& sparse) {
  double sum = 0;
  for (const keel_sparse_table* t : sparse.tables) {
    keel_sparse_rows rows{};
    rows.struct_size = sizeof(rows);
    call_table(sparse, t, "touched", t->touched, &rows);
    if (rows.count == 0) continue;
    if (rows_as_tensors(t)) {  // (1.11) one reduction on the rows' device
      if (!rows.row_grads)
        throw Error(fmt::format("{}: touched returned {} rows without gradients (row_grads is "
                                "NULL)", table_label(sparse, t), rows.count));
      sum += borrow(rows.row_grads).to(at::kDouble).square().sum().item<double>();
      continue;
    }
    if (!rows.grads)
      throw Error(fmt::format("{}: touched returned {} rows without gradients (grads is NULL)",
                              table_label(sparse, t), rows.count));
    const int64_t dim = t->dim;
    for (size_t i = 0; i < rows.count; ++i) {
      const float* g = rows.grads[i];
      double row = 0;
      for (int64_t d = 0; d < dim; ++d) row += static_cast<double>(g[d]) * g[d];
      sum += row;
    }
  }
  return sum;
}

void sparse_update(const Instance<keel_sparse_optimizer>& optimizer) {
  if (optimizer) optimizer.call("step", optimizer->step);
}

void end_sparse_step(const SparseTables& sparse, int64_t step) {
  for (const keel_sparse_table* t : sparse.tables)
    call_table(sparse, t, "end_step", t->end_step, step);
}

void set_sparse_lr(const Instance<keel_sparse_optimizer>& optimizer, const SparseTables& sparse,
                   double factor) {
  if (optimizer) optimizer.run("set_lr", optimizer->set_lr, sparse.base_lr * factor);
}

void add_table_metrics(const SparseTables& sparse, ProcessGroup* group,
                       std::vector<keel_metric>& record) {
  if (!sparse.any()) return;
  std::vector<double> v(4, 0.0);
  for (const keel_sparse_table* t : sparse.tables) {
    keel_table_stats st{};
    st.struct_size = sizeof(st);
    t->stats(t->self, &st);
    const std::string reported = take_reported_error();
    if (!reported.empty()) throw Error(table_label(sparse, t) + ": stats failed: " + reported);
    v[0] += static_cast<double>(st.rows);
    v[1] += static_cast<double>(st.admitted);
    v[2] += static_cast<double>(st.evicted);
    v[3] += static_cast<double>(st.pending);
  }
  if (group) v = group->sum(v, "summing the tables' counters");
  record.push_back({"table_rows", v[0]});
  record.push_back({"admitted", v[1]});
  record.push_back({"evicted", v[2]});
  record.push_back({"table_pending", v[3]});
  record.push_back({"sparse_grad_norm", sparse.grad_norm});
}

void add_tables(const Run& run, Snapshot& snap) {
  if (!run.sparse.any()) return;
  TensorList out;
  for (const keel_sparse_table* t : run.sparse.tables) {
    StateWriter w;
    try {
      call_table(run.sparse, t, "save", t->save, &w.abi);
    } catch (const Error&) {
      if (w.refusal.empty()) throw;
      throw Error(table_label(run.sparse, t) + ": save failed: " + w.refusal);
    }
    if (!w.refusal.empty()) throw Error(table_label(run.sparse, t) + ": save: " + w.refusal);
    for (auto& [name, tensor] : w.entries) {
      std::string full = std::string(t->name) + "." + name;
      if (full.size() >= KEEL_NAME_CAPACITY)
        throw Error(fmt::format("{}: save: entry '{}' under the table's name is longer than {} "
                                "bytes", table_label(run.sparse, t), name,
                                KEEL_NAME_CAPACITY - 1));
      out.emplace_back(std::move(full), tensor);
    }
  }
  snap.objects.emplace_back(rank_object(run, kTablesObject), std::move(out));
  const Instance<keel_sparse_optimizer>& opt = run.components.sparse_optimizer;
  if (run.ranks.rank == 0 && KEEL_HAS_SLOT(opt, keel_sparse_optimizer, state_save))
    snap.objects.emplace_back(kStateObject, save_state(opt));
}

void load_tables(Run& run, const CommitRecord& rec, const std::string& dir) {
  if (!run.sparse.any()) return;
  const int64_t saved_by = run.resume.meta.world_size;
  if (rec.tensors.find(kTablesObject) == rec.tensors.end())
    throw Error(dir + ": the checkpoint holds no sparse tables (no object '" +
                std::string(kTablesObject) + "'), and " + run.components.model.label() +
                " has " + table_names(run.sparse.tables) + "; hint: resume from a checkpoint "
                "saved by a run of this model");
  if (saved_by == run.ranks.world) {
    load_part(run, rec, dir, rank_object(run, kTablesObject));
  } else {
    if (run.ranks.rank == 0)
      spdlog::info("--resume: {} was saved by {} rank(s): every rank reads every rank's table "
                   "rows and keeps the ones it owns", dir, saved_by);
    for (const std::string& part : saved_parts(rec)) load_part(run, rec, dir, part);
  }
  const Instance<keel_sparse_optimizer>& opt = run.components.sparse_optimizer;
  const bool stored = rec.tensors.count(kStateObject) > 0;
  if (!KEEL_HAS_SLOT(opt, keel_sparse_optimizer, state_load)) {
    if (stored)
      spdlog::warn("{} holds state of {}, which has no state_load slot now: not loaded", dir,
                   opt.label());
    return;  // its per-row state is in the tables' slots, loaded above
  }
  TensorList state = allocate(rec, kStateObject);
  if (stored) run.components.store->load(dir, kStateObject, state);
  const std::vector<keel_named_tensor> named = as_named(state);
  opt.call("state_load", opt->state_load, named.data(), named.size());
}

void load_init_tables(Run& run, const CommitRecord* rec, const std::string& dir) {
  if (!run.sparse.any()) return;
  const std::vector<std::string> parts = rec ? saved_parts(*rec) : std::vector<std::string>();
  if (parts.empty()) {
    spdlog::warn("checkpoint.init_from: {} holds no sparse tables{}: the tables of {} start "
                 "empty", dir, rec ? "" : " keel can find (no commit record)",
                 run.components.model.label());
    return;
  }
  for (const std::string& part : parts) load_part(run, *rec, dir, part);
  spdlog::info("init_from {}: loaded the sparse tables' rows (with their optimizer slots) from "
               "{} part(s)", dir, parts.size());
}

}  // namespace keel
