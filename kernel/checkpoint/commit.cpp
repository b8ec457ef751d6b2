#include "checkpoint/commit.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoint/checksum.hpp"
#include "error.hpp"
#include "files/files.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(path + ": invalid commit record: " + what +
              "; hint: the checkpoint is incomplete or damaged, resume from another one");
}

const json& field(const json& j, const char* key, json::value_t type, const std::string& path,
                  const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) bad(path, where + "has no '" + key + "'");
  const bool ok = it->type() == type ||
                  (type == json::value_t::number_integer && it->is_number_unsigned()) ||
                  (type == json::value_t::number_float && it->is_number());
  if (!ok) bad(path, where + "'" + key + "' has the wrong type");
  return *it;
}

uint64_t parse_hash(const std::string& s, const std::string& path) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    bad(path, "checksum '" + s + "' is not 16 lowercase hex digits");
  return std::stoull(s, nullptr, 16);
}

std::string hex(uint64_t h) { return hash_string(h).substr(5); }

std::vector<int64_t> dims(const json& a, const std::string& path, const std::string& what) {
  std::vector<int64_t> out;
  if (!a.is_array()) bad(path, what + " is not a list");
  for (const json& d : a) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      bad(path, what + " has an entry that is not an integer >= 0");
    out.push_back(d.get<int64_t>());
  }
  return out;
}

json chunk_index_json(const CommitRecord::ChunkIndex& index) {
  json j = json::object();
  for (const auto& [group, tensors] : index) {
    json g = json::object();
    for (const auto& [name, t] : tensors) {
      json e = {{"dtype", t.dtype}, {"shape", t.shape}};
      if (!t.like.empty()) e["like"] = t.like;
      e["chunks"] = json::array();
      for (const auto& c : t.chunks) {
        json cj = {{"offset", c.offset}, {"size", c.size}, {"object", c.object}};
        if (!c.file.empty()) cj["file"] = c.file;
        e["chunks"].push_back(std::move(cj));
      }
      g[name] = std::move(e);
    }
    j[group] = std::move(g);
  }
  return j;
}

CommitRecord::Chunk read_chunk(const json& c, const CommitRecord::Global& g,
                               const std::string& name, const std::string& path) {
  using T = json::value_t;
  const std::string where = "a chunk of tensor '" + name + "' ";
  if (!c.is_object()) bad(path, where + "is not an object");
  CommitRecord::Chunk out;
  out.offset = dims(field(c, "offset", T::array, path, where), path, where + "offset");
  out.size = dims(field(c, "size", T::array, path, where), path, where + "size");
  out.object = field(c, "object", T::string, path, where).get<std::string>();
  if (c.contains("file")) out.file = field(c, "file", T::string, path, where).get<std::string>();
  if (out.object.empty()) bad(path, where + "names no object");
  if (out.offset.size() != g.shape.size() || out.size.size() != g.shape.size())
    bad(path, where + "has offset or size of another rank than its shape");
  for (size_t d = 0; d < g.shape.size(); ++d)
    if (out.size[d] > g.shape[d] || out.offset[d] > g.shape[d] - out.size[d])
      bad(path, where + "lies outside its shape");
  return out;
}

CommitRecord::ChunkIndex read_chunk_index(const json& j, const std::string& path) {
  using T = json::value_t;
  CommitRecord::ChunkIndex index;
  for (const auto& [group, tensors] : j.items()) {
    if (!tensors.is_object()) bad(path, "chunks of '" + group + "' are not an object");
    for (const auto& [name, t] : tensors.items()) {
      const std::string where = "tensor '" + name + "' ";
      if (!t.is_object()) bad(path, where + "is not an object");
      CommitRecord::Global g;
      g.dtype = field(t, "dtype", T::string, path, where).get<std::string>();
      g.shape = dims(field(t, "shape", T::array, path, where), path, where + "shape");
      if (t.contains("like")) g.like = field(t, "like", T::string, path, where).get<std::string>();
      for (const json& c : field(t, "chunks", T::array, path, where))
        g.chunks.push_back(read_chunk(c, g, name, path));
      index[group][name] = std::move(g);
    }
  }
  return index;
}

