#include "elf.hpp"

#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "keel/abi.h"

namespace keel {
namespace {

#if defined(__x86_64__)
constexpr int kMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kMachine = EM_AARCH64;
#elif defined(__powerpc64__)
constexpr int kMachine = EM_PPC64;
#elif defined(__riscv) && __riscv_xlen == 64
constexpr int kMachine = EM_RISCV;
#else
#error "elf.cpp: add this machine's e_machine"
#endif
static_assert(sizeof(void*) == 8, "elf.cpp reads 64-bit ELF files only");
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr int kData = ELFDATA2LSB;
#else
constexpr int kData = ELFDATA2MSB;
#endif

// Reads exactly `n` bytes at `offset` when they lie within the file.
bool read_at(int fd, uint64_t size, uint64_t offset, void* out, uint64_t n) {
  if (offset > size || n > size - offset) return false;
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return true;
}

}  // namespace

std::string elf_check_exports(int fd, const char* symbol) {
  struct stat st;
  if (fstat(fd, &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Elf64_Ehdr eh;
  if (!read_at(fd, size, 0, &eh, sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
    return "not an ELF file";
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != kData ||
      eh.e_machine != kMachine)
    return "an ELF file for another machine (class " + std::to_string(eh.e_ident[EI_CLASS]) +
           ", e_machine " + std::to_string(eh.e_machine) + ")";
  if (eh.e_type != ET_DYN) return "an ELF file but not a shared library";
  if (eh.e_shoff == 0 || eh.e_shnum == 0 || eh.e_shentsize != sizeof(Elf64_Shdr))
    return "a shared library without section headers (keel reads its dynamic symbol table "
           "from them)";
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  if (!read_at(fd, size, eh.e_shoff, sections.data(),
               static_cast<uint64_t>(eh.e_shnum) * sizeof(Elf64_Shdr)))
    return "a truncated ELF file (section headers beyond its end)";
  const std::string name = symbol;
  for (const Elf64_Shdr& sh : sections) {
    if (sh.sh_type != SHT_DYNSYM) continue;
    if (sh.sh_entsize != sizeof(Elf64_Sym) || sh.sh_link >= sections.size())
      return "a malformed dynamic symbol table";
    const Elf64_Shdr& strtab = sections[sh.sh_link];
    if (strtab.sh_offset > size || strtab.sh_size > size - strtab.sh_offset ||
        sh.sh_size > size)
      return "a truncated ELF file (dynamic symbols beyond its end)";
    std::vector<Elf64_Sym> syms(sh.sh_size / sizeof(Elf64_Sym));
    std::vector<char> strings(strtab.sh_size);
    if (!read_at(fd, size, sh.sh_offset, syms.data(), syms.size() * sizeof(Elf64_Sym)) ||
        !read_at(fd, size, strtab.sh_offset, strings.data(), strings.size()))
      return "a truncated ELF file (dynamic symbols beyond its end)";
    for (const Elf64_Sym& s : syms) {
      if (s.st_name >= strings.size() || s.st_shndx == SHN_UNDEF) continue;
      const unsigned bind = ELF64_ST_BIND(s.st_info);
      if (ELF64_ST_TYPE(s.st_info) != STT_FUNC || (bind != STB_GLOBAL && bind != STB_WEAK))
        continue;
      const char* n = strings.data() + s.st_name;
      const size_t max = strings.size() - s.st_name;
      if (strnlen(n, max) == name.size() && std::memcmp(n, name.data(), name.size()) == 0)
        return "";
    }
    return "its dynamic symbol table does not define " + name;
  }
  return "a shared library without a dynamic symbol table";
}

std::string elf_plugin_check(int fd) { return elf_check_exports(fd, KEEL_ENTRY_SYMBOL); }

}  // namespace keel
