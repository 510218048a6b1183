#ifndef CKPT_LIBS_LOADER_TESTING_LOADER_CONFORMANCE_H_
#define CKPT_LIBS_LOADER_TESTING_LOADER_CONFORMANCE_H_

// One conformance suite that every Loader (libs/loader/loader_interface.h) runs, as
// tensorstore's kvstore drivers share one driver test: the same version, the same requests, the
// same expected answers, whether the work happens in-process (LocalLoader) or in a loader
// service behind RemoteLoader. testonly.
//
// An implementation's test instantiates it with a factory:
//   INSTANTIATE_TEST_SUITE_P(Local, LoaderConformanceTest,
//                            ::testing::Values(LoaderConformanceParam{"local", [](CheckpointStore&
//                            s) {
//                              return
//                              std::make_unique<OwnedLoader>(std::make_unique<LocalLoader>(s));
//                            }}),
//                            [](const auto& info) { return info.param.name; });

#include <functional>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "libs/loader/loader_interface.h"
#include "libs/store/checkpoint_store.h"

namespace ckpt::testing {

// A Loader under test and whatever keeps it working (a server, a channel).
class LoaderHarness {
 public:
  virtual ~LoaderHarness() = default;
  virtual const Loader& loader() const = 0;
};

// The simplest harness: it owns the loader and nothing else.
class OwnedLoader final : public LoaderHarness {
 public:
  explicit OwnedLoader(std::unique_ptr<Loader> loader) : loader_(std::move(loader)) {}
  const Loader& loader() const override { return *loader_; }

 private:
  std::unique_ptr<Loader> loader_;
};

struct LoaderConformanceParam {
  std::string name;
  // A loader over `store`, which outlives it.
  std::function<std::unique_ptr<LoaderHarness>(CheckpointStore& store)> make;
};

class LoaderConformanceTest : public ::testing::TestWithParam<LoaderConformanceParam> {
 protected:
  void SetUp() override;
  void TearDown() override;

  const Loader& loader() const { return harness_->loader(); }
  std::string Dir() const;

  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<LoaderHarness> harness_;
  v1::VersionRef bundle_;        // model (module. keys, float32 + int64), optimizer, scheduler.
  v1::VersionRef weights_only_;  // the same model alone.
};

}  // namespace ckpt::testing

#endif  // CKPT_LIBS_LOADER_TESTING_LOADER_CONFORMANCE_H_