// The parameter of the model (by name and dtype) that optimizer entry `name` is named after
// ("<param>.<suffix>", the longest such name), or nullptr.
const CommitRecord::Tensor* named_after(const std::vector<CommitRecord::Tensor>& model,
                                        const CommitRecord::Tensor& entry) {
  const CommitRecord::Tensor* best = nullptr;
  for (const auto& p : model)
    if (entry.name.size() > p.name.size() + 1 && entry.name.compare(0, p.name.size(), p.name) == 0 &&
        entry.name[p.name.size()] == '.' && entry.dtype == p.dtype &&
        (!best || p.name.size() > best->name.size()))
      best = &p;
  return best;
}

// Version 1 records: the chunks their objects imply. "model" and "optimizer" hold whole tensors
// (an optimizer entry of its parameter's name, dtype and shape is `like` it); the
// "rank<r>.optimizer" objects of W ranks with [distributed] shard hold each rank's rows of the
// elementwise entries, laid out as distributed/sharding.hpp cuts them, and rank 0's copy of
// the others.
CommitRecord::ChunkIndex synthesise_v1_chunks(const CommitRecord& r, const std::string& path) {
  CommitRecord::ChunkIndex index;
  static const std::vector<CommitRecord::Tensor> kNone;
  const auto m = r.tensors.find("model");
  const auto& model = m == r.tensors.end() ? kNone : m->second;
  const auto whole = [](const CommitRecord::Tensor& t, const std::string& object) {
    return CommitRecord::Chunk{std::vector<int64_t>(t.shape.size(), 0), t.shape, object, ""};
  };
  for (const auto& t : model) index["model"][t.name] = {t.dtype, t.shape, "", {whole(t, "model")}};
  int64_t world = 0;
  while (r.tensors.count("rank" + std::to_string(world) + ".optimizer")) ++world;
  const bool sharded = world > 0 && !r.tensors.count("optimizer");
  for (int64_t rank = 0; rank < (sharded ? world : 1); ++rank) {
    const std::string object = sharded ? "rank" + std::to_string(rank) + ".optimizer" : "optimizer";
    const auto o = r.tensors.find(object);
    if (o == r.tensors.end()) continue;
    for (const auto& t : o->second) {
      const CommitRecord::Tensor* p = named_after(model, t);
      std::vector<int64_t> local = p ? p->shape : std::vector<int64_t>{};
      int64_t begin = 0, count = 0;
      if (p && sharded) {
        const int64_t rows = p->shape.empty() ? 1 : p->shape[0];
        const int64_t chunk = (rows + world - 1) / world;
        begin = std::min(rank * chunk, rows);
        count = std::min(chunk, rows - begin);
        if (p->shape.empty()) local = rank == 0 ? local : std::vector<int64_t>{0};
        else local[0] = count;
      }
      if (p && t.shape == local) {
        if (sharded && count == 0) continue;
        CommitRecord::Chunk c = whole(t, object);
        if (!c.offset.empty()) c.offset[0] = begin;
        auto [it, added] = index["optimizer"].try_emplace(t.name);
        CommitRecord::Global& g = it->second;
        if (!added && (g.dtype != t.dtype || g.shape != p->shape || g.like != p->name))
          bad(path, "the ranks' optimizer objects disagree on tensor '" + t.name + "'");
        g.dtype = t.dtype;
        g.shape = p->shape;
        g.like = p->name;
        g.chunks.push_back(std::move(c));
      } else if (rank == 0) {
        index["optimizer"][t.name] = {t.dtype, t.shape, "", {whole(t, object)}};
      }
    }
  }
  return index;
}

}  // namespace

