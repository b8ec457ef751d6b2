// dataset component: tokens, next-token windows of a flat token file for language models.
//
// The token file (option `path`) is the layout of nanoGPT's train.bin and Modalities' packed
// data: token ids as raw little-endian uint16, or uint32, one after the other, no header. The
// vocabulary file beside it (option `vocab`, default vocab.json in the token file's directory;
// `keel prepare` writes both, see tools/cli/prepare.hpp for its format) gives the dtype and the
// vocabulary size. The token file is memory-mapped read-only and must not be truncated or
// rewritten while a run reads it.
//
// Splits: the file's N tokens are cut once, deterministically: "val" is the last
// floor(N * val_fraction) tokens, "train" the ones before them; the two never overlap.
// At construction the split's tokens (only those: the other split's dataset scans its own) are
// checked once to be below the vocabulary size.
//
// A sample is a window at offset o of the split (L tokens): inputs are tokens o .. o+context-1,
// targets tokens o+1 .. o+context (the inputs shifted by one), both int64 [batch_size, context].
// So a window reads context + 1 tokens and o ranges over 0 .. L - context - 1.
//  - sampling "sequential": window k starts at k * context (inputs do not overlap); an epoch
//    has W = floor((L - 1) / context) windows, the same every epoch.
//  - sampling "random": sample i of epoch e starts at
//      o = floor(draw(e, i) * (L - context) / 2^64),
//      draw(e, i) = mix(key(e) + (i + 1) * 0x9E3779B97F4A7C15),  key(e) = mix(seed + mix(e + 1)),
//    where mix is SplitMix64's finaliser and all arithmetic is modulo 2^64: a counter-based
//    generator of the run's seed and the epoch, so any sample is computed without drawing the
//    ones before it, and seek(epoch, batch) is exact. An epoch has samples_per_epoch samples
//    (0: W, the number of non-overlapping windows).
// With world_size R > 1, rank r takes the epoch's samples r, r + R, r + 2R, ... (so the R ranks'
// batch t together hold the samples of batch t of one rank with batch_size * R).
// Every batch is full: a rank's batches per epoch are floor(samples / (R * batch_size)), and
// the samples after the last full batch are dropped (the last partial batch is never yielded),
// so every step sees batch_size * context tokens. size() is the samples a rank's epoch yields
// (batches * batch_size); Batch.tokens is batch_size * context, the target tokens of the batch.
// The batch is "inputs" and "targets" (also through keel.dataset.batch/1).
//
// pack_documents = true (sampling "sequential" only) packs whole documents into the windows
// instead, as MindSpeed-LLM's packed data: a document is the tokens up to and including the
// next `separator` id (the split's last tokens are one too). A document of n tokens gives n - 1
// predictions (its tokens 0 .. n-2 as inputs, 1 .. n-1 as labels); one of more than context + 1
// tokens is cut into pieces of context predictions (a piece starts where the last one's labels
// end), and a document of one token gives none. In the split's order, each piece goes into the
// current window while it fits (context positions), else starts the next window. A batch
// (through keel.dataset.batch/1 only) holds, each int64 [batch_size, context]:
//   input_ids     the pieces' inputs, back to back, then 0s
//   labels        their labels; -100 (ignored) in the padding after the window's last piece
//   position_ids  each position within its piece (0 at each piece's start; 0 in the padding)
//   document_ids  0, 1, 2, ... the piece's index in the window; padding position p gets -1 - p
//                 (a document of its own), so that attention within a document never mixes
//                 documents (gpt's block-diagonal causal mask)
// An epoch has floor(windows / (R * batch_size)) batches; its sample g is window g with
// sampling "sequential", and with "random" window perm_e[g] of a permutation of all the windows
// drawn per epoch: Fisher-Yates, i = W-1 .. 1 swapping i with j = floor(draw(e, W-1-i) * (i+1)
// / 2^64) (draw and key as above), a function of (seed, e) alone, so seek stays exact (rank r
// takes samples r, r + R, ...). Batch.tokens counts the labels that are not -100.
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <endian.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "keel/plugin.hpp"

namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kPath = keel::opt_path(
    "path", nullptr,
    "the token file: raw little-endian uint16 or uint32 ids, no header (`keel "
    "prepare` writes one)");
constexpr auto kVocab = keel::opt_path(
    "vocab", "\"\"",
    "its vocabulary file, which gives dtype and size (\"\": vocab.json in the "
    "token file's directory)");
constexpr auto kContext = keel::opt_int(
    "context", "256", "tokens per sample (the targets are the next tokens)", 1, 1e9);
constexpr auto kBatchSize = keel::opt_int(
    "batch_size", "32", "samples per batch (a last partial batch is dropped)", 1, 1e9);
constexpr auto kSplit = keel::opt_string(
    "split", "\"train\"", "train: the tokens before the last val_fraction of the file; val: those",
    "train|val");
constexpr auto kValFraction = keel::opt_float(
    "val_fraction", "0.1", "the share of the file (its end) that is split val", 0, 1);
constexpr auto kSampling = keel::opt_string(
    "sampling", "\"random\"",
    "random: windows at offsets drawn from the run's seed and the epoch; "
    "sequential: consecutive non-overlapping windows",
    "random|sequential");
constexpr auto kSamplesPerEpoch = keel::opt_int(
    "samples_per_epoch", "0",
    "random sampling: windows per epoch (0: the split's non-overlapping windows)", 0, 1e15);
constexpr auto kPackDocuments = keel::opt_bool(
    "pack_documents", "false",
    "pack whole documents (ended by `separator`) into each window: a batch of input_ids, labels "
    "(-100 in the padding), position_ids restarting per document piece and document_ids, through "
    "keel.dataset.batch/1 (gpt attends within a document); sampling \"random\" takes the packed "
    "windows in an order shuffled per epoch");
constexpr auto kSeparator = keel::opt_int(
    "separator", "-1",
    "pack_documents: the token id that ends a document (-1: the vocabulary's \"separator\", "
    "which keel prepare --documents writes)", -1, 4294967295.0);

[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& hint) {
  throw std::runtime_error("tokens: " + path + ": " + what + "; hint: " + hint);
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

uint64_t mix(uint64_t z) {  // SplitMix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string file_kind(const struct stat& st) {
  return S_ISDIR(st.st_mode)                           ? "a directory"
         : S_ISFIFO(st.st_mode)                        ? "a FIFO"
         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                       : "a socket or other special file";
}

struct Vocab {
  int bytes = 2;        // 2: uint16, 4: uint32
  int64_t size = 0;     // token ids are 0 .. size - 1
  int64_t tokens = -1;  // the "tokens" count, when present
  int64_t separator = -1;  // the id that ends each document (keel prepare --documents), or -1
};

Vocab check_vocab(const nlohmann::json& j, const std::string& path, const std::string& hint);

// Reads and checks vocab.json (the keys the dataset needs; see tools/cli/prepare.hpp).
Vocab read_vocab(const std::string& path, const std::string& hint) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail(path, std::string("cannot open the vocabulary file (") + std::strerror(errno) + ")",
         hint);
  if (!S_ISREG(st.st_mode)) fail(path, "the vocabulary file is " + file_kind(st), hint);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot read the vocabulary file", hint);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("the vocabulary file is not valid JSON (") + e.what() + ")", hint);
  }
  try {
    return check_vocab(j, path, hint);
  } catch (const nlohmann::json::exception& e) {  // a key of the wrong type
    fail(path, std::string("malformed vocabulary (") + e.what() + ")", hint);
  }
}

