// base::env_list: comma-separated settings (TPUHAL_SIM_BOARDS, TPUHAL_SIMD).
#include <gtest/gtest.h>

#include <cstdlib>

#include "tpuhal/base/env.h"

namespace tpuhal::base {
namespace {

using List = std::vector<std::string>;

TEST(BaseEnv, ListsSplitOnCommasSkipEmptyItemsAndFallBackWhenUnset) {
  ::unsetenv("TPUHAL_TEST_LIST");
  EXPECT_EQ(env_list("TPUHAL_TEST_LIST", "bm1684x"), List{"bm1684x"});
  EXPECT_EQ(env_list("TPUHAL_TEST_LIST"), List{});
  ::setenv("TPUHAL_TEST_LIST", "tiny,,/p/a.json,", 1);
  EXPECT_EQ(env_list("TPUHAL_TEST_LIST", "bm1684x"), (List{"tiny", "/p/a.json"}));
  ::setenv("TPUHAL_TEST_LIST", "", 1);  // set but empty: nothing, not the fallback
  EXPECT_EQ(env_list("TPUHAL_TEST_LIST", "bm1684x"), List{});
  ::unsetenv("TPUHAL_TEST_LIST");
}

}  // namespace
}  // namespace tpuhal::base
