// Packed documents (the tokens dataset's pack_documents, gpt's forward over input_ids,
// position_ids and document_ids, the token losses over labels; all through keel/ext/batch.h):
// the windows hold the documents as plugins/tokens/tokens.cpp's header says (pieces, labels,
// -100 padding, positions restarting, document ids); gpt's logits for each packed document
// equal its logits run alone within 1e-5 (packed: the reference attention with a block-diagonal
// causal mask; alone: the fused attention), and the packed loss and its gradients equal the
// token-weighted mean of the documents' losses run alone within 1e-5; a manifest trains with
// it; random sampling takes the packed windows in an order shuffled per epoch, a function of
// the seed and the epoch; pack_documents without a separator, with samples_per_epoch or with
// the chunked loss is one error line.
#include <ATen/TensorOperators.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "run/model_calls.hpp"
#include "support.hpp"

namespace unit_packed_documents {

using keel_test::TempDir;
namespace fs = std::filesystem;

namespace {

// Four documents, each ended by id 0: A (3 predictions), B (2), C (9: pieces of 6 and 3 with
// context 6), D (1). Windows of 6: [A B], [C's first piece], [C's second piece, D].
const std::vector<uint16_t> kDocA = {5, 6, 7, 0}, kDocB = {3, 4, 0},
                            kDocC = {9, 10, 11, 12, 13, 14, 15, 1, 2, 0}, kDocD = {8, 0};
constexpr int64_t kVocab = 16, kContext = 6;

fs::path write_tokens(const TempDir& d) {
  std::vector<uint16_t> all;
  for (const auto* doc : {&kDocA, &kDocB, &kDocC, &kDocD})
    all.insert(all.end(), doc->begin(), doc->end());
  const fs::path p = d.path / "tokens.bin";
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(all.data()),
             static_cast<std::streamsize>(all.size() * sizeof(uint16_t)));
  d.write("vocab.json", "{\"format\": \"keel-tokens\", \"version\": 1, \"dtype\": \"uint16\", "
                        "\"size\": " + std::to_string(kVocab) + "}");
  return p;
}

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}
at::Tensor ids(std::vector<int64_t> v) {
  const auto n = static_cast<int64_t>(v.size());
  return at::tensor(v, at::kLong).reshape({1, n});
}
double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(at::kDouble) - b.detach().to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("packed documents: the windows, gpt's logits and the loss equal the documents alone") {
  TempDir d;
  const fs::path tokens = write_tokens(d);
  keel_options data_values, model_values, loss_values;
  const auto data = keel_test::first_party<keel_dataset>(
      KEEL_KIND_DATASET, "tokens", "data.train",
      "path = \"" + tokens.string() + "\"\ncontext = 6\nbatch_size = 1\nval_fraction = 0.0\n"
      "sampling = \"sequential\"\npack_documents = true\nseparator = 0\n", data_values);
  const keel::DataSource source = keel::with_batches(data);
  REQUIRE(source.named != nullptr);
  CHECK(data->batches_per_epoch(data.self()) == 3);

  const at::Device cpu(at::kCPU);
  data.call("start_epoch", data->start_epoch, int64_t{0});
  std::vector<keel::MicroBatch> rows(3);
  for (auto& row : rows) REQUIRE(keel::next_batch(source, cpu, &row) == keel::NextResult::kBatch);
  keel::MicroBatch past;
  CHECK(keel::next_batch(source, cpu, &past) == keel::NextResult::kEnd);

  using V = std::vector<int64_t>;
  const auto& r0 = rows[0].tensors;
  REQUIRE(r0.size() == 4);
  CHECK(values(*keel::find(r0, "input_ids")) == V{5, 6, 7, 3, 4, 0});
  CHECK(values(*keel::find(r0, "labels")) == V{6, 7, 0, 4, 0, -100});
  CHECK(values(*keel::find(r0, "position_ids")) == V{0, 1, 2, 0, 1, 0});
  CHECK(values(*keel::find(r0, "document_ids")) == V{0, 0, 0, 1, 1, -6});
  CHECK(values(*keel::find(rows[1].tensors, "input_ids")) == V{9, 10, 11, 12, 13, 14});
  CHECK(values(*keel::find(rows[1].tensors, "labels")) == V{10, 11, 12, 13, 14, 15});
  const auto& r2 = rows[2].tensors;
  CHECK(values(*keel::find(r2, "input_ids")) == V{15, 1, 2, 8, 0, 0});
  CHECK(values(*keel::find(r2, "labels")) == V{1, 2, 0, 0, -100, -100});
  CHECK(values(*keel::find(r2, "position_ids")) == V{0, 1, 2, 0, 0, 0});
  CHECK(values(*keel::find(r2, "document_ids")) == V{0, 0, 0, 1, -5, -6});
  CHECK(rows[0].tokens == 5);  // the labels that count
  CHECK(rows[1].tokens == 6);
  CHECK(rows[2].tokens == 4);

  const auto model = keel_test::first_party<keel_model>(
      KEEL_KIND_MODEL, "gpt", "model",
      "vocab_size = 16\ncontext = 6\nlayers = 2\nheads = 2\nwidth = 16\n", model_values);
  const auto loss = keel_test::first_party<keel_loss>(KEEL_KIND_LOSS, "token_cross_entropy",
                                                      "loss", "", loss_values);
  const keel::ModelCalls gpt = keel::with_batches(model);
  const keel::LossCalls ce = keel::with_batches(loss);
  REQUIRE(gpt.named != nullptr);
  REQUIRE(ce.named != nullptr);

  // Each document alone, as a 1.x batch of inputs and targets (positions from 0, causal mask).
  struct Alone {
    size_t row;
    int64_t at;
    V inputs, targets;
  };
  const Alone alone[] = {{0, 0, {5, 6, 7}, {6, 7, 0}},
                         {0, 3, {3, 4}, {4, 0}},
                         {1, 0, {9, 10, 11, 12, 13, 14}, {10, 11, 12, 13, 14, 15}},
                         {2, 0, {15, 1, 2}, {1, 2, 0}},
                         {2, 3, {8}, {0}}};
  std::vector<at::Tensor> packed_logits;
  for (const auto& row : rows) packed_logits.push_back(keel::forward(gpt, row).at(0).second);
  for (const Alone& a : alone) {
    CAPTURE(a.row);
    CAPTURE(a.at);
    keel::MicroBatch mb;
    mb.tensors = {{"inputs", ids(a.inputs)}, {"targets", ids(a.targets)}};
    mb.samples = 1;
    const at::Tensor logits = keel::forward(gpt, mb).at(0).second;
    const auto n = static_cast<int64_t>(a.inputs.size());
    const double diff = max_diff(packed_logits[a.row].slice(1, a.at, a.at + n), logits);
    MESSAGE("document at window " << a.row << " position " << a.at << ": max |logit diff| "
                                  << diff);
    CHECK(diff <= 1e-5);
  }

  // Window 0's loss and gradients against the token-weighted mean of A's and B's alone.
  auto gradients = [&] {
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < model->param_count(model.self()); ++i) {
      const char* name = nullptr;
      keel_tensor* t = nullptr;
      model.call("param", model->param, i, &name, &t);
      const at::Tensor p = keel::borrow(t);
      out.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    return out;
  };
  int64_t count = 0;
  const at::Tensor packed =
      keel::compute_loss(ce, keel::forward(gpt, rows[0]), rows[0], &count, true);
  CHECK(count == 5);
  CHECK(keel::count_items(ce, rows[0]) == 5);
  packed.backward();
  const std::vector<at::Tensor> packed_grads = gradients();
  at::Tensor separate;
  for (const Alone& a : {alone[0], alone[1]}) {
    keel::MicroBatch mb;
    mb.tensors = {{"inputs", ids(a.inputs)}, {"targets", ids(a.targets)}};
    mb.samples = 1;
    int64_t n = 0;
    at::Tensor l = keel::compute_loss(ce, keel::forward(gpt, mb), mb, &n, true);
    l = l * (static_cast<double>(n) / 5.0);
    separate = separate.defined() ? separate + l : l;
  }
  separate.backward();
  const std::vector<at::Tensor> separate_grads = gradients();
  MESSAGE("loss packed " << packed.item<double>() << ", documents alone "
                         << separate.item<double>());
  CHECK(std::abs(packed.item<double>() - separate.item<double>()) <= 1e-5);
  double grad_diff = 0;
  for (size_t i = 0; i < packed_grads.size(); ++i)
    grad_diff = std::max(grad_diff, max_diff(packed_grads[i], separate_grads[i]));
  MESSAGE("max |gradient diff| " << grad_diff);
  CHECK(grad_diff <= 1e-5);
}

