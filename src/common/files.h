#pragma once
// Opening the files a user names (checkpoints, configs, tokenizers) so that anything but a regular
// file is a clear error naming the path: a directory read as a stream gave "basic_filebuf::underflow"
// or std::bad_alloc, and a FIFO blocked the open for good.
#include <string>

namespace gptoss {

// A read-only descriptor of `path` (the caller closes it), or gptoss::Error "PATH: is a directory",
// "PATH: not a regular file", "PATH: cannot open (reason)". The open never waits for a writer.
int open_regular_file(const std::string& path);

// The whole of a regular file, with the same errors.
std::string read_regular_file(const std::string& path);

}  // namespace gptoss
