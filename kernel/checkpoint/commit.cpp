#include "checkpoint/commit.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoint/checksum.hpp"
#include "error.hpp"
#include "files/files.hpp"
#include "text/text.hpp"
#include "unique_fd.hpp"

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

// A name from the record, quoted for a message (control bytes escaped: one line).
std::string record_name(const std::string& name) { return "'" + text::printable(name) + "'"; }

const char* const kPlainRule = " is not a plain name (no '/', no leading '.', no control byte)";

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
  const std::string where = "a chunk of tensor " + record_name(name) + " ";
  if (!c.is_object()) bad(path, where + "is not an object");
  CommitRecord::Chunk out;
  out.offset = dims(field(c, "offset", T::array, path, where), path, where + "offset");
  out.size = dims(field(c, "size", T::array, path, where), path, where + "size");
  out.object = field(c, "object", T::string, path, where).get<std::string>();
  if (c.contains("file")) out.file = field(c, "file", T::string, path, where).get<std::string>();
  if (!plain_name(out.object)) bad(path, where + "names object " + record_name(out.object) + kPlainRule);
  if (c.contains("file") && !plain_name(out.file))
    bad(path, where + "names file " + record_name(out.file) + kPlainRule);
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
        return fmt::format("a chunk does not span dimension {} whole", d);
    if (c.size.size() == g.shape.size() && c.size[0] > 0)
      rows.emplace_back(c.offset[0], c.offset[0] + c.size[0]);
  }
  std::sort(rows.begin(), rows.end());
  std::string gaps;
  int64_t covered = 0;
  const auto gap = [&](int64_t from, int64_t to) {
    gaps += fmt::format("{}{}..{}", gaps.empty() ? "rows " : ", ", from, to - 1);
  };
  for (const auto& [b, e] : rows) {
    if (b > covered) gap(covered, b);
    covered = std::max(covered, e);
  }
  if (covered < g.shape[0]) gap(covered, g.shape[0]);
  return gaps.empty() ? "" : gaps + " missing";
}

std::string record_checksum_text(const std::string& text) {
  return hash_string(hash_text(text)) + "\n";
}

bool plain_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name[0] == '.') return false;
  for (const char c : name)
    if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  return true;
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
    if (!plain_name(e.name) || e.name == "commit.json" || e.name == kRecordChecksumFile)
      bad(path, "file name " + record_name(e.name) + " is not a plain file name (no '/', no "
                "leading '.', no control byte, not the record's own)");
    if (!names.insert(e.name).second) bad(path, "file " + record_name(e.name) + " is listed twice");
    const json& size = field(f, "size", T::number_integer, path, "a file entry ");
    if (!size.is_number_unsigned()) bad(path, "file '" + e.name + "' has a negative size");
    e.size = size.get<uint64_t>();
    e.xxh3 = parse_hash(field(f, "xxh3", T::string, path, "a file entry ").get<std::string>(), path);
    r.files.push_back(std::move(e));
  }
  for (const auto& [object, list] : field(j, "tensors", T::object, path, "").items()) {
    if (!plain_name(object)) bad(path, "object " + record_name(object) + " of 'tensors'" + kPlainRule);
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

namespace {

const char* const kDamaged = "; hint: the checkpoint is damaged or was not written by keel, "
                             "resume from another one";

// `name` of directory `dir` (open as `dirfd`), opened for reading without following a link
// and without blocking; a regular file, or throws keel::Error naming it. -1 when it does not
// exist and `absent_ok`.
UniqueFd open_in(int dirfd, const std::string& dir, const std::string& name, bool absent_ok) {
  const std::string path = (fs::path(dir) / name).string();
  UniqueFd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    const int code = errno;
    if (code == ENOENT && absent_ok) return fd;
    if (code == ELOOP)
      throw Error(path + ": a symbolic link, not a file of the checkpoint; hint: a checkpoint "
                  "directory holds its files themselves, copy the checkpoint with its files "
                  "(cp -rL) or resume from another one");
    if (code == ENOENT)
      throw Error(path + ": missing from the checkpoint (its commit record lists it); hint: "
                  "the checkpoint is damaged, resume from another one");
    throw Error(path + ": cannot open it: " + std::strerror(code) + "; hint: check its "
                "permissions: every process that resumes or evaluates the checkpoint reads it");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(path + ": not a regular file; hint: the checkpoint is damaged, resume from "
                "another one");
  return fd;
}

std::string read_all(int fd, const std::string& path) {
  std::string out;
  add_hint([&] { read_chunks(fd, path, [&](const char* d, size_t n) { out.append(d, n); }); },
           [](int) { return "check that the checkpoint's files can be read"; });
  return out;
}

// <dir>/commit.json's text (the "missing" error of a directory without one).
std::string record_text(int dirfd, const std::string& dir) {
  const std::string path = (fs::path(dir) / "commit.json").string();
  UniqueFd fd = open_in(dirfd, dir, "commit.json", /*absent_ok=*/true);
  if (fd.get() < 0)
    throw Error(path + ": missing; hint: the directory is not a committed keel checkpoint "
                "(a save was interrupted, or it was written by something else)");
  return read_all(fd.get(), path);
}

const char* const kChanged =
    "changed while keel verified or loaded it (written, replaced or renamed by another process): "
    "what was loaded is not what was verified; hint: load a checkpoint that nothing else writes "
    "(copy it into a directory of your own first)";

int64_t change_time_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
}

UniqueFd open_dir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0)
    throw Error(dir + ": cannot open it as a directory: " + std::strerror(errno) +
                "; hint: name a checkpoint directory (runs/<name>/checkpoints/step-<N>)");
  return fd;
}

