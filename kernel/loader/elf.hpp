// Telling a keel plugin from any other file without running it.
//
// Discovery calls this before dlopen: a library is only ever opened when its ELF dynamic symbol
// table defines the entry symbol, so a stray library's constructors never run just because it
// sits in a plugin directory.
#pragma once

#include <string>

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

}  // namespace keel