Vocab check_vocab(const nlohmann::json& j, const std::string& path, const std::string& hint) {
  if (!j.is_object() || j.value("format", std::string()) != "keel-tokens")
    fail(path, "not a keel-tokens vocabulary (no \"format\": \"keel-tokens\")", hint);
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != 1)
    fail(path, "vocabulary \"version\" must be 1", hint);
  Vocab v;
  const std::string dtype = j.value("dtype", std::string());
  if (dtype == "uint16") v.bytes = 2;
  else if (dtype == "uint32") v.bytes = 4;
  else fail(path, "vocabulary \"dtype\" must be \"uint16\" or \"uint32\"", hint);
  if (!j.contains("size") || !j["size"].is_number_integer() || j["size"].get<int64_t>() < 1)
    fail(path, "vocabulary \"size\" must be an integer >= 1", hint);
  v.size = j["size"].get<int64_t>();
  if (v.bytes == 2 && v.size > 65536)
    fail(path, "vocabulary \"size\" " + std::to_string(v.size) + " does not fit uint16 ids",
         hint);
  if (j.contains("tokens") && j["tokens"].is_number_integer()) v.tokens = j["tokens"].get<int64_t>();
  if (j.contains("separator")) {
    if (!j["separator"].is_number_integer() || j["separator"].get<int64_t>() < 0 ||
        j["separator"].get<int64_t>() >= v.size)
      fail(path, "vocabulary \"separator\" must be a token id, 0 .. size - 1", hint);
    v.separator = j["separator"].get<int64_t>();
  }
  return v;
}

