// A few lines of test harness: TEST(name) registers a case, CHECK fails it
// with file and line. main() runs them all; exit 1 on any failure.
#pragma once
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

struct TestCase {
  const char* name;
  std::function<void()> body;
};
inline std::vector<TestCase>& test_registry() {
  static std::vector<TestCase> cases;
  return cases;
}
struct TestRegistrar {
  TestRegistrar(const char* name, std::function<void()> body) { test_registry().push_back({name, std::move(body)}); }
};
struct CheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define TEST(name)                                           \
  static void test_##name();                                 \
  static TestRegistrar registrar_##name(#name, test_##name); \
  static void test_##name()

#define CHECK(cond)                                                                                        \
  do {                                                                                                     \
    if (!(cond)) throw CheckFailure(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #cond); \
  } while (0)

template <typename E, typename F>
bool throws(F f) {
  try {
    f();
  } catch (const E&) {
    return true;
  }
  return false;
}

inline int run_all_tests() {
  int failed = 0;
  for (const TestCase& c : test_registry()) {
    try {
      c.body();
      std::printf("[ ok ] %s\n", c.name);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("[FAIL] %s: %s\n", c.name, e.what());
    }
  }
  std::printf("%zu passed, %d failed\n", test_registry().size() - failed, failed);
  return failed ? 1 : 0;
}

#define TEST_MAIN() \
  int main() { return run_all_tests(); }