void merge_part(CommitRecord& into, const CommitRecord& part) {
  for (const auto& [object, list] : part.tensors) into.tensors[object] = list;
  for (const auto& [group, tensors] : part.chunks)
    for (const auto& [name, g] : tensors) {
      auto [it, added] = into.chunks[group].emplace(name, g);
      if (added) continue;
      CommitRecord::Global& have = it->second;
      if (have.dtype != g.dtype || have.shape != g.shape || have.like != g.like)
        throw Error("the ranks' parts of a checkpoint disagree on " + group + " tensor '" +
                    name + "' (dtype, global shape or parameter); hint: every rank must run "
                    "the same model and optimizer");
      have.chunks.insert(have.chunks.end(), g.chunks.begin(), g.chunks.end());
      std::sort(have.chunks.begin(), have.chunks.end(),
                [](const CommitRecord::Chunk& a, const CommitRecord::Chunk& b) {
                  return a.offset < b.offset;
                });
    }
}

std::string coverage_gap(const CommitRecord::Global& g) {
  if (g.shape.empty()) return g.chunks.empty() ? "no chunk holds it" : "";
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (const auto& c : g.chunks) {
    for (size_t d = 1; d < g.shape.size(); ++d)
      if (c.offset.size() != g.shape.size() || c.offset[d] != 0 || c.size[d] != g.shape[d])
        return "a chunk does not span dimension " + std::to_string(d) + " whole";
    if (c.size.size() == g.shape.size() && c.size[0] > 0)
      rows.emplace_back(c.offset[0], c.offset[0] + c.size[0]);
  }
  std::sort(rows.begin(), rows.end());
  std::string gaps;
  int64_t covered = 0;
  const auto gap = [&](int64_t from, int64_t to) {
    gaps += (gaps.empty() ? "rows " : ", ") + std::to_string(from) + ".." + std::to_string(to - 1);
  };
  for (const auto& [b, e] : rows) {
    if (b > covered) gap(covered, b);
    covered = std::max(covered, e);
  }
  if (covered < g.shape[0]) gap(covered, g.shape[0]);
  return gaps.empty() ? "" : gaps + " missing";
}

std::string write_commit_record(const CommitRecord& r) {
  json j;
  j["format"] = "keel-checkpoint";
  j["version"] = 2;
  j["run_id"] = r.run_id;
  j["step"] = r.step;
  j["committed_unix_ns"] = r.committed_unix_ns;
  j["files"] = json::array();
  for (const auto& f : r.files)
    j["files"].push_back({{"name", f.name}, {"size", f.size}, {"xxh3", hex(f.xxh3)}});
  j["tensors"] = json::object();
  for (const auto& [object, list] : r.tensors) {
    json a = json::array();
    for (const auto& t : list) a.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}});
    j["tensors"][object] = std::move(a);
  }
  j["chunks"] = chunk_index_json(r.chunks);
  j["metrics"] = json::object();
  for (const auto& [k, v] : r.metrics)
    if (std::isfinite(v)) j["metrics"][k] = v;  // JSON has no NaN: a NaN metric ranks nowhere
  return j.dump(1) + "\n";
}

