// `tandem tokenize`: placeholder until its issue lands (the owner replaces this file).
#include "commands.h"

namespace tandem::cli {

void add_tokenize_command(CLI::App& app) { (void)app; }

}  // namespace tandem::cli
