// Client accounts on their own: references per object and tier, and the limits on each.
#include "store/client_accounts.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace depot::store {
namespace {

constexpr int32_t kTiers = 3;  // host and two GPUs

TEST(ClientAccountsTest, TheDaemonHasAnAccountFromTheStart) {
  ClientAccounts accounts({}, kTiers);
  ASSERT_NE(accounts.Find(kDaemonClient), nullptr);
  EXPECT_EQ(accounts.at(kDaemonClient).uid, ::getuid());
  EXPECT_EQ(accounts.Find(1), nullptr);
}

TEST(ClientAccountsTest, AnObjectHeldOnTwoTiersCountsOnceWithTheBytesOfBoth) {
  ClientAccounts accounts({}, kTiers);
  accounts.Open(1, 1000);
  ClientAccounts::Account& a = accounts.at(1);
  accounts.AddRef(a, 5, kHost, 128);
  accounts.AddRef(a, 5, kHost, 128);
  accounts.AddRef(a, 5, 1, 256);
  EXPECT_EQ(accounts.UsageOf(1).objects, 1u);
  EXPECT_EQ(accounts.UsageOf(1).references, 3u);
  EXPECT_EQ(accounts.UsageOf(1).bytes, 384u);
  EXPECT_EQ(accounts.RefsOf(a, 5, kHost), 2u);
  EXPECT_EQ(accounts.RefsOf(a, 5, 0), 0u);

  accounts.DropRef(a, 5, kHost, 128);
  EXPECT_EQ(accounts.UsageOf(1).bytes, 384u);  // one host reference is left
  accounts.DropRef(a, 5, kHost, 128);
  EXPECT_EQ(accounts.UsageOf(1).bytes, 256u);
  EXPECT_EQ(accounts.UsageOf(1).objects, 1u);  // still held on GPU 1
  accounts.DropRef(a, 5, 1, 256);
  EXPECT_EQ(accounts.UsageOf(1).objects, 0u);
  EXPECT_EQ(accounts.UsageOf(1).references, 0u);
  EXPECT_TRUE(a.refs.empty());
}

TEST(ClientAccountsTest, HoldersAreListedInClientOrderWithTheirTiers) {
  ClientAccounts accounts({}, kTiers);
  accounts.Open(2, 1000);
  accounts.Open(1, 1000);
  accounts.AddRef(accounts.at(2), 9, 1, 64);
  accounts.AddRef(accounts.at(1), 9, kHost, 64);
  accounts.AddRef(accounts.at(1), 9, 0, 64);
  accounts.AddRef(accounts.at(1), 8, kHost, 64);  // another object
  const std::vector<HolderInfo> holders = accounts.HoldersOf(9);
  ASSERT_EQ(holders.size(), 2u);
  EXPECT_EQ(holders[0].client, 1u);
  EXPECT_EQ(holders[0].references, 2u);
  EXPECT_EQ(holders[0].tiers, (std::vector<std::pair<int32_t, uint32_t>>{{kHost, 1}, {0, 1}}));
  EXPECT_EQ(holders[1].client, 2u);
  EXPECT_EQ(holders[1].tiers, (std::vector<std::pair<int32_t, uint32_t>>{{1, 1}}));
}

TEST(ClientAccountsTest, HoldingLimitsNameTheFlagThatSetsThem) {
  ClientAccounts accounts({.max_bytes = 1000, .max_objects = 1}, kTiers);
  accounts.Open(1, 1000);
  ClientAccounts::Account& a = accounts.at(1);
  EXPECT_TRUE(accounts.CheckHolding(1, a, 1000).ok());
  Status st = accounts.CheckHolding(1, a, 1001);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(st.message().find("--client-max-bytes"), std::string::npos) << st.message();
  accounts.AddRef(a, 1, kHost, 10);
  st = accounts.CheckHolding(1, a, 10);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(st.message().find("--client-max-objects"), std::string::npos) << st.message();
}

TEST(ClientAccountsTest, MetadataIsLimitedPerClientAndInAll) {
  ClientAccounts accounts({.max_metadata_bytes = 1000, .metadata_budget = 1500}, kTiers);
  accounts.Open(1, 1000);
  accounts.Open(2, 1000);
  accounts.CountMetadata(1, 900);
  Status st = accounts.CheckMetadata(1, accounts.at(1), 200);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(st.message().find("--client-max-metadata"), std::string::npos) << st.message();
  accounts.CountMetadata(2, 500);
  st = accounts.CheckMetadata(2, accounts.at(2), 200);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(st.message().find("--metadata-budget"), std::string::npos) << st.message();
  accounts.CountMetadata(1, -900);
  EXPECT_EQ(accounts.metadata_bytes(), 500u);
  EXPECT_TRUE(accounts.CheckMetadata(2, accounts.at(2), 200).ok());
}

TEST(ClientAccountsTest, RequestsHaveAnAccountOfTheirOwnThatRefusesWithoutCounting) {
  ClientAccounts accounts({.max_metadata_bytes = 1000, .metadata_budget = 1500}, kTiers);
  accounts.Open(1, 1000);
  accounts.CountMetadata(1, 1000);  // the metadata account is full: requests still go
  EXPECT_TRUE(accounts.ChargeRequests(1, 800).ok());
  EXPECT_EQ(accounts.ChargeRequests(1, 300).code(), StatusCode::kLimitExceeded);
  EXPECT_EQ(accounts.request_bytes(), 800u);
  EXPECT_TRUE(accounts.ChargeRequests(1, -800).ok());
  EXPECT_EQ(accounts.request_bytes(), 0u);
  EXPECT_EQ(accounts.ChargeRequests(3, 1).code(), StatusCode::kInternal);  // not connected
}

}  // namespace
}  // namespace depot::store
