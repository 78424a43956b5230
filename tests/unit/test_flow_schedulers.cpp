// Flow-matching samplers (mindspeed_mm/inference/flow_schedulers.h) against PyPI's diffusers
// (tests/conformance/diffusers_reference.py scheduler): timesteps and sigmas of Euler and UniPC
// as Wan's pipelines configure them, and every step of a whole sampling loop with a stand-in
// velocity, fp32 within 1e-4 relative (printed); the shift; bad options are clear errors.
#include <gtest/gtest.h>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/inference/flow_schedulers.h"
#include "run_command.h"

using namespace mm::inference;

TEST(FlowSchedulers, ShiftMovesSigmasTowardNoise) {
  EXPECT_DOUBLE_EQ(shift_sigma(0.5, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(shift_sigma(0.5, 5.0), 2.5 / 3.0);
  EXPECT_DOUBLE_EQ(shift_sigma(1.0, 3.0), 1.0);
  EXPECT_DOUBLE_EQ(shift_sigma(0.0, 3.0), 0.0);
}

TEST(FlowSchedulers, MatchDiffusersStepByStep) {
  struct Case {
    std::string name;
    int steps;
    double shift;
  };
  const Case cases[] = {{"euler", 10, 5.0}, {"unipc", 10, 5.0}, {"unipc", 7, 3.0}, {"unipc", 1, 3.0}, {"euler", 50, 3.0}};
  for (const Case& c : cases) {
    const std::string dir = mm::test::fresh_dir("flow_scheduler_" + std::to_string(&c - cases));
    at::manual_seed(3);
    const at::Tensor x0 = at::randn({2, 4, 3, 5});
    mm::st::save_safetensors(dir + "/inputs.safetensors", {{"sample", x0}});
    const std::string cmd = std::string(MM_PYTHON) + " " + mm::test::source_dir() +
                            "/tests/conformance/diffusers_reference.py scheduler " + c.name + " " +
                            std::to_string(c.steps) + " " + std::to_string(c.shift) + " " + dir;
    auto r = mm::test::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    mm::st::HFWeights want(dir + "/schedule.safetensors");

    FlowSchedulerOptions o;
    o.steps = c.steps;
    o.shift = c.shift;
    auto s = make_flow_scheduler(c.name, o);
    const std::string what = c.name + " " + std::to_string(c.steps) + " steps, shift " + std::to_string(c.shift);
    ASSERT_EQ(s->steps(), c.steps) << what;
    const at::Tensor ts = at::tensor(s->timesteps(), at::kDouble), sg = at::tensor(s->sigmas(), at::kDouble);
    EXPECT_LT(mm::test::rel_err(ts, want.get("timesteps")), 1e-6) << what << "\n" << ts << want.get("timesteps");
    EXPECT_LT(mm::test::rel_err(sg, want.get("sigmas")), 1e-6) << what << "\n" << sg << want.get("sigmas");
    EXPECT_EQ(s->sigmas().back(), 0.0);
    at::Tensor x = x0;
    double worst = 0;
    for (int k = 0; k < c.steps; ++k) {
      const float t = static_cast<float>(s->timesteps()[static_cast<size_t>(k)]);
      const at::Tensor v = at::tanh(x) * (t / 1000.0f) - x / 2;
      x = s->step(v, x);
      const double err = mm::test::rel_err(x, want.get("sample_" + std::to_string(k)));
      worst = std::max(worst, err);
      ASSERT_LT(err, 1e-4) << what << " at step " << k;
    }
    std::printf("%s: worst relative difference from diffusers over the loop %.2e\n", what.c_str(), worst);
    EXPECT_THROW(s->step(x, x), mm::Error);  // past the last step
  }
}

TEST(FlowSchedulers, BadOptionsAreClearErrors) {
  FlowSchedulerOptions o;
  try {
    make_flow_scheduler("ddim", o);
    ADD_FAILURE() << "unknown scheduler accepted";
  } catch (const mm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown scheduler id 'ddim' (known: euler, unipc)"), std::string::npos) << e.what();
  }
  o.steps = 0;
  EXPECT_THROW(make_flow_scheduler("euler", o), mm::ConfigError);
  o.steps = 10;
  o.shift = 0;
  EXPECT_THROW(make_flow_scheduler("unipc", o), mm::ConfigError);
}
