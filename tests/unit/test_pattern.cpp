// Module-path pattern matcher: table-driven cases for indices, ranges, lists, globs, '?', '**'.
#include <gtest/gtest.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/pattern.h"

namespace {

struct Case { const char* pattern; const char* path; bool match; };

TEST(PathPattern, Table) {
  const Case cases[] = {
      {"model.layers.{*}", "model.layers.0", true},
      {"model.layers.{*}", "model.layers.17", true},
      {"model.layers.{*}", "model.layers.x", false},
      {"model.layers.{*}", "model.layers.0.mlp", false},
      {"model.layers.{0-3}", "model.layers.3", true},
      {"model.layers.{0-3}", "model.layers.4", false},
      {"model.layers.{2-2}", "model.layers.2", true},
      {"model.layers.{10-12}", "model.layers.11", true},
      {"model.layers.{10-12}", "model.layers.1", false},
      {"model.layers.{0,5,11}", "model.layers.5", true},
      {"model.layers.{0,5,11}", "model.layers.6", false},
      {"model.layers.{7}", "model.layers.7", true},
      {"model.layers.{*}.*_proj", "model.layers.3.q_proj", true},
      {"model.layers.{*}.self_attn.*_proj", "model.layers.3.self_attn.q_proj", true},
      {"model.layers.{*}.self_attn.*_proj", "model.layers.3.self_attn.rotary", false},
      {"model.layers.{*}.mlp.?p_proj", "model.layers.0.mlp.up_proj", true},
      {"model.layers.{*}.mlp.?p_proj", "model.layers.0.mlp.gate_proj", false},
      {"*", "lm_head", true},
      {"*", "model.norm", false},
      {"model.*", "model.norm", true},
      {"model.visual.**", "model.visual.blocks.3.attn.qkv", true},
      {"model.visual.**", "model.visual", true},
      {"model.visual.**", "model.language_model", false},
      {"visual.blocks.{0-1}.**", "visual.blocks.1.mlp.fc1", true},
      {"visual.blocks.{0-1}.**", "visual.blocks.2.mlp.fc1", false},
      {"lm_head", "lm_head", true},
      {"lm_head", "lm_headx", false},
      {"model.embed_tokens", "model.embed_tokens", true},
      {"model.layers.{*}", "layers.0", false},
  };
  for (const Case& c : cases) {
    mm::PathPattern p(c.pattern);
    EXPECT_EQ(p.matches(c.path), c.match) << c.pattern << " vs " << c.path;
  }
}

TEST(PathPattern, MalformedPatternsAreConfigErrors) {
  for (const char* bad : {"", "model..layers", "model.layers.{3-1}", "model.layers.{a-b}", "model.{*",
                          "model.layers.{1,x}", "model.la{1}yers", "**.model"}) {
    EXPECT_THROW(mm::PathPattern p(bad), mm::ConfigError) << bad;
  }
}

TEST(PathPattern, MatchesAny) {
  auto ps = mm::compile_patterns({"model.layers.{0-1}", "lm_head"});
  EXPECT_TRUE(mm::matches_any(ps, "lm_head"));
  EXPECT_TRUE(mm::matches_any(ps, "model.layers.1"));
  EXPECT_FALSE(mm::matches_any(ps, "model.layers.2"));
}

}  // namespace
