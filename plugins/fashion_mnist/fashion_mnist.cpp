// dataset component: fashion_mnist, read from the gzipped IDX files of the original release.
//
// The samples are loaded once at construction: images as float [N, 1, 28, 28] (pixels / 255,
// then (x - 0.2860) / 0.3530 when normalize), labels as int64 [N]. With limit N below the
// file's count, only the IDX headers and the first N images and labels are inflated: the
// truncation and corruption errors cover what is read, damage after the N-th image or label
// (a truncated or corrupt gzip stream, trailing data) goes undetected (bar a corrupt code or
// block header right after it, which zlib may decode: see GzReader), and so does damage among
// the samples read that still inflates, which only the gzip checksum of the whole file would
// show. With every sample read (limit 0, or at least the count), both files are read to their
// end and checked whole, checksum included. Shuffling uses a generator of its own seeded with
// seed + epoch * 1000003, so the order depends only on the run's seed and the epoch, never on
// the global generator.
//
// With world_size W > 1 each rank reads a shard, as torch.utils.data.DistributedSampler does:
// the epoch's order (shuffled, or 0..N-1) is padded by repeating its first elements
// (remainder "pad"), cut (remainder "drop") to a multiple of W, or left as is ("uneven"), and
// rank r takes its elements r, r + W, r + 2W, ... Every rank draws the same order, so the W
// ranks' batch t of batch_size B together hold positions t*B*W .. (t+1)*B*W - 1 of it: when
// W * B divides N, the samples of batch t of a single rank with batch_size B * W. With W = 1
// the shard is the whole order.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randperm.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "keel/plugin.hpp"

namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kPath = keel::opt_path(
    "path", "\"/usr/share/datasets/fashion-mnist\"", "directory holding the four *-ubyte.gz files");
constexpr auto kSplit = keel::opt_string("split", "\"train\"", "which split to read", "train|test");
constexpr auto kBatchSize = keel::opt_int("batch_size", "64", "samples per batch", 1, 1e9);
constexpr auto kShuffle = keel::opt_bool(
    "shuffle", "true", "reshuffle every epoch (seeded by the run's seed)");
constexpr auto kDropLast = keel::opt_bool("drop_last", "false", "drop the last, incomplete batch");
constexpr auto kNormalize = keel::opt_bool(
    "normalize", "true", "standardise pixels with mean 0.2860, std 0.3530");
constexpr auto kLimit = keel::opt_int(
    "limit", "0",
    "use only the first N samples (0: all); only those are read, so the files "
    "are not checked past them",
    0, 1e12);
constexpr auto kRemainder = keel::opt_string(
    "remainder", "\"auto\"",
    "how ranks share an epoch whose length world_size does not divide: pad "
    "(repeat the order's first samples), drop (leave its last ones out), uneven "
    "(shards differ by at most one sample: for evaluation); auto: pad for split "
    "train, uneven for split test",
    "auto|pad|drop|uneven");

constexpr int64_t kSide = 28;
constexpr uint32_t kImagesMagic = 2051, kLabelsMagic = 2049;
// Every error names the file, what is wrong with it, and how to fix it.
[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& hint) {
  throw std::runtime_error("fashion_mnist: " + path + ": " + what + "; " + hint);
}

