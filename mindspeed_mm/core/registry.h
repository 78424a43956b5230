// A registry maps string ids to factories: models, datasets, collators, optimizers, LR schedules.
// Registrations run from static initialisers; the map lives in a function-local static so that
// order of initialisation never matters. Our library is an OBJECT library linked straight into
// every executable, so no registrar object is dropped by the linker (tests/unit/test_registry.cpp
// checks the built-in ids are present).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mindspeed_mm/core/errors.h"

namespace mm {

template <class Factory>
class Registry {
 public:
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  void add(const std::string& id, Factory f) {
    if (entries_.count(id)) throw Error(cat(kind_, " registry: id '", id, "' registered twice"));
    entries_[id] = std::move(f);
  }
  bool has(const std::string& id) const { return entries_.count(id) > 0; }

  // Throws ConfigError naming the known ids when `id` is unknown.
  const Factory& get(const std::string& id, const std::string& key = "") const {
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      std::string known;
      for (auto& [k, _] : entries_) known += (known.empty() ? "" : ", ") + k;
      throw ConfigError(cat("config: ", key.empty() ? kind_ : key, ": unknown ", kind_, " id '", id,
                            "' (known: ", known, ")"));
    }
    return it->second;
  }
  std::vector<std::string> ids() const {
    std::vector<std::string> out;
    for (auto& [k, _] : entries_) out.push_back(k);
    return out;
  }
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  std::map<std::string, Factory> entries_;
};

// Registers at static-initialisation time: static Registrar r(registry(), "id", factory);
struct Registrar {
  template <class R, class F>
  Registrar(R& reg, const std::string& id, F f) {
    reg.add(id, std::move(f));
  }
};

}  // namespace mm
