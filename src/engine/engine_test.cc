#include "engine/engine.h"

#include <gtest/gtest.h>

namespace kvbridge::internal {
namespace {

TEST(TransferEngineTest, MapsRunsOntoRegionsPerClass) {
  RegionSet local{{11, 12}, {21}, {31}};
  RemoteRegionSet remote{{111, 112}, {121}, {131}};
  std::vector<CopyRun> runs = {
      {BufferClass::kKv, 1, 64, 0, 128, 32},
      {BufferClass::kAux, 0, 8, 0, 16, 4},
      {BufferClass::kState, 0, 0, 0, 2, 1},
  };
  auto ops = TransferEngine::ToWriteOps(local, remote, runs);
  ASSERT_TRUE(ops.ok());
  ASSERT_EQ(ops->size(), 3u);
  EXPECT_EQ((*ops)[0].local_region, 12u);
  EXPECT_EQ((*ops)[0].remote_region, 111u);
  EXPECT_EQ((*ops)[0].local_offset, 64u);
  EXPECT_EQ((*ops)[0].remote_offset, 128u);
  EXPECT_EQ((*ops)[0].length, 32u);
  EXPECT_EQ((*ops)[1].local_region, 21u);
  EXPECT_EQ((*ops)[1].remote_region, 121u);
  EXPECT_EQ((*ops)[2].local_region, 31u);
  EXPECT_EQ((*ops)[2].remote_region, 131u);
}

TEST(TransferEngineTest, UnknownBufferIsInvalidArgument) {
  RegionSet local{{11}, {}, {}};
  RemoteRegionSet remote{{111}, {}, {}};
  auto ops = TransferEngine::ToWriteOps(local, remote, {{BufferClass::kKv, 0, 0, 3, 0, 8}});
  EXPECT_EQ(ops.status().code(), StatusCode::kInvalidArgument);
  ops = TransferEngine::ToWriteOps(local, remote, {{BufferClass::kAux, 0, 0, 0, 0, 8}});
  EXPECT_EQ(ops.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvbridge::internal