// A file read from the start, inflated when it is gzip data (it starts with the gzip magic
// bytes 31 139; otherwise its bytes are read as they are), as zlib's gzread reads it: gzip
// members that follow one another are read as one stream, and bytes after the last member that
// do not start a gzip member are ignored. Unlike gzread, which inflates ahead into a buffer of
// its own, it inflates only up to the last byte asked for (zlib decodes at most the next code or
// block header after it), so damage after that byte is not met.
class GzReader {
 public:
  GzReader(const std::string& path, const std::string& hint) : path_(path), hint_(hint) {
    // Only regular files: opening a FIFO would block, a directory or device is a mistake.
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      fail(path, std::string("cannot open (") + std::strerror(errno) + ")", hint);
    if (!S_ISREG(st.st_mode))
      fail(path,
           std::string("is ") +
               (S_ISDIR(st.st_mode)    ? "a directory"
                : S_ISFIFO(st.st_mode) ? "a FIFO"
                : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                             : "not a regular file") +
               ", not a regular file",
           hint);
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, std::string("cannot open (") + std::strerror(errno) + ")", hint);
    if (inflateInit2(&z_, 15 + 16) != Z_OK) {
      ::close(fd_);
      corrupt("out of memory");
    }
    try {
      gzip_ = starts_member();
    } catch (...) {  // the destructor does not run for a constructor that throws
      inflateEnd(&z_);
      ::close(fd_);
      throw;
    }
  }
  ~GzReader() {
    inflateEnd(&z_);
    ::close(fd_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Appends up to `n` more bytes to `out`, fewer only at the end of the data; fails on
  // corrupt or truncated gzip data met on the way. `out` grows as data arrives (at most
  // doubling), never to a size only a file's header promises.
  void read(std::vector<uint8_t>& out, uint64_t n) {
    const size_t at = out.size();
    uint64_t got = 0;
    while (got < n && !done_) {
      const uint64_t step =
          std::min<uint64_t>({n - got, std::max<uint64_t>(got, 1 << 16), 1 << 30});
      out.resize(at + got + step);
      got += next(out.data() + at + got, static_cast<uInt>(step));
    }
    out.resize(at + got);
  }

  // Bytes from here to the end of the data, read and dropped.
  uint64_t skip_to_end() {
    std::vector<uint8_t> chunk(1 << 16);
    uint64_t total = 0;
    while (!done_) total += next(chunk.data(), static_cast<uInt>(chunk.size()));
    return total;
  }

 private:
  [[noreturn]] void corrupt(const std::string& why) {
    fail(path_, "corrupt or truncated gzip data (" + why + ")", hint_);
  }

  // Reads more of the file into the input buffer (after what is left of it); false at its end.
  bool fill() {
    if (eof_) return false;
    if (z_.avail_in > 0 && z_.next_in != in_.data())
      std::memmove(in_.data(), z_.next_in, z_.avail_in);
    z_.next_in = in_.data();
    ssize_t r = 0;
    do r = ::read(fd_, in_.data() + z_.avail_in, in_.size() - z_.avail_in);
    while (r < 0 && errno == EINTR);
    if (r < 0) corrupt(std::strerror(errno));
    if (r == 0) eof_ = true;
    z_.avail_in += static_cast<uInt>(r);
    return r > 0;
  }

  // Whether the input continues with a gzip member's magic bytes (reading them in if needed).
  bool starts_member() {
    while (z_.avail_in < 2 && fill()) {
    }
    return z_.avail_in >= 2 && z_.next_in[0] == 31 && z_.next_in[1] == 139;
  }

  // Up to `n` bytes into `to`, at least one unless the data ends (then done_).
  uint64_t next(uint8_t* to, uInt n) {
    if (!gzip_) {  // the file's bytes as they are
      if (z_.avail_in == 0 && !fill()) {
        done_ = true;
        return 0;
      }
      const uInt k = std::min(n, z_.avail_in);
      std::memcpy(to, z_.next_in, k);
      z_.next_in += k;
      z_.avail_in -= k;
      return k;
    }
    z_.next_out = to;
    z_.avail_out = n;
    while (z_.avail_out == n) {
      if (member_end_) {  // another member, or the end (bytes that follow are ignored)
        if (!starts_member()) {
          done_ = true;
          return 0;
        }
        inflateReset(&z_);
        member_end_ = false;
      }
      if (z_.avail_in == 0 && !fill()) corrupt("unexpected end of file");
      const int ret = inflate(&z_, Z_NO_FLUSH);
      if (ret == Z_MEM_ERROR) corrupt("out of memory");
      if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT || ret == Z_STREAM_ERROR)
        corrupt(z_.msg ? z_.msg : "compressed data error");
      if (ret == Z_STREAM_END) member_end_ = true;
    }
    return n - z_.avail_out;
  }

  std::string path_, hint_;
  int fd_ = -1;
  z_stream z_{};
  std::vector<uint8_t> in_ = std::vector<uint8_t>(1 << 16);
  bool gzip_ = false, eof_ = false, member_end_ = false, done_ = false;
};

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t{b[at]} << 24 | uint32_t{b[at + 1]} << 16 | uint32_t{b[at + 2]} << 8 | b[at + 3];
}

