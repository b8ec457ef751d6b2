// A third-party program built against the installed SDK alone (pkg-config keel-embedding; see
// test_sdk_install.sh): a keel::EmbeddingTable admits ids, pools them and evicts one.
#include <ATen/ops/tensor.h>

#include <cstdio>
#include <vector>

#include "keel/embedding.hpp"

int main() {
  keel::TableOptions o;
  o.name = "third_party";
  o.dim = 4;
  o.ttl_steps = 1;
  keel::EmbeddingTable table(o, nullptr);
  const std::vector<int64_t> ids = {7, 7, 9}, offsets = {0, 2};
  const at::Tensor out = table.lookup(at::tensor(ids), at::tensor(offsets), keel::Pooling::kMean);
  const keel_sparse_table* abi = table.abi();
  keel_error err{};
  abi->end_step(abi->self, 1, &err);
  abi->end_step(abi->self, 2, &err);
  const keel_table_stats s = table.stats();
  std::printf("out [%lld, %lld], rows %lld, admitted %lld, evicted %lld\n",
              static_cast<long long>(out.size(0)), static_cast<long long>(out.size(1)),
              static_cast<long long>(s.rows), static_cast<long long>(s.admitted),
              static_cast<long long>(s.evicted));
  return out.size(0) == 2 && out.size(1) == 4 && s.rows == 0 && s.admitted == 2 && s.evicted == 2
             ? 0 : 1;
}