CommitRecord read_commit_record(std::string_view text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(path, std::string("not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) bad(path, "not a JSON object");
  using T = json::value_t;
  if (field(j, "format", T::string, path, "") != "keel-checkpoint")
    bad(path, "'format' is not \"keel-checkpoint\"");
  const int64_t version = field(j, "version", T::number_integer, path, "").get<int64_t>();
  if (version != 1 && version != 2)
    bad(path, "'version' is not 1 or 2 (written by a newer keel?)");
  CommitRecord r;
  r.version = static_cast<int>(version);
  r.run_id = field(j, "run_id", T::string, path, "").get<std::string>();
  r.step = field(j, "step", T::number_integer, path, "").get<int64_t>();
  r.committed_unix_ns = field(j, "committed_unix_ns", T::number_integer, path, "").get<int64_t>();
  if (r.step < 0) bad(path, "'step' is negative");
  std::set<std::string> names;
  for (const json& f : field(j, "files", T::array, path, "")) {
    if (!f.is_object()) bad(path, "a 'files' entry is not an object");
    CommitRecord::File e;
    e.name = field(f, "name", T::string, path, "a file entry ").get<std::string>();
    if (e.name.empty() || e.name.find('/') != std::string::npos || e.name == "." ||
        e.name == ".." || e.name == "commit.json")
      bad(path, "file name '" + e.name + "' is not a plain file name");
    if (!names.insert(e.name).second) bad(path, "file '" + e.name + "' is listed twice");
    const json& size = field(f, "size", T::number_integer, path, "a file entry ");
    if (!size.is_number_unsigned()) bad(path, "file '" + e.name + "' has a negative size");
    e.size = size.get<uint64_t>();
    e.xxh3 = parse_hash(field(f, "xxh3", T::string, path, "a file entry ").get<std::string>(), path);
    r.files.push_back(std::move(e));
  }
  for (const auto& [object, list] : field(j, "tensors", T::object, path, "").items()) {
    if (!list.is_array()) bad(path, "tensors of '" + object + "' are not a list");
    auto& out = r.tensors[object];
    std::set<std::string> seen;
    for (const json& t : list) {
      if (!t.is_object()) bad(path, "a tensor entry of '" + object + "' is not an object");
      CommitRecord::Tensor e;
      e.name = field(t, "name", T::string, path, "a tensor entry ").get<std::string>();
      if (!seen.insert(e.name).second)
        bad(path, "tensor '" + e.name + "' is listed twice in '" + object + "'");
      e.dtype = field(t, "dtype", T::string, path, "a tensor entry ").get<std::string>();
      for (const json& d : field(t, "shape", T::array, path, "a tensor entry ")) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          bad(path, "tensor '" + e.name + "' has a shape entry that is not an integer >= 0");
        e.shape.push_back(d.get<int64_t>());
      }
      out.push_back(std::move(e));
    }
  }
  r.chunks = version == 1 ? synthesise_v1_chunks(r, path)
                          : read_chunk_index(field(j, "chunks", T::object, path, ""), path);
  for (const auto& [k, v] : field(j, "metrics", T::object, path, "").items()) {
    if (!v.is_number()) bad(path, "metric '" + k + "' is not a number");
    r.metrics[k] = v.get<double>();
  }
  return r;
}

CommitRecord read_commit_file(const std::string& dir) {
  const std::string path = (fs::path(dir) / "commit.json").string();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(path + ": missing; hint: the directory is not a committed keel checkpoint "
                "(a save was interrupted, or it was written by something else)");
  return read_commit_record(add_hint([&] { return read_file(path); },
                                     [](int) {
                                       return "check its permissions: every process that resumes "
                                              "or evaluates the checkpoint reads it";
                                     }),
                            path);
}

CommitRecord verify_checkpoint(const std::string& dir) {
  CommitRecord r = read_commit_file(dir);
  std::set<std::string> listed;
  for (const auto& f : r.files) {
    listed.insert(f.name);
    const std::string path = (fs::path(dir) / f.name).string();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw Error(path + ": missing from the checkpoint (its commit record lists it); hint: "
                  "the checkpoint is damaged, resume from another one");
    if (static_cast<uint64_t>(st.st_size) != f.size)
      throw Error(path + ": size " + std::to_string(st.st_size) + " bytes, the commit record says " +
                  std::to_string(f.size) + "; hint: the file was truncated or changed, resume "
                  "from another checkpoint");
    uint64_t size = 0;
    const uint64_t h = hash_file(path, &size, false);
    if (h != f.xxh3)
      throw Error(path + ": checksum mismatch (" + hash_string(h) + ", the commit record says " +
                  hash_string(f.xxh3) + "); hint: the file is corrupt, resume from another "
                  "checkpoint");
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != "commit.json" && !listed.count(name))
      throw Error(e.path().string() + ": not listed in the commit record; hint: a checkpoint "
                  "directory holds only what keel committed, move the file elsewhere");
  }
  return r;
}

}  // namespace keel
