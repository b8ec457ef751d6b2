// libFuzzer target: the ELF check of discovery (kernel/loader/elf.cpp), which reads every
// candidate plugin file, trusted or not, before anything loads it, and the reading of its
// dynamic section (DT_NEEDED, DT_RUNPATH, DT_RPATH, DT_SONAME) for its dependencies.
//
// Input: a file's bytes, written to a memfd. The check must return (a reason or "") without
// reading out of bounds; "" only for a file that really holds a 64-bit ELF header (checked
// here again), so that a plain input never passes as a plugin.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "loader/elf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("fuzz_elf", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  const std::string why = keel::elf_plugin_check(fd);
  keel::ElfDynamic dyn;
  const std::string dyn_why = keel::elf_read_dynamic(fd, &dyn);
  close(fd);
  if (dyn_why.find('\n') != std::string::npos) {
    std::fprintf(stderr, "fuzz_elf: a reason of several lines: %s\n", dyn_why.c_str());
    std::abort();
  }
  if (why.empty() && (size < 64 || std::memcmp(data, "\x7f" "ELF", 4) != 0)) {
    std::fprintf(stderr, "fuzz_elf: accepted an input without an ELF header\n");
    std::abort();
  }
  if (!why.empty() && why.find('\n') != std::string::npos) {
    std::fprintf(stderr, "fuzz_elf: a reason of several lines: %s\n", why.c_str());
    std::abort();
  }
  return 0;
}
