#include "host_services.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/version.h>

#include <cstring>

#include "bounded.hpp"
#include "keel/tensor.hpp"
#include "options.hpp"

namespace keel {
namespace {

const at::TensorImpl* impl(const keel_tensor* t) {
  return reinterpret_cast<const at::TensorImpl*>(t);
}

keel_dtype tensor_dtype(const keel_tensor* t) {
  const Dtype* d = dtype_of(c10::typeMetaToScalarType(impl(t)->dtype()));
  return d ? d->keel : KEEL_DTYPE_UNKNOWN;
}
int32_t tensor_ndim(const keel_tensor* t) { return static_cast<int32_t>(impl(t)->dim()); }
int64_t tensor_size(const keel_tensor* t, int32_t dim) {
  if (dim < 0 || dim >= impl(t)->dim()) return -1;
  return impl(t)->size(dim);
}
int64_t tensor_numel(const keel_tensor* t) { return impl(t)->numel(); }
void* tensor_cpu_data(const keel_tensor* t) {
  const at::Tensor x = borrow(t);
  if (!x.is_cpu() || !x.is_contiguous()) return nullptr;
  return x.data_ptr();
}
keel_tensor* tensor_contiguous_cpu(const keel_tensor* t) {
  try {
    return give(borrow(t).to(at::kCPU).contiguous());
  } catch (...) {
    return nullptr;
  }
}
keel_tensor* tensor_from_buffer(keel_dtype dtype, const int64_t* shape, int32_t ndim,
                                const void* data) {
  try {
    if (ndim < 0 || (ndim > 0 && !shape)) return nullptr;
    const Dtype* m = dtype_of(dtype);
    if (!m) return nullptr;
    at::Tensor out = at::zeros(at::IntArrayRef(shape, static_cast<size_t>(ndim)),
                               at::TensorOptions().dtype(m->torch));
    if (data) std::memcpy(out.data_ptr(), data, out.nbytes());
    return give(std::move(out));
  } catch (...) {
    return nullptr;
  }
}
keel_tensor* tensor_retain(keel_tensor* t) {
  if (t) c10::raw::intrusive_ptr::incref(reinterpret_cast<at::TensorImpl*>(t));
  return t;
}
void tensor_release(keel_tensor* t) { adopt(t); }

template <class T>
const T* value(const keel_options* o, const char* key) {
  if (!o || !key) return nullptr;
  auto it = o->values.find(key);
  if (it == o->values.end()) return nullptr;
  return std::get_if<T>(&it->second);
}

int option_bool(const keel_options* o, const char* key, int* out) {
  const bool* v = value<bool>(o, key);
  if (v) *out = *v ? 1 : 0;
  return v != nullptr;
}
int option_int(const keel_options* o, const char* key, int64_t* out) {
  const int64_t* v = value<int64_t>(o, key);
  if (v) *out = *v;
  return v != nullptr;
}
int option_float(const keel_options* o, const char* key, double* out) {
  const double* v = value<double>(o, key);
  if (v) *out = *v;
  return v != nullptr;
}
const char* option_string(const keel_options* o, const char* key) {
  const std::string* v = value<std::string>(o, key);
  return v ? v->c_str() : nullptr;
}
int64_t option_list_size(const keel_options* o, const char* key) {
  if (const auto* v = value<std::vector<int64_t>>(o, key)) return static_cast<int64_t>(v->size());
  if (const auto* v = value<std::vector<double>>(o, key)) return static_cast<int64_t>(v->size());
  return -1;
}
int option_list_int(const keel_options* o, const char* key, int64_t i, int64_t* out) {
  const auto* v = value<std::vector<int64_t>>(o, key);
  if (!v || i < 0 || i >= static_cast<int64_t>(v->size())) return 0;
  *out = (*v)[i];
  return 1;
}
int option_list_float(const keel_options* o, const char* key, int64_t i, double* out) {
  if (const auto* v = value<std::vector<double>>(o, key)) {
    if (i < 0 || i >= static_cast<int64_t>(v->size())) return 0;
    *out = (*v)[i];
    return 1;
  }
  int64_t x = 0;
  if (!option_list_int(o, key, i, &x)) return 0;
  *out = static_cast<double>(x);
  return 1;
}

thread_local std::string reported_error;
thread_local bool reported = false;

void report_error(const char* message) {
  if (reported) return;  // the first report of a slot call counts
  reported = true;
  reported_error = bounded(message, KEEL_ERROR_CAPACITY);
  if (reported_error.empty()) reported_error = "(no message)";
}

// keel_host.stop_requested of a host that never stops a run (keel::testing's by default).
int never_stopped() { return 0; }

}  // namespace

std::string take_reported_error() {
  if (!reported) return "";
  reported = false;
  return std::move(reported_error);
}

keel_host host_table(void (*log)(keel_log_level level, const char* origin, const char* message),
                     int (*stop_requested)()) {
  return {
      sizeof(keel_host),   KEEL_ABI_MAJOR,      KEEL_ABI_MINOR,      TORCH_VERSION,
      tensor_dtype,        tensor_ndim,         tensor_size,         tensor_numel,
      tensor_cpu_data,     tensor_contiguous_cpu, tensor_from_buffer, tensor_retain,
      tensor_release,      option_bool,         option_int,          option_float,
      option_string,       option_list_size,    option_list_int,     option_list_float,
      log,                 report_error,        stop_requested ? stop_requested : never_stopped,
  };
}

}  // namespace keel
