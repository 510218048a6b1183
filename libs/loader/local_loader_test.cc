// LocalLoader runs the Loader conformance suite (libs/loader/testing/loader_conformance.h).

#include "libs/loader/local_loader.h"

#include <memory>

#include "libs/loader/testing/loader_conformance.h"

namespace ckpt::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Local, LoaderConformanceTest,
                         ::testing::Values(LoaderConformanceParam{
                             "local",
                             [](CheckpointStore& store) -> std::unique_ptr<LoaderHarness> {
                               return std::make_unique<OwnedLoader>(std::make_unique<LocalLoader>(
                                   store, /*cache_bytes=*/int64_t{1} << 20));
                             }}),
                         [](const ::testing::TestParamInfo<LoaderConformanceParam>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace ckpt::testing
