// Small generated text corpora for training tests (no third-party data): varied sentences from
// a seeded linear congruential generator, one paragraph each, so a `text` dataset splits them
// into documents.
#pragma once

#include <cstdint>
#include <string>

namespace mm::test {

inline std::string make_corpus(uint64_t seed, int sentences = 600) {
  const char* subj[] = {"the cat", "a dog", "my neighbour", "the old sailor", "every child", "the robot"};
  const char* verb[] = {"likes", "paints", "watches", "remembers", "builds", "sells"};
  const char* obj[] = {"red apples", "the sea", "tall towers", "quiet songs", "small boats", "warm bread"};
  std::string s;
  uint64_t x = seed;
  for (int i = 0; i < sentences; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += std::string(subj[(x >> 33) % 6]) + " " + verb[(x >> 40) % 6] + " " + obj[(x >> 50) % 6] + ".\n\n";
  }
  return s;
}

}  // namespace mm::test
