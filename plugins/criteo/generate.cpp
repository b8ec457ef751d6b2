// keel-criteo-generate: writes Criteo-format windows from a known ground-truth click model and
// states the Bayes-optimal AUC and log loss of the data it wrote (docs/recommendation.md,
// "Data", "The generator").
//
//   keel-criteo-generate --output DIR [--windows N] [--records M] [--seed S] [--zstd]
//                        [--dim D] [--probabilities]
//
// The ground truth (every number drawn from --seed alone, by a counter-based generator, so the
// files are the same on every machine and window w does not depend on --windows):
//  - 26 categorical features C1..C26, each with a cardinality n_j and a Zipf exponent s_j: the
//    id of rank r (1..n_j) is drawn with probability proportional to r^-s_j; some features are
//    missing at a rate m_j (an empty field). Rank r of feature j is written as the 8 hex digits
//    of a bijection of r in 32 bits, so ids look hashed and never collide within a feature.
//  - 13 integers I1..I13: floor(exp(mu_i + sigma_i * N(0,1))) (I2 minus 2, so it can be
//    negative), missing at a rate; the model's input is v_i = log(1 + max(x, 0)), 0 if missing.
//  - a hidden embedding e_j(r) in R^dim, N(0, emb_std^2) per coordinate, per (feature, id);
//    a per-id scalar effect b_j(r) = tau_j * N(0,1) / sqrt(1 + r / 3) (frequent ids carry
//    most of the signal).
//  - logit = bias + sum_i w_i * (v_i - c_i) / d_i + sum_j b_j(id_j) + sum over `pairs` (a, b)
//    of <e_a(id_a), e_b(id_b)>, a missing feature contributing 0; label ~ Bernoulli(sigmoid).
// Files: DIR/day_000.tsv (or .tsv.zst with --zstd), ..., each written as a dotfile and renamed
// (so a `follow` reader never sees half a file); DIR/truth.json last: the parameters above, and
// per window and over all windows the records, the click rate, the Bayes AUC (the exact AUC of
// the true probabilities against the written labels, ties counted half) and the Bayes log loss
// (the mean of -log of the true probability of the written label). With --probabilities, also
// DIR/probabilities/day_000.txt, ...: each record's true probability, one per line ("%.17g").
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int kNumeric = 13, kCategorical = 26;

