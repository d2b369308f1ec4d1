// The tspemu command line as a library call, for the program's main() and the app tests.
// Exit codes: 0 success; 1 a runtime failure or a failed check; 2 a bad configuration (the
// message names the flag and the constraint) or a command-line error.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tspemu::app {

// args: the command line without the program name.
int tspemu_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace tspemu::app
