// Telling a keel plugin from any other file without running it.
//
// Discovery calls this before dlopen: a library is only ever opened when its ELF dynamic symbol
// table defines the entry symbol, so a stray library's constructors never run just because it
// sits in a plugin directory.
#pragma once

#include <string>
#include <vector>

namespace keel {

// "" when the file open at `fd` is an ELF shared object for this machine (class, byte order and
// e_machine of the running keel) whose dynamic symbol table (.dynsym) defines `symbol` as a
// global or weak function; otherwise why not, as a phrase ("not an ELF file", "an ELF file for
// another machine (e_machine 183)", "its dynamic symbol table does not define
// keel_plugin_entry"). Only reads the file (pread), with every offset checked against its size;
// never maps or runs it.
std::string elf_check_exports(int fd, const char* symbol);

// elf_check_exports(fd, KEEL_ENTRY_SYMBOL).
std::string elf_plugin_check(int fd);

// What the dynamic loader reads from a library's dynamic section to find its dependencies.
struct ElfDynamic {
  std::vector<std::string> needed;   // DT_NEEDED, in order
  std::vector<std::string> runpath;  // DT_RUNPATH split at ':' (entries as written, $ORIGIN too)
  std::vector<std::string> rpath;    // DT_RPATH split at ':' (the loader ignores it with RUNPATH)
  bool has_runpath = false;
  std::string soname;                // DT_SONAME, or ""
};

// Reads the dynamic section of the ELF shared object open at `fd` the way the dynamic loader
// finds it: the PT_DYNAMIC program header, and its string table (DT_STRTAB, DT_STRSZ) through
// the PT_LOAD segment that maps it. "" and `*out` filled, or why not, as a phrase. Like
// elf_check_exports, only reads (pread) with every offset and size checked against the file.
std::string elf_read_dynamic(int fd, ElfDynamic* out);

}  // namespace keel
