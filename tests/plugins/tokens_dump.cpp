// Drives the `tokens` dataset (plugins/tokens) through keel/testing.hpp for tests/plugins/test_tokens.py:
// loads the built plugin with dlopen, creates the dataset with the options given, positions it
// and writes the batches it yields.
//
// Usage: tokens_dump PLUGIN.so OUT.bin [--seed N] [--rank R] [--world W] [--epoch E] [--seek B]
//                    [--batches K] KEY=VALUE...
// KEY=VALUE are the dataset's options: VALUE is an integer when it reads as one, else a float
// when it reads as one, else a string. The dataset starts epoch E (default 0) with start_epoch,
// or with seek(E, B) when --seek is given, and yields up to K batches (default: to the end of
// the epoch). OUT.bin receives each batch's inputs then its targets (int64, this machine's byte
// order, row-major); stdout gets one JSON line: {"size": .., "batches_per_epoch": ..,
// "tokens_per_sample": .., "batches": [[samples, tokens, rows, columns], ...]}.
// Any failure prints its message on stderr and exits 1. `tokens_dump --batch` runs many cases
// (tests/plugins/probe.hpp).
#include "keel/testing.hpp"

#include "probe.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

namespace tokens_dump {

keel::testing::Value parse_value(const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(v.c_str(), &end, 10);
  if (!v.empty() && *end == '\0' && errno == 0) return static_cast<int64_t>(i);
  const double d = std::strtod(v.c_str(), &end);
  if (!v.empty() && *end == '\0') return d;
  return v;
}

std::string run(int argc, char** argv) {
  if (argc < 3) throw std::runtime_error("usage: tokens_dump PLUGIN.so OUT.bin [flags] KEY=VALUE...");
  const keel_plugin_descriptor* descriptor = probe::open_plugin(argv[1]);

  keel::testing::Setup setup;
  keel::testing::Options options;
  int64_t epoch = 0, seek = -1, limit = -1;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return std::stoll(argv[++i]);
    };
    if (a == "--seed") setup.seed = static_cast<uint64_t>(value());
    else if (a == "--rank") setup.rank = static_cast<int32_t>(value());
    else if (a == "--world") setup.world_size = static_cast<int32_t>(value());
    else if (a == "--epoch") epoch = value();
    else if (a == "--seek") seek = value();
    else if (a == "--batches") limit = value();
    else if (a.find('=') != std::string::npos)
      options.emplace_back(a.substr(0, a.find('=')), parse_value(a.substr(a.find('=') + 1)));
    else throw std::runtime_error("unknown argument " + a);
  }

  keel::testing::Plugin plugin(descriptor);
  {
    auto data = plugin.create<keel_dataset>("tokens", options, setup);
    const int64_t size = data.call(data->size);
    const int64_t batches = data.call(data->batches_per_epoch);
    const int64_t tps = data.call(data->tokens_per_sample);
    if (seek >= 0) data.call(data->seek, epoch, seek);
    else data.call(data->start_epoch, epoch);
    std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
    std::string shapes;
    for (int64_t k = 0; limit < 0 || k < limit; ++k) {
      keel_batch b{};
      int has = 0;
      data.call(data->next, &b, &has);
      if (!has) break;
      const at::Tensor in = keel::adopt(b.inputs), tg = keel::adopt(b.targets);
      for (const at::Tensor& t : {in, tg}) {
        if (t.scalar_type() != at::kLong || t.dim() != 2)
          throw std::runtime_error("a batch tensor is not int64 [batch, context]");
        const at::Tensor c = t.contiguous();
        out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
      }
      if (in.sizes() != tg.sizes()) throw std::runtime_error("inputs and targets differ in shape");
      shapes += std::string(shapes.empty() ? "" : ", ") + "[" + std::to_string(b.samples) + ", " +
                std::to_string(b.tokens) + ", " + std::to_string(in.size(0)) + ", " +
                std::to_string(in.size(1)) + "]";
    }
    if (!out.flush()) throw std::runtime_error(std::string("cannot write ") + argv[2]);
    // The plugin stays loaded: no dlclose while LibTorch may hold its pointers.
    return probe::format(
        "{\"size\": %lld, \"batches_per_epoch\": %lld, \"tokens_per_sample\": %lld, "
        "\"batches\": [%s]}\n",
        static_cast<long long>(size), static_cast<long long>(batches),
        static_cast<long long>(tps), shapes.c_str());
  }
}

int entry(int argc, char** argv) { return probe::main_guard(run, argc, argv); }

}  // namespace tokens_dump