uint64_t mix(uint64_t z) {  // SplitMix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t key(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}
double uniform(uint64_t k) { return (static_cast<double>(mix(k) >> 11) + 0.5) * 0x1.0p-53; }
double normal(uint64_t k) {  // Box-Muller of two uniforms of k
  return std::sqrt(-2 * std::log(uniform(k))) * std::cos(2 * M_PI * uniform(k ^ 0x5bd1e995ull));
}

// A sequential stream of uniforms (one window's draws).
struct Stream {
  uint64_t k, n = 0;
  double next() { return uniform(k + 0x632BE59BD9B4E019ull * ++n); }
  double gauss() { return normal(k + 0x632BE59BD9B4E019ull * ++n); }
};

struct Categorical {
  int64_t cardinality;
  double exponent, missing, tau;
  std::vector<double> cdf;  // of ranks 1..n
};
struct Numeric {
  double mu, sigma, missing, weight, center, scale;
};

struct Truth {
  uint64_t seed;
  int dim;
  double bias = -1.2, emb_std = 0.45;
  std::vector<Categorical> cat;
  std::vector<Numeric> num;
  std::vector<std::pair<int, int>> pairs;
};

Truth make_truth(uint64_t seed, int dim) {
  Truth t{seed, dim, -1.2, 0.45, {}, {}, {}};
  t.pairs = {{0, 4}, {7, 10}, {14, 20}, {1, 18}};  // features of at most 100 ids
  const int64_t card[kCategorical] = {40,  100, 300, 1000, 20,  200, 600, 80, 400,
                                      1000, 50,  150, 500, 800,  30,  250, 700, 1000,
                                      60,   120, 25,  350, 900, 500,  70,  200};
  const double expo[5] = {1.2, 1.3, 1.1, 1.4, 1.25};
  for (int j = 0; j < kCategorical; ++j) {
    Categorical c;
    c.cardinality = card[j];
    c.exponent = expo[j % 5];
    c.missing = j == 20 ? 0.4 : (j % 6 == 5 ? 0.2 : 0.0);
    c.tau = j < 10 ? 0.8 : (j < 16 ? 0.4 : 0.0);
    double sum = 0;
    for (int64_t r = 1; r <= c.cardinality; ++r) c.cdf.push_back(sum += std::pow(r, -c.exponent));
    for (double& v : c.cdf) v /= sum;
    t.cat.push_back(std::move(c));
  }
  const double weight[kNumeric] = {0.4, -0.3, 0.25, 0.2, -0.15, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < kNumeric; ++i) {
    Numeric n;
    n.mu = 0.5 + 0.25 * (i % 7);
    n.sigma = 0.8 + 0.1 * (i % 4);
    n.missing = i % 4 == 3 ? 0.3 : 0.05;
    n.weight = weight[i];
    n.center = n.mu;  // about the mean of log(1 + x)
    n.scale = n.sigma;
    t.num.push_back(n);
  }
  return t;
}

// Hidden per-(feature, rank) numbers, from the seed alone.
double effect(const Truth& t, int j, int64_t r) {
  const Categorical& c = t.cat[static_cast<size_t>(j)];
  if (c.tau == 0) return 0;
  return c.tau * normal(key(t.seed, 1, static_cast<uint64_t>(j), static_cast<uint64_t>(r))) /
         std::sqrt(1.0 + static_cast<double>(r) / 3.0);
}
double embedding(const Truth& t, int j, int64_t r, int k) {
  return t.emb_std * normal(key(t.seed, 2 + static_cast<uint64_t>(k), static_cast<uint64_t>(j),
                                static_cast<uint64_t>(r)));
}
uint32_t hashed_id(const Truth& t, int j, int64_t r) {  // a bijection of r in 32 bits
  const uint32_t offset = static_cast<uint32_t>(key(t.seed, 9, static_cast<uint64_t>(j)));
  return static_cast<uint32_t>(r) * 0x9E3779B1u + offset;
}

struct Window {
  std::string text;
  std::vector<double> p;
  std::vector<int> y;
};

Window make_window(const Truth& t, int w, int64_t records) {
  Window out;
  Stream s{key(t.seed, 100, static_cast<uint64_t>(w))};
  char buf[32];
  std::vector<int64_t> rank(kCategorical);
  for (int64_t i = 0; i < records; ++i) {
    double logit = t.bias;
    std::string fields;
    for (int k = 0; k < kNumeric; ++k) {
      const Numeric& n = t.num[static_cast<size_t>(k)];
      const double g = s.gauss(), m = s.next();
      if (m < n.missing) {
        fields += '\t';
        continue;
      }
      int64_t x = static_cast<int64_t>(std::floor(std::exp(n.mu + n.sigma * g)));
      if (k == 1) x -= 2;
      const double v = std::log1p(static_cast<double>(std::max<int64_t>(x, 0)));
      logit += n.weight * (v - n.center) / n.scale;
      fields += '\t' + std::to_string(x);
    }
    for (int j = 0; j < kCategorical; ++j) {
      const Categorical& c = t.cat[static_cast<size_t>(j)];
      const double u = s.next(), m = s.next();
      if (m < c.missing) {
        rank[static_cast<size_t>(j)] = 0;
        fields += '\t';
        continue;
      }
      const int64_t r = std::upper_bound(c.cdf.begin(), c.cdf.end() - 1, u) - c.cdf.begin() + 1;
      rank[static_cast<size_t>(j)] = r;
      logit += effect(t, j, r);
      std::snprintf(buf, sizeof buf, "\t%08x", hashed_id(t, j, r));
      fields += buf;
    }
    for (const auto& [a, b] : t.pairs) {
      const int64_t ra = rank[static_cast<size_t>(a)], rb = rank[static_cast<size_t>(b)];
      if (ra == 0 || rb == 0) continue;
      for (int k = 0; k < t.dim; ++k) logit += embedding(t, a, ra, k) * embedding(t, b, rb, k);
    }
    const double p = 1 / (1 + std::exp(-logit));
    const int y = s.next() < p ? 1 : 0;
    out.text += (y ? "1" : "0") + fields + '\n';
    out.p.push_back(p);
    out.y.push_back(y);
  }
  return out;
}

// The exact AUC of scores p against labels y, ties counted half (midranks); NaN without both
// classes.
double exact_auc(const std::vector<double>& p, const std::vector<int>& y) {
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  double rank_sum = 0, pos = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && p[order[j]] == p[order[i]]) ++j;
    const double mid = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (size_t k = i; k < j; ++k)
      if (y[order[k]]) rank_sum += mid, pos += 1;
    i = j;
  }
  const double neg = static_cast<double>(p.size()) - pos;
  if (pos == 0 || neg == 0) return std::nan("");
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

