#include "checkpoint/reshard.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <map>
#include <utility>

#include "checkpoint/backend.hpp"
#include "checkpoint/store.hpp"
#include "error.hpp"
#include "keel/tensor.hpp"
#include "text/text.hpp"

namespace keel {

at::Tensor allocate_claimed(const std::vector<int64_t>& shape, at::ScalarType dtype,
                            const std::string& what, const std::string& dir) {
  if (dtype == at::ScalarType::Undefined)
    throw Error(dir + ": " + what + " has a dtype keel cannot load; hint: the checkpoint was not "
                "written by keel train");
  try {
    return at::empty(shape, at::TensorOptions().dtype(dtype));
  } catch (const std::exception& e) {  // c10::Error (DefaultCPUAllocator), std::bad_alloc
    int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
    for (const int64_t d : shape) n = __builtin_mul_overflow(n, d, &n) ? INT64_MAX : n;
    const std::string why = e.what();
    throw Error(fmt::format("{}: cannot allocate {} {} ({} bytes) to load it ({}); hint: load "
                            "the checkpoint on a machine with more memory", dir, what,
                            text::shape(shape), n, text::printable(why.substr(0, why.find('\n')))));
  }
}

std::vector<int64_t> ParamRows::local_shape() const {
  std::vector<int64_t> s = shape;
  if (s.empty()) return count > 0 ? s : std::vector<int64_t>{0};
  s[0] = count;
  return s;
}

int64_t named_after(const std::vector<ParamRows>& params, const std::string& name) {
  int64_t best = -1;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& p = params[i].name;
    if (name.size() > p.size() + 1 && name.compare(0, p.size(), p) == 0 && name[p.size()] == '.' &&
        (best < 0 || p.size() > params[best].name.size()))
      best = static_cast<int64_t>(i);
  }
  return best;
}

int64_t like_param(const std::vector<ParamRows>& params, const std::string& name,
                   at::ScalarType dtype, const std::vector<int64_t>& shape) {
  const int64_t i = named_after(params, name);
  if (i < 0 || params[i].dtype != dtype || params[i].local_shape() != shape) return -1;
  return i;
}

ChunkReader::ChunkReader(const CheckpointBackend& backend, std::string dir,
                         const CommitRecord& record)
    : backend_(backend), dir_(std::move(dir)), record_(record) {}

const CommitRecord::Global* ChunkReader::find(const std::string& group,
                                              const std::string& name) const {
  const auto g = record_.chunks.find(group);
  if (g == record_.chunks.end()) return nullptr;
  const auto t = g->second.find(name);
  return t == g->second.end() ? nullptr : &t->second;
}

void ChunkReader::check_coverage(const std::string& group) const {
  const auto g = record_.chunks.find(group);
  if (g == record_.chunks.end()) return;
  for (const auto& [name, t] : g->second) {
    const std::string gap = coverage_gap(t);
    if (!gap.empty())
      throw Error(dir_ + ": " + group + " tensor '" + name + "' " + text::shape(t.shape) +
                  " is not covered by its chunks (" + gap + "); hint: the checkpoint is "
                  "incomplete or its commit record damaged, resume from another checkpoint");
  }
}

void ChunkReader::read(const std::vector<Request>& requests) const {
  // Per backend object: the chunks to read (by name) and where their overlaps go.
  struct Copy {
    at::Tensor from, to;
  };
  std::map<std::string, TensorList> loads;
  std::vector<Copy> copies;
  const at::NoGradGuard no_grad;
  for (const Request& r : requests) {
    const CommitRecord::Global* g = find(r.group, r.name);
    if (g == nullptr)
      throw Error(dir_ + ": the checkpoint has no " + r.group + " tensor '" + r.name +
                  "'; hint: resume with the model and optimizer the checkpoint was saved with");
    const std::string gap = coverage_gap(*g);
    if (!gap.empty())
      throw Error(dir_ + ": " + r.group + " tensor '" + r.name + "' " + text::shape(g->shape) +
                  " is not covered by its chunks (" + gap + "); hint: the checkpoint is "
                  "incomplete or its commit record damaged, resume from another checkpoint");
    const bool scalar = g->shape.empty();
    const int64_t count = scalar ? r.into.numel() : r.into.dim() == 0 ? 1 : r.into.size(0);
    if (!scalar && (r.into.dim() != static_cast<int64_t>(g->shape.size()) || r.begin < 0 ||
                    r.begin + count > g->shape[0]))
      throw Error(fmt::format("{}: {} tensor '{}' {} has no rows {}..{} of shape {}; hint: resume "
                              "with the model options the checkpoint was saved with", dir_,
                              r.group, r.name, text::shape(g->shape), r.begin,
                              r.begin + count - 1, text::shape(r.into.sizes())));
    if (count == 0) continue;
    const at::ScalarType dtype = dtype_of_name(g->dtype);
    if (dtype == at::ScalarType::Undefined)
      throw Error(dir_ + ": " + r.group + " tensor '" + r.name + "' has dtype " + g->dtype +
                  ", which keel cannot load; hint: the checkpoint was not written by keel train");
    for (const CommitRecord::Chunk& c : g->chunks) {
      const int64_t cb = scalar ? 0 : c.offset[0], ce = scalar ? 1 : cb + c.size[0];
      const int64_t b = std::max(cb, r.begin), e = std::min(ce, r.begin + count);
      if (b >= e) continue;
      at::Tensor whole = allocate_claimed(c.size, dtype, r.group + " tensor '" + r.name + "'", dir_);
      loads[c.object].emplace_back(r.name, whole);
      if (scalar) copies.push_back({whole, r.into});
      else copies.push_back({whole.narrow(0, b - cb, e - b), r.into.narrow(0, b - r.begin, e - b)});
      if (scalar) break;
    }
  }
  for (const auto& [object, list] : loads) {
    std::vector<keel_named_tensor> named;
    for (const auto& [name, t] : list) named.push_back({name.c_str(), peek(t)});
    backend_.load(dir_, object, named);
    check_unchanged(dir_, record_, object);  // the bytes loaded are the bytes verified
  }
  for (Copy& c : copies) c.to.copy_(c.from);
}

}  // namespace keel
