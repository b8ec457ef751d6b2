#include "sealed_copy.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "files/files.hpp"
#include "unique_fd.hpp"

namespace keel {
namespace {

// Raises RLIMIT_FSIZE so that `size` bytes can be written, for its lifetime (sealed_copy).
class FileSizeLimitAtLeast {
 public:
  explicit FileSizeLimitAtLeast(off_t size) {
    if (getrlimit(RLIMIT_FSIZE, &old_) != 0 || old_.rlim_cur == RLIM_INFINITY ||
        static_cast<rlim_t>(size) <= old_.rlim_cur)
      return;
    struct rlimit raised = old_;
    raised.rlim_cur = old_.rlim_max;
    if (old_.rlim_max != RLIM_INFINITY && static_cast<rlim_t>(size) > old_.rlim_max)
      raised.rlim_cur = raised.rlim_max = RLIM_INFINITY;  // needs CAP_SYS_RESOURCE
    if (setrlimit(RLIMIT_FSIZE, &raised) == 0)
      changed_ = true;
    else
      short_by_ = true;
  }
  ~FileSizeLimitAtLeast() {
    if (changed_) setrlimit(RLIMIT_FSIZE, &old_);
  }
  FileSizeLimitAtLeast(const FileSizeLimitAtLeast&) = delete;
  FileSizeLimitAtLeast& operator=(const FileSizeLimitAtLeast&) = delete;

  // Why the limit stays too low, or "".
  std::string problem(off_t size) const {
    if (!short_by_) return "";
    return fmt::format("cannot copy it into memory: it is {} KiB, over the file size limit of "
                       "{} KiB (ulimit -f), which this process may not raise; hint: raise "
                       "`ulimit -f` to at least its size",
                       size / 1024, old_.rlim_max / 1024);
  }

 private:
  struct rlimit old_ {};
  bool changed_ = false;
  bool short_by_ = false;
};

// Copies every byte of `from` into `to` (empty, at offset 0): in the kernel with sendfile(2), no
// buffer of ours in between, or through read_chunks where sendfile refuses the pair; "" or why
// not.
std::string copy_all(int from, int to) {
  off_t offset = 0;
  for (;;) {
    const ssize_t n = sendfile(to, from, &offset, size_t{1} << 30);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EINVAL || errno == ENOSYS)) break;
    if (n < 0) return std::string("cannot copy it into memory: ") + std::strerror(errno);
    if (n == 0) return "";
  }
  const char* failed = "cannot read it: ";
  try {
    read_chunks(from, "it", [&](const char* data, size_t size) {
      if (write_all(to, data, size)) return;
      failed = "cannot copy it into memory: ";
      throw FileError("writing", "it", errno);
    }, offset);
  } catch (const FileError& e) {
    return failed + std::string(std::strerror(e.code()));
  }
  return "";
}

}  // namespace

int sealed_copy(int fd, const std::string& name, bool path_checked, std::string* error) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *error = std::string("cannot stat it: ") + std::strerror(errno);
    return -1;
  }
  const FileSizeLimitAtLeast limit(st.st_size);
  if (std::string why = limit.problem(st.st_size); !why.empty()) {
    if (path_checked) {
      const int same = fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (same >= 0) {
        spdlog::debug("{}: loaded from the file itself, not a sealed copy: {}", name,
                      why.substr(0, why.find("; hint: ")));
        return same;
      }
    }
    *error = std::move(why);
    return -1;
  }
  UniqueFd mfd(memfd_create(name.substr(0, 200).c_str(), MFD_ALLOW_SEALING | MFD_CLOEXEC));
  if (mfd.get() < 0) {
    *error = std::string("cannot make a sealed copy of it (memfd_create: ") +
             std::strerror(errno) + ")";
    return -1;
  }
  if (std::string bad = copy_all(fd, mfd.get()); !bad.empty()) {
    *error = std::move(bad);
    return -1;
  }
  if (fcntl(mfd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL)) {
    *error = std::string("cannot seal its copy: ") + std::strerror(errno);
    return -1;
  }
  return mfd.release();
}

}  // namespace keel
