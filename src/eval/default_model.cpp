#include "eval/default_model.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace tandem::eval {

namespace fs = std::filesystem;

std::vector<std::string> default_model_candidates(const std::string& source_dir, const char* file) {
  std::vector<std::string> out;
  if (const char* env = std::getenv("TANDEM_MODEL"); env != nullptr && *env != '\0') out.emplace_back(env);
  if (!source_dir.empty()) out.push_back((fs::path(source_dir) / "models" / file).string());
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);  // Linux; elsewhere only the first two apply
  if (!ec && !exe.empty()) {
    const fs::path bin_dir = exe.parent_path();
    out.push_back((bin_dir.parent_path() / "share" / "tandem" / "models" / file).lexically_normal().string());
    out.push_back((bin_dir.parent_path().parent_path() / "models" / file).lexically_normal().string());
  }
  return out;
}

std::string default_model_path(const std::string& source_dir, const char* file) {
  if (const char* env = std::getenv("TANDEM_MODEL"); env != nullptr && *env != '\0') {
    std::error_code ec;
    check(fs::is_regular_file(env, ec), std::string("TANDEM_MODEL is set to '") + env +
                                            "', which is not a file; unset it or point it to a GGUF file");
    return env;
  }
  const std::vector<std::string> candidates = default_model_candidates(source_dir, file);
  std::string tried;
  for (const std::string& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c;
    tried += "\n  " + c;
  }
  throw Error("no model given (-m) and the shipped model was not found; looked in:" + tried +
              "\npass -m MODEL.gguf, or set TANDEM_MODEL to a GGUF file");
}

}  // namespace tandem::eval