TEST_CASE("random sampling takes the packed windows in an order of the seed and the epoch") {
  TempDir d;
  const fs::path tokens = write_tokens(d);
  const at::Device cpu(at::kCPU);
  // Epoch e's first input ids of each window, with the seed given.
  auto order = [&](uint64_t seed, const std::string& sampling, int64_t epoch) {
    keel_options values;
    const auto data = keel_test::first_party<keel_dataset>(
        KEEL_KIND_DATASET, "tokens", "data.train",
        "path = \"" + tokens.string() + "\"\ncontext = 6\nbatch_size = 1\nval_fraction = 0.0\n"
        "sampling = \"" + sampling + "\"\npack_documents = true\nseparator = 0\n", values, seed);
    const keel::DataSource source = keel::with_batches(data);
    data.call("seek", data->seek, epoch, int64_t{0});
    std::vector<int64_t> firsts;
    keel::MicroBatch mb;
    while (keel::next_batch(source, cpu, &mb) == keel::NextResult::kBatch)
      firsts.push_back(keel::find(mb.tensors, "input_ids")->select(1, 0).item<int64_t>());
    return firsts;
  };
  const std::vector<int64_t> sequential = order(1, "sequential", 0);
  CHECK(sequential == std::vector<int64_t>{5, 9, 15});
  std::vector<std::vector<int64_t>> seen;
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    CAPTURE(epoch);
    std::vector<int64_t> o = order(7, "random", epoch);
    CHECK(o == order(7, "random", epoch));  // the same for the same seed and epoch
    std::vector<int64_t> sorted = o;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == sequential);  // every window once
    seen.push_back(o);
  }
  std::sort(seen.begin(), seen.end());
  CHECK(std::unique(seen.begin(), seen.end()) - seen.begin() > 1);  // epochs differ
}