std::string dims_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Bytes of one element of dtype `name` (0: not a dtype keel loads; the loader refuses it).
uint64_t element_bytes(const std::string& name) {
  if (name == "F64" || name == "I64") return 8;
  if (name == "F32" || name == "I32") return 4;
  if (name == "F16" || name == "BF16") return 2;
  if (name == "I8" || name == "U8" || name == "BOOL") return 1;
  return 0;
}

// The bytes of a tensor of `shape` and dtype `dtype` (1 byte an element for an unknown one),
// or false when they overflow 64 bits.
bool tensor_bytes(const std::vector<int64_t>& shape, const std::string& dtype, uint64_t* out) {
  uint64_t n = std::max<uint64_t>(element_bytes(dtype), 1);
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) n = 0;
  for (const int64_t d : shape)
    if (n && __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  *out = n;
  return true;
}

}  // namespace

void check_record_claims(const CommitRecord& r, const std::string& path) {
  std::map<std::string, uint64_t> listed;  // file -> size
  for (const auto& f : r.files) listed[f.name] = f.size;
  struct Object {
    uint64_t bytes = 0;   // of its files
    std::string files;    // "model.safetensors: 1234 bytes, ..."
    bool any = false;
  };
  std::map<std::string, Object> objects;
  const auto object = [&](const std::string& name) -> Object& {
    auto [it, added] = objects.try_emplace(name);
    if (!added) return it->second;
    for (const auto& [file, size] : listed)
      if (file.size() > name.size() + 1 && file.compare(0, name.size(), name) == 0 &&
          file[name.size()] == '.') {
        it->second.any = true;
        it->second.bytes = it->second.bytes + size < it->second.bytes ? UINT64_MAX
                                                                      : it->second.bytes + size;
        it->second.files += fmt::format("{}{}: {} bytes", it->second.files.empty() ? "" : ", ",
                                        text::printable(file), size);
      }
    return it->second;
  };
  // One claim: tensor `what` ("tensor 'x'", "optimizer tensor 'x'") of `shape` in object `o`,
  // added to `claimed` (that object's running total).
  const auto claim = [&](const std::string& what, const std::string& o,
                         const std::vector<int64_t>& shape, const std::string& dtype,
                         std::map<std::string, uint64_t>& claimed) {
    uint64_t bytes = 0;
    const std::string of = what + " of object " + record_name(o);
    if (!tensor_bytes(shape, dtype, &bytes))
      throw Error(path + ": " + of + " claims shape " + dims_text(shape) + " of " +
                  text::printable(dtype) + ", more bytes than 64 bits count" + kDamaged);
    const Object& obj = object(o);
    const std::string held =
        ", more than its files hold (" + (obj.any ? obj.files : "none") + ")" + kDamaged;
    if (bytes > obj.bytes)
      throw Error(fmt::format("{}: {} claims {} bytes ({} {}){}", path, of, bytes,
                              dims_text(shape), text::printable(dtype), held));
    uint64_t& total = claimed[o];
    if (__builtin_add_overflow(total, bytes, &total) || total > obj.bytes)
      throw Error(path + ": the tensors of object " + record_name(o) + " claim more bytes, up to " +
                  what + " (" + dims_text(shape) + " " + text::printable(dtype) + ")" + held);
  };
  std::map<std::string, uint64_t> by_tensors, by_chunks;
  for (const auto& [o, list] : r.tensors)
    for (const auto& t : list) claim("tensor " + record_name(t.name), o, t.shape, t.dtype, by_tensors);
  for (const auto& [group, tensors] : r.chunks)
    for (const auto& [name, g] : tensors) {
      const std::string what = text::printable(group) + " tensor " + record_name(name);
      for (const auto& c : g.chunks) {
        if (!object(c.object).any)
          throw Error(path + ": " + what + " is held by object " + record_name(c.object) +
                      ", which has no file in the checkpoint" + kDamaged);
        if (!c.file.empty() && !listed.count(c.file))
          throw Error(path + ": " + what + " is held by file " + record_name(c.file) +
                      ", which the commit record does not list" + kDamaged);
        claim(what, c.object, c.size, g.dtype, by_chunks);
      }
      uint64_t bytes = 0;
      if (!tensor_bytes(g.shape, g.dtype, &bytes))
        throw Error(path + ": " + what + " claims shape " + dims_text(g.shape) + " of " +
                    text::printable(g.dtype) + ", more bytes than 64 bits count" + kDamaged);
    }
}

