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

  // A reference on the disk copy (the scheduler's, moved there with a spill) is listed last.
  accounts.AddRef(accounts.at(2), 9, kDisk, 64);
  EXPECT_EQ(accounts.HoldersOf(9)[1].tiers,
            (std::vector<std::pair<int32_t, uint32_t>>{{1, 1}, {kDisk, 1}}));
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

TEST(ClientAccountsTest, WithoutLimitsALeaseTableHasEveryEntryAndAnyObject) {
  const LeaseAllowance a = AllowanceFor({}, 8192, 64);
  EXPECT_EQ(a.entries, 8192u);
  EXPECT_EQ(a.max_object_bytes, 0u);
  EXPECT_EQ(a.reserved_objects, 0u);
  EXPECT_EQ(a.reserved_bytes, 0u);
}

TEST(ClientAccountsTest, LimitsSetAQuarterAsideForTheLeaseTable) {
  // --client-max-objects 50: 12 for the table, rounded down to 8 entries.
  LeaseAllowance a = AllowanceFor({.max_objects = 50}, 8192, 64);
  EXPECT_EQ(a.entries, 8u);
  EXPECT_EQ(a.reserved_objects, 8u);
  EXPECT_EQ(a.max_object_bytes, 0u);
  // --client-max-bytes 20 MiB: 5 MiB for the table, at least 64 KiB an object: 64 entries
  // of 80 KiB each.
  a = AllowanceFor({.max_bytes = 20 << 20}, 8192, 64);
  EXPECT_EQ(a.entries, 64u);
  EXPECT_EQ(a.max_object_bytes, 80u << 10);
  EXPECT_EQ(a.reserved_bytes, 5u << 20);
  // Both: the fewer entries, each object the larger share.
  a = AllowanceFor({.max_bytes = 20 << 20, .max_objects = 50}, 8192, 64);
  EXPECT_EQ(a.entries, 8u);
  EXPECT_EQ(a.max_object_bytes, 640u << 10);
  EXPECT_EQ(a.reserved_bytes, 5u << 20);
  EXPECT_EQ(a.reserved_objects, 8u);
  // Limits too small to set anything aside: no table, and the whole limit for references.
  a = AllowanceFor({.max_bytes = 100 << 10, .max_objects = 3}, 8192, 64);
  EXPECT_EQ(a.entries, 0u);
  EXPECT_EQ(a.reserved_bytes, 0u);
  EXPECT_EQ(a.reserved_objects, 0u);
  // The object allowance is a multiple of the alignment, so its block fits it too.
  a = AllowanceFor({.max_bytes = (4 << 20) + 1000}, 1, 4096);
  EXPECT_EQ(a.max_object_bytes % 4096, 0u);
  EXPECT_LE(a.reserved_bytes, ((4u << 20) + 1000) / 4);
}

TEST(ClientAccountsTest, ReferencesMayTakeOnlyWhatTheLeaseTableLeaves) {
  ClientAccounts accounts({.max_bytes = 1000, .max_objects = 10}, kTiers);
  accounts.Open(1, 1000);
  ClientAccounts::Account& a = accounts.at(1);
  a.lease = {.entries = 2, .max_object_bytes = 100, .reserved_objects = 2, .reserved_bytes = 200};
  EXPECT_TRUE(accounts.CheckHolding(1, a, 800).ok());
  Status st = accounts.CheckHolding(1, a, 801);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(st.message().find("its lease table may keep"), std::string::npos) << st.message();
  for (uint32_t slot = 0; slot < 8; ++slot) accounts.AddRef(a, slot, kHost, 1);
  st = accounts.CheckHolding(1, a, 1);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(st.message().find("--client-max-objects 10 less 2"), std::string::npos) << st.message();
  // A reload to limits below what was set aside leaves references nothing, without wrapping.
  accounts.set_limits({.max_bytes = 100, .max_objects = 1});
  EXPECT_EQ(accounts.CheckHolding(1, a, 0).code(), StatusCode::kLimitExceeded);
}

TEST(ClientAccountsTest, MetadataIsLimitedPerClientAndInAll) {
  ClientAccounts accounts({.max_metadata_bytes = 1000, .metadata_budget = 1500}, kTiers);
  accounts.Open(1, ::getuid());
  accounts.Open(2, ::getuid());
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

TEST(ClientAccountsTest, TheSessionsOfAnotherUidShareOneMetadataLimit) {
  ClientAccounts accounts({.max_metadata_bytes = 1000, .metadata_budget = 10'000}, kTiers);
  const uint32_t other = ::getuid() + 1000;
  accounts.Open(1, other);
  accounts.Open(2, other);
  accounts.Open(3, ::getuid());
  accounts.Open(4, ::getuid());
  accounts.CountMetadata(1, 600);
  Status st = accounts.CheckMetadata(2, accounts.at(2), 500);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(st.message().find("uid " + std::to_string(other)), std::string::npos) << st.message();
  EXPECT_EQ(accounts.MetadataOfUid(other), 600u);
  // The daemon's own uid is one trust domain: each of its sessions has its own limit.
  accounts.CountMetadata(3, 600);
  EXPECT_TRUE(accounts.CheckMetadata(4, accounts.at(4), 500).ok());
  // An object's memory stays its owner's after its creator's session ends, until it goes.
  accounts.CountObjectMetadata(2, other, 300);
  accounts.Close(2);
  EXPECT_EQ(accounts.MetadataOfUid(other), 900u);
  accounts.CountObjectMetadata(2, other, -300);
  accounts.CountMetadata(1, -600);
  EXPECT_EQ(accounts.MetadataOfUid(other), 0u);
  EXPECT_EQ(accounts.metadata_bytes(), 600u);
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
