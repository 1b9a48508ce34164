// A model folder with a fixture's weights and configs but no tokenizer files (links into the
// fixture), removed at the end of the test.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

namespace serval::testing {

class WeightsOnlyFolder {
 public:
  explicit WeightsOnlyFolder(const std::filesystem::path& fixture)
      : dir_(std::filesystem::temp_directory_path() /
             ("serval_weights_only_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (const char* name : {"config.json", "generation_config.json", "model.safetensors"})
      std::filesystem::create_symlink(fixture / name, dir_ / name);
  }
  ~WeightsOnlyFolder() { std::filesystem::remove_all(dir_); }
  WeightsOnlyFolder(const WeightsOnlyFolder&) = delete;
  WeightsOnlyFolder& operator=(const WeightsOnlyFolder&) = delete;
  std::string path() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace serval::testing