void check_unchanged(const std::string& dir, const CommitRecord& r, const std::string& object) {
  for (const auto& f : r.files) {
    if (f.ino == 0) continue;
    if (!object.empty() &&
        !(f.name.size() > object.size() + 1 && f.name.compare(0, object.size(), object) == 0 &&
          f.name[object.size()] == '.'))
      continue;
    const std::string file = (fs::path(dir) / f.name).string();
    struct stat st {};
    if (::fstatat(AT_FDCWD, file.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        static_cast<uint64_t>(st.st_dev) != f.dev || static_cast<uint64_t>(st.st_ino) != f.ino ||
        change_time_ns(st) != f.ctime_ns || static_cast<uint64_t>(st.st_size) != f.size)
      throw Error(file + ": " + kChanged);
  }
}

CommitRecord read_commit_file(const std::string& dir) {
  const std::string path = (fs::path(dir) / "commit.json").string();
  const UniqueFd dirfd = open_dir(dir);
  return read_commit_record(record_text(dirfd.get(), dir), path);
}

CommitRecord verify_checkpoint(const std::string& dir) {
  const UniqueFd dirfd = open_dir(dir);
  const std::string path = (fs::path(dir) / "commit.json").string();
  const std::string text = record_text(dirfd.get(), dir);
  // The record's own checksum first: a flipped byte is named as such, not as what it broke.
  const std::string sum_path = (fs::path(dir) / kRecordChecksumFile).string();
  const UniqueFd sum_fd = open_in(dirfd.get(), dir, kRecordChecksumFile, /*absent_ok=*/true);
  if (sum_fd.get() < 0) {
    spdlog::warn("{}: no {} beside it (written by a keel before issue 43): the record itself "
                 "is not covered by a checksum; its files are verified", path,
                 kRecordChecksumFile);
  } else {
    std::string sum = read_all(sum_fd.get(), sum_path);
    if (sum.size() > 64) sum.resize(64);
    if (sum.size() != 22 || sum.compare(0, 5, "xxh3:") != 0 || sum[21] != '\n' ||
        sum.find_first_not_of("0123456789abcdef", 5) != 21)
      throw Error(sum_path + ": not 'xxh3:' and 16 lowercase hex digits on one line; hint: the "
                  "checkpoint is damaged, resume from another one");
    const std::string want = record_checksum_text(text);
    if (sum != want)
      throw Error(path + ": checksum mismatch (" + want.substr(0, 21) + ", " + kRecordChecksumFile +
                  " says " + sum.substr(0, 21) + "); hint: the commit record is corrupt, resume "
                  "from another checkpoint");
  }
  CommitRecord r = read_commit_record(text, path);
  std::set<std::string> listed;
  for (auto& f : r.files) {
    listed.insert(f.name);
    const std::string file = (fs::path(dir) / f.name).string();
    const UniqueFd fd = open_in(dirfd.get(), dir, f.name, /*absent_ok=*/false);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != f.size)
      throw Error(fmt::format("{}: size {} bytes, the commit record says {}; hint: the file was "
                              "truncated or changed, resume from another checkpoint", file,
                              st.st_size, f.size));
    uint64_t size = 0;
    const uint64_t h = add_hint([&] { return hash_fd(fd.get(), file, &size); },
                                [](int) { return "check that the checkpoint's files can be read"; });
    if (h != f.xxh3 || size != f.size)
      throw Error(file + ": checksum mismatch (" + hash_string(h) + ", the commit record says " +
                  hash_string(f.xxh3) + "); hint: the file is corrupt, resume from another "
                  "checkpoint");
    struct stat after {};
    if (::fstat(fd.get(), &after) != 0 || change_time_ns(after) != change_time_ns(st))
      throw Error(file + ": " + kChanged);
    f.dev = static_cast<uint64_t>(st.st_dev);
    f.ino = static_cast<uint64_t>(st.st_ino);
    f.ctime_ns = change_time_ns(st);
  }
  check_record_claims(r, path);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != "commit.json" && name != kRecordChecksumFile && !listed.count(name))
      throw Error((fs::path(dir) / text::printable(name)).string() + ": not listed in the commit "
                  "record; hint: a checkpoint directory holds only what keel committed, move the "
                  "file elsewhere");
  }
  return r;
}

}  // namespace keel
