// Checkpoint: the safetensors files of a model folder behind one name -> tensor lookup.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/json_reader.h"
#include "io/safetensors.h"

namespace serval::io {
namespace fs = std::filesystem;
namespace {

// A shard name from an index must stay inside the model folder: relative, no "..". The check
// is lexical on purpose: Hugging Face cache snapshots are symlinks into ../../blobs, which a
// check on the resolved path would refuse.
bool is_safe_relative(const std::string& name) {
  if (name.empty() || name.find('\0') != std::string::npos) return false;
  fs::path p(name);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory()) return false;
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& model_dir) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint(model_dir));
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    throw LoadError(fmt::format("{}: model folder does not exist or is not a folder", model_dir));
  }
  fs::path dir(model_dir);
  if (fs::path index = dir / "model.safetensors.index.json"; fs::exists(index, ec)) {
    ck->open_index(index.string());
  } else if (fs::path single = dir / "model.safetensors"; fs::exists(single, ec)) {
    ck->add_file(SafetensorsFile::open(single.string()));
  } else {
    std::vector<std::string> found;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) {
        found.push_back(e.path().string());
      }
    }
    if (ec) throw LoadError(fmt::format("{}: cannot list the folder: {}", model_dir, ec.message()));
    if (found.empty()) {
      throw LoadError(fmt::format(
          "{}: no model.safetensors.index.json, model.safetensors or *.safetensors file",
          model_dir));
    }
    std::sort(found.begin(), found.end());
    for (const std::string& f : found) ck->add_file(SafetensorsFile::open(f));
  }
  return ck;
}

void Checkpoint::add_file(std::unique_ptr<SafetensorsFile> f) {
  for (const TensorInfo& t : f->tensors()) {
    auto [it, inserted] = by_name_.emplace(t.name, &t);
    if (!inserted) {
      throw LoadError(fmt::format("{}: tensor '{}' is in both {} and {}", dir_, t.name,
                                  it->second->file, t.file));
    }
  }
  files_.push_back(std::move(f));
}

void Checkpoint::open_index(const std::string& index_path) {
  nlohmann::json index = parse_json(read_text_file(index_path), index_path);
  JsonReader r(index, index_path);
  const nlohmann::json* map = r.find("weight_map");
  if (!map) r.fail("weight_map", "is missing (required)");
  if (!map->is_object() || map->empty()) r.fail("weight_map", "must be a non-empty object");

  std::map<std::string, const SafetensorsFile*> shards;  // shard name -> opened file
  for (auto& [name, shard_json] : map->items()) {
    if (!shard_json.is_string()) {
      throw LoadError(fmt::format("{}: weight_map entry for tensor '{}' must be a string, got {}",
                                  index_path, name, json_type_name(shard_json)));
    }
    const std::string& shard = shard_json.get_ref<const std::string&>();
    auto it = shards.find(shard);
    if (it == shards.end()) {
      if (!is_safe_relative(shard)) {
        throw LoadError(
            fmt::format("{}: tensor '{}' is mapped to '{}', which is not a file "
                        "inside the model folder",
                        index_path, name, shard));
      }
      fs::path shard_path = fs::path(dir_) / shard;
      std::error_code ec;
      if (!fs::is_regular_file(shard_path, ec)) {
        throw LoadError(
            fmt::format("{}: tensor '{}' is mapped to shard '{}', but {} does not exist",
                        index_path, name, shard, shard_path.string()));
      }
      files_.push_back(SafetensorsFile::open(shard_path.string()));
      it = shards.emplace(shard, files_.back().get()).first;
    }
    const TensorInfo* t = it->second->find(name);
    if (!t) {
      throw LoadError(
          fmt::format("{}: tensor '{}' is mapped to shard '{}', but {} does not hold it",
                      index_path, name, shard, it->second->path()));
    }
    by_name_.emplace(name, t);
  }
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) throw LoadError(fmt::format("{}: checkpoint has no tensor '{}'", dir_, name));
  return *t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(name);
  return out;
}

}  // namespace serval::io
