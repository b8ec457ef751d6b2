// What this header held now lives in files/files.hpp (the file-system layer: read_file, durable
// writes and renames) and checkpoint/checksum.hpp (hash_file, hash_string, hash_text). It
// includes both for kernel/trainer.cpp, which still names it; it goes once that include does.
#pragma once

#include "checkpoint/checksum.hpp"
#include "files/files.hpp"
