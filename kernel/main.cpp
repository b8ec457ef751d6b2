// The `keel` executable: its command line is keel::cli_main (tools/cli/cli_main.cpp).
#include "cli/cli_main.hpp"

int main(int argc, char** argv) { return keel::cli_main(argc, argv); }
