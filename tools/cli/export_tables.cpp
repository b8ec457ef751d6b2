#include "cli/export_tables.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sort.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/store.hpp"
#include "error.hpp"
#include "keel/tensor.hpp"
#include "text/text.hpp"

namespace keel::cli {
namespace {

// "tables" (rank 0) or "rank<r>.tables".
bool is_tables_object(const std::string& object) {
  if (object == "tables") return true;
  const std::string prefix = "rank", suffix = ".tables";
  if (object.size() <= prefix.size() + suffix.size() || object.rfind(prefix, 0) != 0 ||
      object.compare(object.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  const std::string r =
      object.substr(prefix.size(), object.size() - prefix.size() - suffix.size());
  return r.find_first_not_of("0123456789") == std::string::npos;
}

// `name` = "<table>.<entry>" with entry "ids" or "values": the table and the entry, else false.
bool split_entry(const std::string& name, std::string& table, std::string& entry) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0) return false;
  entry = name.substr(dot + 1);
  table = name.substr(0, dot);
  return entry == "ids" || entry == "values";
}

struct Parts {
  std::vector<at::Tensor> ids, values;
};

// One part's `<table>.ids` and `<table>.values`, read with the backend into tensors shaped as
// the commit record lists them.
void read_part(const CheckpointBackend& backend, const std::string& dir, const CommitRecord& record,
               const std::string& object, const std::vector<CommitRecord::Tensor>& listed,
               std::map<std::string, Parts>& out) {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  for (const CommitRecord::Tensor& t : listed) {
    std::string table, entry;
    if (!split_entry(t.name, table, entry)) continue;
    const at::ScalarType want = entry == "ids" ? at::kLong : at::kFloat;
    const size_t rank = entry == "ids" ? 1 : 2;
    if (dtype_of_name(t.dtype) != want || t.shape.size() != rank)
      throw Error("checkpoint " + dir + ": " + object + " lists " + t.name + " as " + t.dtype +
                  " " + text::shape(t.shape) + "; a table's " + entry + " are " +
                  (entry == "ids" ? "I64 [n]" : "F32 [n, dim]") + "; hint: the checkpoint was "
                  "not written by keel::EmbeddingTable's save, so keel export cannot read its "
                  "rows");
    names.push_back(t.name);
    tensors.push_back(at::empty(t.shape, at::TensorOptions().dtype(want)));
  }
  if (names.empty()) return;
  std::vector<keel_named_tensor> into;
  for (size_t i = 0; i < names.size(); ++i) into.push_back({names[i].c_str(), peek(tensors[i])});
  backend.load(dir, object, into);
  check_unchanged(dir, record, object);  // the bytes loaded are the bytes verified
  for (size_t i = 0; i < names.size(); ++i) {
    std::string table, entry;
    split_entry(names[i], table, entry);
    (entry == "ids" ? out[table].ids : out[table].values).push_back(tensors[i]);
  }
}

// A table's parts merged, sorted by id; an id in two parts is an error.
TableRows merge(const std::string& dir, const std::string& table, const Parts& parts) {
  if (parts.ids.size() != parts.values.size())
    throw Error("checkpoint " + dir + ": table " + table + " has " +
                std::to_string(parts.ids.size()) + " part(s) of ids and " +
                std::to_string(parts.values.size()) + " of values; hint: every rank's part "
                "holds both");
  for (size_t i = 0; i < parts.ids.size(); ++i)
    if (parts.ids[i].size(0) != parts.values[i].size(0) ||
        (i > 0 && parts.values[i].size(1) != parts.values[0].size(1)))
      throw Error("checkpoint " + dir + ": table " + table + ": a part's ids " +
                  text::shape(parts.ids[i].sizes()) + " do not match its values " +
                  text::shape(parts.values[i].sizes()) + " (or another part's row width)");
  const at::Tensor ids = at::cat(parts.ids);
  const at::Tensor values = at::cat(parts.values);
  const auto sorted = at::sort(ids);
  const at::Tensor order = std::get<1>(sorted);
  TableRows rows{std::get<0>(sorted).contiguous(), at::index_select(values, 0, order).contiguous()};
  const int64_t* p = rows.ids.data_ptr<int64_t>();
  for (int64_t i = 1; i < rows.ids.numel(); ++i)
    if (p[i] == p[i - 1])
      throw Error("checkpoint " + dir + ": table " + table + ": id " + std::to_string(p[i]) +
                  " is held by two ranks' parts; hint: the checkpoint's parts do not come from "
                  "one save");
  return rows;
}

at::Tensor longs(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  if (!v.empty()) std::memcpy(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

}  // namespace

std::map<std::string, TableRows> read_tables(const CheckpointBackend& backend,
                                             const std::string& dir, const CommitRecord& record) {
  std::map<std::string, Parts> parts;
  for (const auto& [object, listed] : record.tensors)
    if (is_tables_object(object)) read_part(backend, dir, record, object, listed, parts);
  std::map<std::string, TableRows> out;
  for (const auto& [table, p] : parts) out.emplace(table, merge(dir, table, p));
  return out;
}

std::map<std::string, TableDelta> table_delta(const std::map<std::string, TableRows>& old_rows,
                                              const std::map<std::string, TableRows>& new_rows) {
  std::map<std::string, TableDelta> out;
  for (const auto& [table, now] : new_rows) {
    const auto before = old_rows.find(table);
    const int64_t n = now.ids.numel();
    const int64_t dim = now.values.size(1);
    std::vector<int64_t> changed, removed;
    if (before == old_rows.end()) {
      for (int64_t i = 0; i < n; ++i) changed.push_back(i);
    } else {
      const TableRows& was = before->second;
      if (was.values.size(1) != dim)
        throw Error("table " + table + " has rows of " + std::to_string(was.values.size(1)) +
                    " floats in the older checkpoint and " + std::to_string(dim) + " in the "
                    "newer; hint: --since names a checkpoint of the same model");
      const int64_t m = was.ids.numel();
      const int64_t* a = was.ids.data_ptr<int64_t>();
      const int64_t* b = now.ids.data_ptr<int64_t>();
      const float* va = was.values.data_ptr<float>();
      const float* vb = now.values.data_ptr<float>();
      int64_t i = 0, j = 0;  // merge walk over both ascending id lists
      while (i < m || j < n) {
        if (j == n || (i < m && a[i] < b[j])) {
          removed.push_back(a[i++]);
        } else if (i == m || b[j] < a[i]) {
          changed.push_back(j++);
        } else {
          if (std::memcmp(va + i * dim, vb + j * dim, sizeof(float) * dim) != 0)
            changed.push_back(j);
          ++i, ++j;
        }
      }
    }
    const at::Tensor rows = longs(changed);
    out[table] = {at::index_select(now.ids, 0, rows), at::index_select(now.values, 0, rows),
                  longs(removed)};
  }
  for (const auto& [table, was] : old_rows)
    if (!new_rows.count(table))
      out[table] = {at::empty({0}, at::kLong), at::empty({0, was.values.size(1)}, at::kFloat),
                    was.ids.clone()};
  return out;
}

}  // namespace keel::cli
