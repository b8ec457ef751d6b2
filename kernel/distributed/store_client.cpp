#include "distributed/store_client.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdint>
#include <vector>

#include "distributed/impl.hpp"
#include "distributed/process_group.hpp"
#include "error.hpp"

namespace keel {

// What the client needs of the group, copied: the writer thread that uses it may outlive the
// group's own use of it.
struct StoreClient::Impl {
  ProcessGroup::Impl facts;  // launch and timeout, for failure(); pg unused
  c10::intrusive_ptr<c10d::Store> store;

  template <class F>
  void guarded(const std::string& what, F&& body) const {
    facts.guarded(what, std::forward<F>(body));
  }
};

StoreClient::StoreClient(ProcessGroup& group) : impl_(std::make_unique<Impl>()) {
  const ProcessGroup::Impl& g = group.impl();
  Impl& d = *impl_;
  d.facts.launch = g.launch;
  d.facts.timeout = g.timeout;
  d.guarded("connecting the checkpoint writer to the rendezvous store", [&] {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(g.launch.master_port);
    so.isServer = false;
    so.waitWorkers = false;
    so.timeout = g.timeout;
    d.store = c10::make_intrusive<c10d::PrefixStore>(
        g.store_prefix, c10::make_intrusive<c10d::TCPStore>(g.launch.master_addr, so));
  });
}

StoreClient::~StoreClient() = default;

void StoreClient::set(const std::string& key, const std::string& value,
                      const std::string& what) {
  impl_->guarded(what, [&] {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  });
}

std::string StoreClient::get(const std::string& key, const std::string& what) {
  std::string out;
  impl_->guarded(what, [&] {
    const std::vector<uint8_t> got = impl_->store->get(key);  // waits up to the timeout
    out.assign(got.begin(), got.end());
  });
  return out;
}

}  // namespace keel
