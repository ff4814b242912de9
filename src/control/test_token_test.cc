// Every unit-test process holds a deployment secret before any test runs,
// as every rank of a real deployment does: servers and managers the tests
// start read it from the environment, and tests of the missing-token path
// clear it themselves (control/auth_test.cc).
#include "control/auth.h"

namespace kvbridge::internal {
namespace {

[[maybe_unused]] const std::string kTestToken = EnsureAuthTokenInEnvironment();

}  // namespace
}  // namespace kvbridge::internal