// Reads an IDX file of unsigned bytes: its header (checking the magic number), which it
// returns in `dims`, then the first `limit` records (all when limit is 0 or at least dims[0]),
// returning header and records. When it reads every record it checks the file's length against
// the header's extents and the whole gzip stream (its checksum included); when it reads fewer,
// it stops after the last record asked for, so nothing after it is checked: damage there
// (truncation, corrupt gzip data, a wrong checksum, trailing data) goes unnoticed.
std::vector<uint8_t> read_idx(const std::string& path, uint32_t magic, size_t ndims,
                              int64_t limit, std::vector<int64_t>& dims, const std::string& hint) {
  GzReader in(path, hint);
  std::vector<uint8_t> b;
  const uint64_t header = 4 * (1 + ndims);
  in.read(b, header);
  if (b.size() < header)
    fail(path, "truncated: " + std::to_string(b.size()) + " bytes, shorter than the IDX header",
         hint);
  if (be32(b, 0) != magic)
    fail(path,
         "wrong magic number " + std::to_string(be32(b, 0)) + " (expected " +
             std::to_string(magic) + "), not an IDX file of this kind",
         hint);
  uint64_t expected = 1;
  dims.clear();
  for (size_t i = 0; i < ndims; ++i) {
    dims.push_back(be32(b, 4 + 4 * i));
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(dims.back()), &expected))
      fail(path, "the header's extents overflow", hint);
  }
  const uint64_t count = static_cast<uint64_t>(dims[0]);
  const uint64_t record = count > 0 ? expected / count : 0;
  const bool all = limit <= 0 || static_cast<uint64_t>(limit) >= count;
  in.read(b, all ? expected : static_cast<uint64_t>(limit) * record);
  expected += header;
  // Short of what was asked: the data ended there, so b.size() is the file's whole length.
  if (b.size() < (all ? expected : header + static_cast<uint64_t>(limit) * record))
    fail(path, "truncated: " + std::to_string(b.size()) + " bytes where the header implies " +
                   std::to_string(expected),
         hint);
  if (all) {
    const uint64_t more = in.skip_to_end();
    if (more > 0)
      fail(path,
           "trailing data: " + std::to_string(b.size() + more) +
               " bytes where the header implies " + std::to_string(expected),
           hint);
  }
  return b;
}

class FashionMnist : public keel::Dataset {
 public:
  explicit FashionMnist(const keel::Context& ctx)
      : batch_(ctx.get(kBatchSize)),
        shuffle_(ctx.get(kShuffle)),
        drop_last_(ctx.get(kDropLast)),
        seed_(ctx.seed()),
        rank_(ctx.rank()),
        world_(ctx.world_size()) {
    if (world_ < 1 || rank_ < 0 || rank_ >= world_)
      throw std::runtime_error("fashion_mnist: rank " + std::to_string(rank_) + " of world_size " +
                               std::to_string(world_) +
                               " is out of range; hint: the kernel must pass 0 <= rank < "
                               "world_size");
    const std::string dir = ctx.get(kPath), split = ctx.get(kSplit);
    const std::string stem = dir + "/" + (split == "train" ? "train" : "t10k");
    std::vector<int64_t> idims, ldims;
    const std::string ipath = stem + "-images-idx3-ubyte.gz",
                      lpath = stem + "-labels-idx1-ubyte.gz";
    const std::string hint = "hint: install dataset-fashion-mnist or set [" + ctx.section() +
                             "] path to the directory holding the *-ubyte.gz files";
    const int64_t limit = ctx.get(kLimit);
    std::vector<uint8_t> ibytes = read_idx(ipath, kImagesMagic, 3, limit, idims, hint);
    std::vector<uint8_t> lbytes = read_idx(lpath, kLabelsMagic, 1, limit, ldims, hint);
    if (idims[1] != kSide || idims[2] != kSide)
      fail(ipath,
           "images are " + std::to_string(idims[1]) + "x" + std::to_string(idims[2]) +
               ", expected 28x28",
           hint);
    if (idims[0] == 0) fail(ipath, "holds no images", hint);
    if (idims[0] != ldims[0])
      fail(lpath,
           std::to_string(ldims[0]) + " labels for " + std::to_string(idims[0]) + " images in " +
               ipath,
           hint);

    n_ = limit > 0 ? std::min(limit, idims[0]) : idims[0];
    auto u8 = at::TensorOptions().dtype(at::kByte);
    images_ = at::from_blob(ibytes.data() + 16, {n_, 1, kSide, kSide}, u8).to(at::kFloat).div_(255);
    if (ctx.get(kNormalize)) images_.sub_(0.2860).div_(0.3530);
    labels_ = at::from_blob(lbytes.data() + 8, {n_}, u8).to(at::kLong);
    if (labels_.max().item<int64_t>() > 9) fail(lpath, "a label is outside 0..9", hint);

    // The padded or cut order holds `total_` positions; this rank's are rank, rank + W, ...
    std::string remainder = ctx.get(kRemainder);
    if (remainder == "auto") remainder = split == "train" ? "pad" : "uneven";
    total_ = remainder == "pad"    ? (n_ + world_ - 1) / world_ * world_
             : remainder == "drop" ? n_ / world_ * world_
                                   : n_;
    shard_ = total_ > rank_ ? (total_ - rank_ + world_ - 1) / world_ : 0;
    if (batches_per_epoch() == 0) {
      std::string what = "split '" + split + "' has " + std::to_string(n_) + " samples";
      if (world_ > 1)
        what += "; rank " + std::to_string(rank_) + " of world_size " + std::to_string(world_) +
                " gets " + std::to_string(shard_) + " of them (remainder = \"" + remainder + "\")";
      if (shard_ == 0)
        throw std::runtime_error("fashion_mnist: " + what +
                                 ", so an epoch has no batch on that rank; hint: use at least " +
                                 std::to_string(world_) +
                                 " samples (raise limit) or set remainder = \"pad\"");
      throw std::runtime_error("fashion_mnist: " + what + ", fewer than batch_size " +
                               std::to_string(batch_) + " with drop_last = true, so an epoch has " +
                               (world_ > 1 ? "no batch on that rank" : "no batch") +
                               "; hint: lower batch_size, raise limit or set drop_last = false");
    }
  }