nlohmann::ordered_json stats(const std::vector<double>& p, const std::vector<int>& y) {
  double loss = 0, clicks = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    loss -= std::log(y[i] ? p[i] : 1 - p[i]);
    clicks += y[i];
  }
  const double n = static_cast<double>(p.size());
  nlohmann::ordered_json j;
  j["records"] = p.size();
  j["click_rate"] = clicks / n;
  const double auc = exact_auc(p, y);
  j["bayes_auc"] = std::isnan(auc) ? nlohmann::ordered_json() : nlohmann::ordered_json(auc);
  j["bayes_log_loss"] = loss / n;
  return j;
}

void write_published(const std::filesystem::path& path, const std::string& data) {
  const std::filesystem::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp");
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr || std::fwrite(data.data(), 1, data.size(), f) != data.size() ||
      std::fclose(f) != 0)
    throw std::runtime_error(tmp.string() + ": cannot write (" + std::strerror(errno) +
                             "); hint: choose a writable --output with free space");
  std::filesystem::rename(tmp, path);
}

std::string compressed(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  if (ZSTD_isError(n)) throw std::runtime_error(std::string("zstd: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

nlohmann::ordered_json parameters(const Truth& t) {
  nlohmann::ordered_json j;
  j["bias"] = t.bias;
  j["dim"] = t.dim;
  j["embedding_std"] = t.emb_std;
  j["effect_scale"] = "tau * N(0,1) / sqrt(1 + rank / 3)";
  for (int k = 0; k < kNumeric; ++k) {
    const Numeric& n = t.num[static_cast<size_t>(k)];
    j["numeric"].push_back({{"name", "I" + std::to_string(k + 1)}, {"mu", n.mu},
                            {"sigma", n.sigma}, {"missing", n.missing}, {"weight", n.weight},
                            {"center", n.center}, {"scale", n.scale}});
  }
  for (int k = 0; k < kCategorical; ++k) {
    const Categorical& c = t.cat[static_cast<size_t>(k)];
    j["categorical"].push_back({{"name", "C" + std::to_string(k + 1)},
                                {"cardinality", c.cardinality}, {"exponent", c.exponent},
                                {"missing", c.missing}, {"tau", c.tau}});
  }
  for (const auto& [a, b] : t.pairs)
    j["pairs"].push_back({"C" + std::to_string(a + 1), "C" + std::to_string(b + 1)});
  return j;
}

struct Args {
  std::string output;
  int64_t windows = 8, records = 250000;
  uint64_t seed = 0;
  int dim = 4;
  bool zstd = false, probabilities = false;
};

const char* kUsage =
    "usage: keel-criteo-generate --output DIR [--windows N (8)] [--records M (250000)] "
    "[--seed S (0)] [--zstd] [--dim D (4)] [--probabilities]";

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
      return argv[++i];
    };
    auto number = [&](int64_t lo, int64_t hi) {
      const std::string v = value();
      size_t used = 0;
      int64_t n = 0;
      try {
        n = std::stoll(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || n < lo || n > hi)
        throw std::invalid_argument(f + " " + v + ": not an integer in [" + std::to_string(lo) +
                                    ", " + std::to_string(hi) + "]");
      return n;
    };
    if (f == "--output" || f == "-o") a.output = value();
    else if (f == "--windows") a.windows = number(1, 1000);
    else if (f == "--records") a.records = number(1, 100000000);
    else if (f == "--seed") a.seed = static_cast<uint64_t>(number(0, INT64_MAX));
    else if (f == "--dim") a.dim = static_cast<int>(number(1, 64));
    else if (f == "--zstd") a.zstd = true;
    else if (f == "--probabilities") a.probabilities = true;
    else if (f == "--help" || f == "-h") {
      std::printf("%s\n", kUsage);
      std::exit(0);
    } else throw std::invalid_argument(f + ": unknown argument");
  }
  if (a.output.empty()) throw std::invalid_argument("needs --output DIR");
  return a;
}

int run(const Args& a) {
  namespace fs = std::filesystem;
  const Truth t = make_truth(a.seed, a.dim);
  fs::create_directories(a.output);
  if (a.probabilities) fs::create_directories(fs::path(a.output) / "probabilities");
  nlohmann::ordered_json truth;
  truth["format"] = "keel-criteo-truth";
  truth["version"] = 1;
  truth["seed"] = a.seed;
  truth["windows"] = a.windows;
  truth["records_per_window"] = a.records;
  std::vector<double> all_p;
  std::vector<int> all_y;
  for (int64_t w = 0; w < a.windows; ++w) {
    char name[32];
    std::snprintf(name, sizeof name, "day_%03lld.tsv", static_cast<long long>(w));
    const std::string file = std::string(name) + (a.zstd ? ".zst" : "");
    const Window win = make_window(t, static_cast<int>(w), a.records);
    write_published(fs::path(a.output) / file, a.zstd ? compressed(win.text) : win.text);
    if (a.probabilities) {
      std::string text;
      char buf[40];
      for (const double p : win.p) text.append(buf, std::snprintf(buf, sizeof buf, "%.17g\n", p));
      std::snprintf(name, sizeof name, "day_%03lld.txt", static_cast<long long>(w));
      write_published(fs::path(a.output) / "probabilities" / name, text);
    }
    nlohmann::ordered_json s = {{"file", file}};
    s.update(stats(win.p, win.y));
    truth["per_window"].push_back(s);
    all_p.insert(all_p.end(), win.p.begin(), win.p.end());
    all_y.insert(all_y.end(), win.y.begin(), win.y.end());
    std::printf("%s: %lld records, Bayes AUC %.4f\n", file.c_str(),
                static_cast<long long>(a.records), s["bayes_auc"].is_null() ? NAN : s["bayes_auc"].get<double>());
  }
  truth["overall"] = stats(all_p, all_y);
  truth["parameters"] = parameters(t);
  write_published(fs::path(a.output) / "truth.json", truth.dump(1) + "\n");
  std::printf("%s/truth.json: overall Bayes AUC %.4f, Bayes log loss %.4f\n", a.output.c_str(),
              truth["overall"]["bayes_auc"].is_null() ? NAN : truth["overall"]["bayes_auc"].get<double>(),
              truth["overall"]["bayes_log_loss"].get<double>());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "keel-criteo-generate: %s; hint: %s\n", e.what(), kUsage);
    return 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-criteo-generate: %s\n", e.what());
    return 1;
  }
}