class Tokens : public keel::Dataset {
 public:
  explicit Tokens(const keel::Context& ctx)
      : path_(ctx.get(kPath)),
        context_(ctx.get(kContext)),
        batch_(ctx.get(kBatchSize)),
        random_(ctx.get(kSampling) == "random"),
        seed_(ctx.seed()),
        rank_(ctx.rank()),
        world_(ctx.world_size()),
        pack_(ctx.get(kPackDocuments)),
        separator_(ctx.get(kSeparator)) {
    const std::string split = ctx.get(kSplit), section = ctx.section();
    if (world_ < 1 || rank_ < 0 || rank_ >= world_)
      throw std::runtime_error("tokens: rank " + std::to_string(rank_) + " of world_size " +
                               std::to_string(world_) +
                               " is out of range; hint: the kernel must pass 0 <= rank < "
                               "world_size");
    std::string vocab_path = ctx.get(kVocab);
    if (vocab_path.empty())
      vocab_path = (std::filesystem::path(path_).parent_path() / "vocab.json").string();
    const Vocab vocab = read_vocab(
        vocab_path, "write it with `keel prepare TEXT --output DIR` or set [" + section +
                        "] vocab to the token file's vocabulary");
    bytes_ = vocab.bytes;
    const std::string hint = "set [" + section + "] path to a token file written by `keel "
                             "prepare` (raw little-endian " +
                             (bytes_ == 2 ? "uint16" : "uint32") + " ids, as " + vocab_path +
                             " says)";

    // Open and map the token file (read-only).
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
    if (fd < 0) fail(path_, std::string("cannot open the token file (") + std::strerror(errno) + ")", hint);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      fail(path_, std::string("cannot stat the token file (") + std::strerror(e) + ")", hint);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(path_, "the token file is " + file_kind(st) + ", not a regular file", hint);
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size % static_cast<uint64_t>(bytes_) != 0) {
      ::close(fd);
      fail(path_,
           "size " + std::to_string(size) + " bytes is not a multiple of " +
               std::to_string(bytes_) + " (" + (bytes_ == 2 ? "uint16" : "uint32") +
               " tokens, as " + vocab_path + " says)",
           "the file is truncated, or it and the vocabulary do not belong together: re-run "
           "`keel prepare`");
    }
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        fail(path_, std::string("cannot map the token file (") + std::strerror(e) + ")", hint);
      }
      map_ = p;
      map_size_ = size;
    }
    ::close(fd);  // the mapping keeps the file
    const int64_t n = static_cast<int64_t>(size / static_cast<uint64_t>(bytes_));

    // The split: "val" is the last floor(n * val_fraction) tokens, "train" the rest.
    const double fraction = ctx.get(kValFraction);
    const int64_t n_val = static_cast<int64_t>(static_cast<double>(n) * fraction);
    begin_ = split == "val" ? n - n_val : 0;
    length_ = split == "val" ? n_val : n - n_val;
    if (length_ < context_ + 1)
      fail(path_,
           "split '" + split + "' holds " + std::to_string(length_) + " tokens (of " +
               std::to_string(n) + ", val_fraction " + number(fraction) +
               "), too few for one window of context " + std::to_string(context_) + " (" +
               std::to_string(context_ + 1) + " tokens: the inputs and the next-token target)",
           "lower [" + section + "] context, adjust val_fraction, or use a longer token file");
    windows_ = (length_ - 1) / context_;

    const int64_t spe = ctx.get(kSamplesPerEpoch);
    if (pack_ && spe > 0)
      throw std::runtime_error("tokens: samples_per_epoch = " + std::to_string(spe) +
                               " does not apply to pack_documents = true, whose epochs take "
                               "every packed window once; hint: remove it from [" + section +
                               "]");
    if (!random_ && spe > 0)
      throw std::runtime_error("tokens: samples_per_epoch = " + std::to_string(spe) +
                               " applies to sampling = \"random\" only; hint: remove it from [" +
                               section + "], or set sampling = \"random\"");
    if (pack_) {
      if (separator_ < 0) separator_ = vocab.separator;  // keel prepare --documents wrote it
      if (separator_ < 0)
        throw std::runtime_error("tokens: pack_documents = true needs the id that ends a "
                                 "document, and " + vocab_path + " names none; hint: set [" +
                                 section + "] separator (e.g. the id of the end-of-text token), "
                                 "or write the data with `keel prepare TEXT --documents SEP`");
      if (separator_ >= vocab.size)
        fail(path_, "separator " + std::to_string(separator_) + " is outside the vocabulary of " +
                        std::to_string(vocab.size) + " ids (" + vocab_path + ")",
             "set [" + section + "] separator to a token id of the vocabulary");
      pack();
      if (random_) shuffle_windows();  // epoch 0 until start_epoch or seek
    }
    samples_ = pack_ ? static_cast<int64_t>(rows_.size()) : random_ && spe > 0 ? spe : windows_;
    batches_ = samples_ / world_ / batch_;
    if (batches_ == 0)
      throw std::runtime_error(
          "tokens: " + path_ + ": an epoch of split '" + split + "' has " +
          std::to_string(samples_) + (random_ ? " samples"
                                      : pack_ ? " windows of packed documents"
                                              : " windows of context " + std::to_string(context_)) +
          (world_ > 1 ? " shared by " + std::to_string(world_) + " ranks" : std::string()) +
          ", fewer than batch_size " + std::to_string(batch_) +
          (world_ > 1 ? " per rank" : "") + ", so it has no batch (the last partial batch is "
          "dropped); hint: lower batch_size or context" +
          (random_ ? std::string(", or raise samples_per_epoch") : std::string()));

    // Every token of the split must be a vocabulary id (checked once, here).
    const uint64_t limit = static_cast<uint64_t>(vocab.size);
    for (int64_t i = begin_; i < begin_ + length_; ++i)
      if (token(i) >= limit)
        fail(path_,
             "token " + std::to_string(i) + " is id " + std::to_string(token(i)) +
                 ", outside the vocabulary of " + std::to_string(vocab.size) + " ids (" +
                 vocab_path + ")",
             "the token file and the vocabulary do not belong together: re-run `keel prepare`, "
             "or set [" + section + "] vocab");
    if (vocab.tokens >= 0 && vocab.tokens != n)
      ctx.log(KEEL_LOG_WARN, path_ + " holds " + std::to_string(n) + " tokens, " + vocab_path +
                                 " says " + std::to_string(vocab.tokens) +
                                 " (a vocabulary shared by several token files, or a stale one)");
  }

  ~Tokens() override {
    if (map_ != nullptr) ::munmap(map_, map_size_);
  }
  Tokens(const Tokens&) = delete;
  Tokens& operator=(const Tokens&) = delete;

  int64_t size() override { return batches_ * batch_; }
  int64_t batches_per_epoch() override { return batches_; }
  // Packed windows hold fewer predictions than context (their padding): varies.
  int64_t tokens_per_sample() override { return pack_ ? 0 : context_; }

  void start_epoch(int64_t epoch) override { seek(epoch, 0); }
  // Stateless: batch t of epoch e is a function of (seed, e, t), so positioning is exact.
  void seek(int64_t epoch, int64_t batch) override {
    epoch_ = epoch;
    cursor_ = std::min(std::max<int64_t>(batch, 0), batches_);
    if (pack_ && random_) shuffle_windows();
  }

  bool next_batch(keel::NamedBatch& out) override {
    if (!pack_) {
      keel::Batch b;
      if (!next(b)) return false;
      out.tensors = {{"inputs", std::move(b.inputs)}, {"targets", std::move(b.targets)}};
      out.samples = b.samples;
      out.tokens = b.tokens;
      return true;
    }
    if (cursor_ >= batches_) return false;
    const auto longs = at::TensorOptions().dtype(at::kLong);
    at::Tensor ids = at::zeros({batch_, context_}, longs);
    at::Tensor labels = at::full({batch_, context_}, -100, longs);
    at::Tensor positions = at::zeros({batch_, context_}, longs);
    at::Tensor documents = at::empty({batch_, context_}, longs);
    int64_t* in = ids.data_ptr<int64_t>();
    int64_t* lab = labels.data_ptr<int64_t>();
    int64_t* pos = positions.data_ptr<int64_t>();
    int64_t* doc = documents.data_ptr<int64_t>();
    int64_t predictions = 0;
    for (int64_t row = 0; row < batch_; ++row) {
      const size_t sample = static_cast<size_t>((cursor_ * batch_ + row) * world_ + rank_);
      const size_t g = random_ ? order_[sample] : sample;  // the window
      const size_t last = g + 1 < rows_.size() ? rows_[g + 1] : pieces_.size();
      int64_t p = row * context_;
      for (size_t k = rows_[g]; k < last; ++k) {
        const Piece& piece = pieces_[k];
        for (int64_t j = 0; j < piece.length; ++j, ++p) {
          in[p] = static_cast<int64_t>(token(piece.start + j));
          lab[p] = static_cast<int64_t>(token(piece.start + j + 1));
          pos[p] = j;
          doc[p] = static_cast<int64_t>(k - rows_[g]);
        }
        predictions += piece.length;
      }
      for (; p < (row + 1) * context_; ++p) doc[p] = -1 - (p - row * context_);
    }
    ++cursor_;
    out.tensors = {{"input_ids", ids}, {"labels", labels}, {"position_ids", positions},
                   {"document_ids", documents}};
    out.samples = batch_;
    out.tokens = predictions;
    return true;
  }

  bool next(keel::Batch& out) override {
    if (pack_)
      throw std::runtime_error("tokens: pack_documents = true gives batches of named tensors "
                               "(keel.dataset.batch/1), which this keel does not ask for; hint: "
                               "a keel of ABI 1.12 with named batches, or pack_documents = false");
    if (cursor_ >= batches_) return false;
    const auto longs = at::TensorOptions().dtype(at::kLong);
    at::Tensor inputs = at::empty({batch_, context_}, longs);
    at::Tensor targets = at::empty({batch_, context_}, longs);
    int64_t* in = inputs.data_ptr<int64_t>();
    int64_t* tg = targets.data_ptr<int64_t>();
    const uint64_t key = mix(seed_ + mix(static_cast<uint64_t>(epoch_) + 1));
    for (int64_t row = 0; row < batch_; ++row) {
      // This rank's sample cursor_ * batch_ + row is the epoch's sample g.
      const uint64_t g = static_cast<uint64_t>((cursor_ * batch_ + row) * world_ + rank_);
      int64_t o = 0;
      if (random_) {
        const uint64_t d = mix(key + (g + 1) * 0x9E3779B97F4A7C15ull);
        o = static_cast<int64_t>((static_cast<unsigned __int128>(d) *
                                  static_cast<uint64_t>(length_ - context_)) >> 64);
      } else {
        o = static_cast<int64_t>(g) * context_;
      }
      const int64_t at = begin_ + o;
      for (int64_t j = 0; j < context_; ++j) {
        in[row * context_ + j] = static_cast<int64_t>(token(at + j));
        tg[row * context_ + j] = static_cast<int64_t>(token(at + j + 1));
      }
    }
    ++cursor_;
    out.inputs = std::move(inputs);
    out.targets = std::move(targets);
    out.samples = batch_;
    out.tokens = batch_ * context_;
    return true;
  }

 private:
  // The packed windows' order of epoch_ with sampling "random" (the top of the file).
  void shuffle_windows() {
    order_.resize(rows_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    const uint64_t key = mix(seed_ + mix(static_cast<uint64_t>(epoch_) + 1));
    for (size_t i = order_.size(); i-- > 1;) {
      const uint64_t d = mix(key + (order_.size() - 1 - i + 1) * 0x9E3779B97F4A7C15ull);
      const auto j = static_cast<size_t>((static_cast<unsigned __int128>(d) * (i + 1)) >> 64);
      std::swap(order_[i], order_[j]);
    }
  }

  // A document's piece: inputs tokens start .. start + length - 1, labels one further.
  struct Piece {
    int64_t start, length;
  };
  // The split's documents cut into pieces and packed into windows (see the top of the file).
  void pack() {
    int64_t used = context_;  // a full window: the first piece starts one
    const int64_t end = begin_ + length_;
    for (int64_t s = begin_, i = begin_; i < end; ++i) {
      if (static_cast<int64_t>(token(i)) != separator_ && i + 1 < end) continue;
      const int64_t n = i - s + 1;  // the document s .. i
      for (int64_t off = 0; off < n - 1; off += context_) {
        const int64_t m = std::min(context_, n - 1 - off);
        if (used + m > context_) {
          rows_.push_back(pieces_.size());
          used = 0;
        }
        pieces_.push_back({s + off, m});
        used += m;
      }
      s = i + 1;
    }
  }

  uint64_t token(int64_t i) const {
    if (bytes_ == 2) return le16toh(static_cast<const uint16_t*>(map_)[i]);
    return le32toh(static_cast<const uint32_t*>(map_)[i]);
  }

  std::string path_;
  int64_t context_, batch_;
  bool random_;
  uint64_t seed_;
  int64_t rank_, world_;
  bool pack_;
  int64_t separator_;
  std::vector<Piece> pieces_;  // pack_documents: every window's pieces, in order
  std::vector<size_t> rows_;   // the index in pieces_ of each window's first piece
  std::vector<size_t> order_;  // pack_documents with sampling "random": epoch_'s window order
  int bytes_ = 2;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  int64_t begin_ = 0, length_ = 0, windows_ = 0, samples_ = 0, batches_ = 0;
  int64_t epoch_ = 0, cursor_ = 0;
};

const keel_option_desc kOptions[] = {
    kPath, kVocab, kContext, kBatchSize, kSplit, kValFraction, kSampling, kSamplesPerEpoch,
    kPackDocuments, kSeparator,
};
const keel_component_desc kComponents[] = {
    keel::component<Tokens>("tokens",
                            "next-token windows of a memory-mapped flat token file (uint16 or "
                            "uint32 ids, as `keel prepare` writes)",
                            kOptions),
};

}  // namespace

KEEL_PLUGIN("keel-tokens", "0.1.0", "Language-model windows of flat token files", kComponents)