  // This rank's samples and batches per epoch.
  int64_t size() override { return shard_; }
  int64_t batches_per_epoch() override {
    return drop_last_ ? shard_ / batch_ : (shard_ + batch_ - 1) / batch_;
  }

  void start_epoch(int64_t epoch) override {
    cursor_ = 0;
    if (views()) return;
    const auto longs = at::TensorOptions().dtype(at::kLong);
    at::Tensor order;
    if (shuffle_) {
      auto gen =
          at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch) * 1000003u);
      order = at::randperm(n_, gen, longs);
    } else {
      order = at::arange(n_, longs);
    }
    // remainder "pad": the order's first elements again (cyclically, when W > n).
    if (total_ > n_) order = order.repeat({(total_ + n_ - 1) / n_});
    order_ = order.slice(0, rank_, total_, world_);
  }

  // Where start_epoch(epoch) and `batch` calls of next leave the dataset (resume).
  void seek(int64_t epoch, int64_t batch) override {
    start_epoch(epoch);
    cursor_ = std::min(shard_, batch * batch_);
  }
  // Batches are views of the loaded data when not shuffling on a single rank: do not modify
  // them in place.
  bool next(keel::Batch& out) override {
    if (!views() && !order_.defined()) start_epoch(0);
    const int64_t rows = std::min(batch_, shard_ - cursor_);
    if (rows <= 0 || (drop_last_ && rows < batch_)) return false;
    if (!views()) {
      const at::Tensor idx = order_.slice(0, cursor_, cursor_ + rows);
      out.inputs = images_.index_select(0, idx);
      out.targets = labels_.index_select(0, idx);
    } else {
      out.inputs = images_.slice(0, cursor_, cursor_ + rows);
      out.targets = labels_.slice(0, cursor_, cursor_ + rows);
    }
    cursor_ += rows;
    out.samples = out.tokens = rows;
    return true;
  }

 private:
  // The shard is 0..n-1 in order: batches are slices of the loaded data.
  bool views() const { return !shuffle_ && world_ == 1; }

  int64_t batch_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int64_t rank_, world_;
  int64_t n_ = 0, total_ = 0, shard_ = 0, cursor_ = 0;
  at::Tensor images_, labels_, order_;  // order_: this rank's shard of the epoch's order
};

const keel_option_desc kOptions[] = {
    kPath, kSplit, kBatchSize, kShuffle, kDropLast, kNormalize, kLimit, kRemainder,
};
const keel_component_desc kComponents[] = {
    keel::component<FashionMnist>("fashion_mnist", "Fashion-MNIST 28x28 grayscale, 10 classes",
                                  kOptions),
};

}  // namespace

KEEL_PLUGIN("keel-fashion-mnist", "0.1.0", "The Fashion-MNIST dataset (IDX files)", kComponents)