TEST_CASE("a manifest trains gpt on packed documents; a bad pack_documents is one error line") {
  TempDir d;
  const fs::path tokens = write_tokens(d);
  const std::string body =
      "[run]\nname = \"packed\"\noutput_dir = \"" + (d.path / "run").string() + "\"\nseed = 2\n"
      "[train]\nepochs = 2\nlog_every = 1\n"
      "[model]\ntype = \"gpt\"\nvocab_size = 16\ncontext = 6\nlayers = 1\nheads = 2\nwidth = 8\n"
      "[data.train]\ntype = \"tokens\"\npath = \"" + tokens.string() + "\"\ncontext = 6\n"
      "batch_size = 1\nval_fraction = 0.0\nsampling = \"sequential\"\npack_documents = true\n"
      "separator = 0\n"
      "[optimizer]\ntype = \"adamw\"\nlr = 0.01\n"
      "[loss]\ntype = \"token_cross_entropy\"\n"
      "[[hooks]]\ntype = \"jsonl\"\n";
  keel_test::train(d.write("m.toml", body));
  std::vector<double> tokens_so_far;
  for (const auto& r : keel_test::jsonl(d.path / "run" / "metrics.jsonl"))
    if (r["split"] == "train") tokens_so_far.push_back(r["tokens"].get<double>());
  // 3 windows an epoch, each one step, counting its labels: 5, 6 and 4.
  CHECK(tokens_so_far == std::vector<double>{5, 11, 15, 20, 26, 30});

  struct Case {
    const char* set;
    const char* error;
  };
  const Case cases[] = {
      {"data.train.separator=-1",
       "tokens: pack_documents = true needs the id that ends a document, and "},
      {"data.train.separator=-1", "vocab.json names none; hint: set [data.train] separator (e.g. "
       "the id of the end-of-text token), or write the data with `keel prepare TEXT --documents "
       "SEP`"},
      {"data.train.samples_per_epoch=3",
       "tokens: samples_per_epoch = 3 does not apply to pack_documents = true"},
      {"data.train.separator=16", "separator 16 is outside the vocabulary of 16 ids"},
      // The chunked loss's training path reads the 1.x names (docs/language-model.md).
      {"loss.type=\"chunked_cross_entropy\"",
       "forward_features reads the batch's 'inputs', which [data.train] dataset 'tokens'"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.set);
    const std::string error = keel_test::error_of([&] {
      keel_test::train(d.path / "m.toml",
                       {c.set, "run.output_dir=\"" + (d.path / "bad").string() + "\""});
    });
    CAPTURE(error);
    CHECK(error.find(c.error) != std::string::npos);
    CHECK(error.find('\n') == std::string::npos);
  }
}

}  // namespace unit_packed_documents
