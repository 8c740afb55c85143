#include "context_store.h"

#include <thread>

#include "check.h"

using namespace es;

static std::vector<Buffer> host(std::vector<std::vector<float>>& vs) {
  std::vector<Buffer> out;
  for (auto& v : vs) out.push_back({v.data(), static_cast<int64_t>(v.size() * sizeof(float)), -1});
  return out;
}

TEST(save_restore_roundtrip_without_new_slabs) {
  ContextStore store(64 << 20, 2);
  std::vector<std::vector<float>> a{{1, 2, 3}, std::vector<float>(3 << 20, 7.0f)};
  store.save(0, "bn", "sig", host(a), Location::Host, nullptr);
  const int64_t slabs = store.slab_count();
  for (int step = 0; step < 5; ++step) {
    a[0][0] = static_cast<float>(step);
    store.save(0, "bn", "sig", host(a), Location::Host, nullptr);
  }
  CHECK(store.slab_count() == slabs);  // steady state: nothing allocated
  std::vector<std::vector<float>> b{{0, 0, 0}, std::vector<float>(3 << 20, 0.0f)};
  store.restore(0, "bn", "sig", host(b), nullptr);
  CHECK(b[0][0] == 4.0f && b[0][2] == 3.0f && b[1][(3 << 20) - 1] == 7.0f);
}

TEST(threads_split_the_bytes_of_many_buffers) {
  // Shares of the concatenated bytes cut through buffers; any thread count
  // must copy every byte once: distinct values everywhere, checked in full.
  std::vector<std::vector<float>> a;
  for (int i = 0; i < 40; ++i) a.emplace_back(i % 4 == 0 ? (1 << 18) + i : 97 * i + 1);
  float next = 0;
  for (auto& v : a)
    for (auto& x : v) x = next++;
  for (int threads : {1, 2, 3, 7}) {
    ContextStore store(64 << 20, threads);
    store.save(0, "x", "s", host(a), Location::Host, nullptr);
    std::vector<std::vector<float>> b;
    for (auto& v : a) b.emplace_back(v.size(), -1.0f);
    store.restore(0, "x", "s", host(b), nullptr);
    CHECK(b == a);
  }
}

TEST(errors) {
  ContextStore store(1 << 20, 1);
  std::vector<std::vector<float>> a{{1, 2}};
  CHECK(throws<UnknownContext>([&] { store.restore(3, "rng", "sig", host(a), nullptr); }));
  store.save(3, "rng", "sig", host(a), Location::Host, nullptr);
  std::vector<std::vector<float>> wrong{{1, 2, 3}};
  CHECK(throws<std::invalid_argument>([&] { store.restore(3, "rng", "sig", host(wrong), nullptr); }));
  CHECK(throws<std::invalid_argument>([&] { store.restore(3, "rng", "other", host(a), nullptr); }));
  std::vector<std::vector<float>> big{std::vector<float>(1 << 20)};
  CHECK(throws<OverCapacity>([&] { store.save(4, "big", "sig", host(big), Location::Host, nullptr); }));
  CHECK(throws<std::invalid_argument>([] { ContextStore bad(0, 1); }));
}

TEST(serialize_roundtrip_and_corruption) {
  ContextStore store(8 << 20, 1);
  std::vector<std::vector<float>> a{{1, 2, 3}, {4}};
  store.save(5, "x", "s1", host(a), Location::Host, nullptr);
  store.save(5, "y", "s2", host(a), Location::Host, nullptr);
  std::vector<uint8_t> bytes = store.serialize(5);
  ContextStore other(8 << 20, 1);
  CHECK(other.deserialize(bytes.data(), static_cast<int64_t>(bytes.size())) == 5);
  CHECK(other.names(5) == (std::vector<std::string>{"x", "y"}));
  std::vector<std::vector<float>> b{{0, 0, 0}, {0}};
  other.restore(5, "y", "s2", host(b), nullptr);
  CHECK(b[0][2] == 3.0f && b[1][0] == 4.0f);
  auto truncated = bytes;
  truncated.resize(truncated.size() - 5);
  CHECK(throws<std::invalid_argument>([&] { other.deserialize(truncated.data(), (int64_t)truncated.size()); }));
  auto flipped = bytes;
  flipped[flipped.size() / 2] ^= 1;
  CHECK(throws<std::invalid_argument>([&] { other.deserialize(flipped.data(), (int64_t)flipped.size()); }));
}

TEST(erase_reuses_memory) {
  ContextStore store(64 << 20, 1);
  std::vector<std::vector<float>> a{std::vector<float>(1 << 20)};
  store.save(0, "g", "s", host(a), Location::Host, nullptr);
  store.save(1, "g", "s", host(a), Location::Host, nullptr);
  const int64_t held = store.reserved_bytes();
  store.erase(0);
  store.save(2, "g", "s", host(a), Location::Host, nullptr);
  CHECK(store.reserved_bytes() == held);
  CHECK(store.workers() == (std::vector<int64_t>{1, 2}));
}

TEST(concurrent_threads_keep_entries_intact) {
  ContextStore store(256 << 20, 1);
  std::vector<std::thread> threads;
  std::vector<int> bad(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::vector<float>> mine{std::vector<float>(50000, float(t))};
      for (int round = 0; round < 50; ++round) {
        mine[0][round] = float(round);
        store.save(t, "state", "s", host(mine), Location::Host, nullptr);
        std::vector<std::vector<float>> back{std::vector<float>(50000)};
        store.restore(t, "state", "s", host(back), nullptr);
        if (back != mine) bad[t] = 1;
      }
    });
  for (auto& th : threads) th.join();
  for (int b : bad) CHECK(b == 0);
}

TEST_MAIN()
