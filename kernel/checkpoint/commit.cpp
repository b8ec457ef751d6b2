#include "checkpoint/commit.hpp"

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <set>

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

}  // namespace

std::string write_commit_record(const CommitRecord& r) {
  json j;
  j["format"] = "keel-checkpoint";
  j["version"] = 1;
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
  if (field(j, "version", T::number_integer, path, "").get<int64_t>() != 1)
    bad(path, "'version' is not 1 (written by a newer keel?)");
  CommitRecord r;
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
    for (const json& t : list) {
      if (!t.is_object()) bad(path, "a tensor entry of '" + object + "' is not an object");
      CommitRecord::Tensor e;
      e.name = field(t, "name", T::string, path, "a tensor entry ").get<std::string>();
      e.dtype = field(t, "dtype", T::string, path, "a tensor entry ").get<std::string>();
      for (const json& d : field(t, "shape", T::array, path, "a tensor entry ")) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          bad(path, "tensor '" + e.name + "' has a shape entry that is not an integer >= 0");
        e.shape.push_back(d.get<int64_t>());
      }
      out.push_back(std::move(e));
    }
  }
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
