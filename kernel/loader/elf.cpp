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

// Reads the ELF header of a shared object for this machine into `eh`, and the file's size.
std::string read_header(int fd, uint64_t* size, Elf64_Ehdr* eh) {
  struct stat st;
  if (fstat(fd, &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
  *size = static_cast<uint64_t>(st.st_size);
  if (!read_at(fd, *size, 0, eh, sizeof *eh) || std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0)
    return "not an ELF file";
  if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != kData ||
      eh->e_machine != kMachine)
    return "an ELF file for another machine (class " + std::to_string(eh->e_ident[EI_CLASS]) +
           ", e_machine " + std::to_string(eh->e_machine) + ")";
  if (eh->e_type != ET_DYN) return "an ELF file but not a shared library";
  return "";
}

std::vector<std::string> split_path_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t colon = s.find(':', start);
    out.push_back(s.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) return out;
    start = colon + 1;
  }
}

}  // namespace

std::string elf_check_exports(int fd, const char* symbol) {
  uint64_t size = 0;
  Elf64_Ehdr eh;
  if (std::string bad = read_header(fd, &size, &eh); !bad.empty()) return bad;
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

std::string elf_read_dynamic(int fd, ElfDynamic* out) {
  *out = ElfDynamic();
  uint64_t size = 0;
  Elf64_Ehdr eh;
  if (std::string bad = read_header(fd, &size, &eh); !bad.empty()) return bad;
  if (eh.e_phoff == 0 || eh.e_phnum == 0 || eh.e_phentsize != sizeof(Elf64_Phdr))
    return "a shared library without program headers";
  std::vector<Elf64_Phdr> segments(eh.e_phnum);
  if (!read_at(fd, size, eh.e_phoff, segments.data(),
               static_cast<uint64_t>(eh.e_phnum) * sizeof(Elf64_Phdr)))
    return "a truncated ELF file (program headers beyond its end)";
  const Elf64_Phdr* dynamic = nullptr;
  for (const Elf64_Phdr& ph : segments)
    if (ph.p_type == PT_DYNAMIC) {
      if (dynamic) return "a malformed ELF file (two PT_DYNAMIC program headers)";
      dynamic = &ph;
    }
  if (!dynamic) return "";  // no dynamic section: no dependencies
  if (dynamic->p_filesz > size) return "a truncated ELF file (dynamic section beyond its end)";
  std::vector<Elf64_Dyn> entries(dynamic->p_filesz / sizeof(Elf64_Dyn));
  if (!read_at(fd, size, dynamic->p_offset, entries.data(), entries.size() * sizeof(Elf64_Dyn)))
    return "a truncated ELF file (dynamic section beyond its end)";
  uint64_t strtab = 0, strsz = 0;
  bool have_strtab = false, have_strsz = false;
  size_t end = entries.size();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].d_tag == DT_NULL) {
      end = i;
      break;
    }
    if (entries[i].d_tag == DT_STRTAB) strtab = entries[i].d_un.d_ptr, have_strtab = true;
    if (entries[i].d_tag == DT_STRSZ) strsz = entries[i].d_un.d_val, have_strsz = true;
  }
  bool any_string = false;
  for (size_t i = 0; i < end; ++i) {
    const auto tag = entries[i].d_tag;
    any_string |= tag == DT_NEEDED || tag == DT_RUNPATH || tag == DT_RPATH || tag == DT_SONAME;
  }
  if (!any_string) return "";
  if (!have_strtab || !have_strsz) return "a malformed dynamic section (no string table)";
  // The string table's file offset: through the PT_LOAD segment whose file bytes hold it.
  uint64_t strtab_offset = 0;
  bool mapped = false;
  for (const Elf64_Phdr& ph : segments) {
    if (ph.p_type != PT_LOAD || strtab < ph.p_vaddr || strtab - ph.p_vaddr >= ph.p_filesz)
      continue;
    if (strsz > ph.p_filesz - (strtab - ph.p_vaddr)) break;
    strtab_offset = ph.p_offset + (strtab - ph.p_vaddr);
    mapped = strtab_offset >= ph.p_offset;  // no overflow
    break;
  }
  if (!mapped || strtab_offset > size || strsz > size - strtab_offset)
    return "a malformed dynamic section (its string table lies outside the file's segments)";
  std::vector<char> strings(strsz);
  if (!read_at(fd, size, strtab_offset, strings.data(), strings.size()))
    return "a truncated ELF file (dynamic string table beyond its end)";
  for (size_t i = 0; i < end; ++i) {
    const auto tag = entries[i].d_tag;
    if (tag != DT_NEEDED && tag != DT_RUNPATH && tag != DT_RPATH && tag != DT_SONAME) continue;
    const uint64_t at = entries[i].d_un.d_val;
    if (at >= strings.size() || strnlen(strings.data() + at, strings.size() - at) ==
                                    strings.size() - at)
      return "a malformed dynamic section (a string beyond its string table)";
    const std::string text(strings.data() + at);
    if (tag == DT_NEEDED) {
      if (text.empty()) return "a malformed dynamic section (an empty DT_NEEDED)";
      out->needed.push_back(text);
    } else if (tag == DT_SONAME) {
      out->soname = text;
    } else {
      auto& list = tag == DT_RUNPATH ? out->runpath : out->rpath;
      for (auto& item : split_path_list(text)) list.push_back(std::move(item));
      if (tag == DT_RUNPATH) out->has_runpath = true;
    }
  }
  return "";
}

}  // namespace keel
