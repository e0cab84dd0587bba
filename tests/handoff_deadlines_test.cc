// HandoffDeadlines in process: which reference a claim takes, which an expiry gives back,
// and what a group's end forgets.
#include "store/handoff_deadlines.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace depot::store {
namespace {

using Key = HandoffDeadlines::Key;

TEST(HandoffDeadlinesTest, DueDeadlinesGiveBackOneReferenceEachInTimeOrder) {
  HandoffDeadlines deadlines;
  const Key a{1, 10, -1}, b{1, 11, 0};
  deadlines.Add(a, 300);
  deadlines.Add(b, 100);
  deadlines.Add(a, 200);
  EXPECT_EQ(deadlines.next(), 100u);
  std::map<ClientId, uint64_t> freed;
  EXPECT_EQ(deadlines.Expire(99, &freed), std::vector<Key>{});
  EXPECT_EQ(deadlines.Expire(250, &freed), (std::vector<Key>{b, a}));
  EXPECT_EQ(freed[1], 2 * HandoffDeadlines::kBytes);
  EXPECT_EQ(deadlines.next(), 300u);
  EXPECT_EQ(deadlines.Expire(1000, &freed), std::vector<Key>{a});
  EXPECT_EQ(deadlines.size(), 0u);
  EXPECT_EQ(deadlines.next(), 0u);
}

TEST(HandoffDeadlinesTest, AClaimTakesTheReferenceThatWouldExpireFirst) {
  HandoffDeadlines deadlines;
  const Key a{2, 5, -1};
  deadlines.Add(a, 100);
  deadlines.Add(a, 500);
  deadlines.Claimed(a);  // takes the one due at 100
  std::map<ClientId, uint64_t> freed;
  // Its deadline passes with nothing to give back, but its charge ends.
  EXPECT_EQ(deadlines.Expire(200, &freed), std::vector<Key>{});
  EXPECT_EQ(freed[2], HandoffDeadlines::kBytes);
  EXPECT_EQ(deadlines.Expire(600, &freed), std::vector<Key>{a});
  // A claim of a reference with no deadline (none left) changes nothing.
  deadlines.Claimed(a);
  EXPECT_EQ(deadlines.size(), 0u);
}

TEST(HandoffDeadlinesTest, AGroupsEndForgetsItsDeadlinesOnly) {
  HandoffDeadlines deadlines;
  deadlines.Add({3, 1, -1}, 100);
  deadlines.Add({3, 2, -1}, 200);
  deadlines.Add({4, 1, -1}, 150);
  deadlines.Claimed({3, 1, -1});  // claimed, still charged until its deadline
  EXPECT_EQ(deadlines.ForgetGroup(3), 2 * HandoffDeadlines::kBytes);
  std::map<ClientId, uint64_t> freed;
  EXPECT_EQ(deadlines.Expire(1000, &freed), (std::vector<Key>{{4, 1, -1}}));
  EXPECT_EQ(freed.count(3), 0u);
  EXPECT_EQ(deadlines.ForgetGroup(3), 0u);
}

TEST(HandoffDeadlinesTest, ManyGroupsExpireInTimeOrderAndInSlices) {
  HandoffDeadlines deadlines;
  // Three groups' deadlines interleaved in time: 1 at 10, 40, 70...; 2 at 20, 50...; 3 at 30...
  for (uint32_t i = 0; i < 30; ++i) deadlines.Add({1 + i % 3, i, -1}, 10 * (i + 1));
  EXPECT_EQ(deadlines.size(), 30u);
  std::map<ClientId, uint64_t> freed;
  std::vector<Key> due = deadlines.Expire(1000, &freed, /*max=*/7);
  ASSERT_EQ(due.size(), 7u);
  for (uint32_t i = 0; i < 7; ++i) EXPECT_EQ(due[i], (Key{1 + i % 3, i, -1}));
  EXPECT_EQ(deadlines.next(), 80u) << "the rest are still due";
  // Group 2 ends (two of its ten are gone): the others' go on from where they were.
  EXPECT_EQ(deadlines.ForgetGroup(2), 8 * HandoffDeadlines::kBytes);
  due = deadlines.Expire(1000, &freed);
  ASSERT_EQ(due.size(), 30u - 7 - 8);
  for (size_t i = 1; i < due.size(); ++i) EXPECT_LT(due[i - 1].slot, due[i].slot);
  for (const Key& key : due) EXPECT_NE(key.group, 2u);
  EXPECT_EQ(deadlines.size(), 0u);
  EXPECT_EQ(deadlines.next(), 0u);
  EXPECT_EQ(freed[1] + freed[2] + freed[3], (30 - 8) * HandoffDeadlines::kBytes);
}

// Graces: references bound to their sender's end.
constexpr uint64_t kNever = HandoffDeadlines::kNever;

TEST(HandoffDeadlinesTest, AGracedReferenceGetsItsDueTimeWhenItsSenderEnds) {
  HandoffDeadlines deadlines;
  const Key a{1, 10, -1};
  deadlines.Add(a, kNever, /*sender=*/7, /*grace_ns=*/50);
  EXPECT_EQ(deadlines.next(), 0u) << "nothing is due while its sender lives";
  EXPECT_EQ(deadlines.graced(), 1u);
  std::map<ClientId, uint64_t> freed;
  EXPECT_EQ(deadlines.Expire(1'000'000, &freed), std::vector<Key>{});
  deadlines.SenderEnded(8, 1000);  // another session: nothing changes
  EXPECT_EQ(deadlines.next(), 0u);
  deadlines.SenderEnded(7, 1000);
  EXPECT_EQ(deadlines.graced(), 0u);
  EXPECT_EQ(deadlines.next(), 1050u);
  EXPECT_EQ(deadlines.Expire(1049, &freed), std::vector<Key>{});
  EXPECT_EQ(deadlines.Expire(1050, &freed), std::vector<Key>{a});
  // The one charge, a grace's, passed to the deadline it became and ends with it.
  EXPECT_EQ(freed[1], HandoffDeadlines::kBytes);
  EXPECT_EQ(deadlines.size(), 0u);
}

TEST(HandoffDeadlinesTest, AGraceEndsAtTheHandoffsOwnDeadlineIfThatComesFirst) {
  HandoffDeadlines deadlines;
  const Key a{1, 10, -1}, b{1, 11, -1};
  EXPECT_EQ(HandoffDeadlines::Cost(300, 7), 2 * HandoffDeadlines::kBytes);
  deadlines.Add(a, 300, 7, 1000);  // due at 300 or 1000 after its sender's end
  deadlines.Add(b, 5000, 7, 1000);
  std::map<ClientId, uint64_t> freed;
  // a's own deadline comes while its sender lives: given back, both charges freed.
  EXPECT_EQ(deadlines.Expire(300, &freed), std::vector<Key>{a});
  EXPECT_EQ(freed[1], 2 * HandoffDeadlines::kBytes);
  EXPECT_EQ(deadlines.graced(), 1u);
  // b's sender ends at 400: due at 1400, before its own 5000.
  deadlines.SenderEnded(7, 400);
  EXPECT_EQ(deadlines.next(), 1400u);
  freed.clear();
  EXPECT_EQ(deadlines.Expire(1400, &freed), std::vector<Key>{b});
  // Its old deadline, still charged, comes due later with nothing to give back.
  EXPECT_EQ(deadlines.Expire(5000, &freed), std::vector<Key>{});
  EXPECT_EQ(freed[1], 2 * HandoffDeadlines::kBytes);
  EXPECT_EQ(deadlines.size(), 0u);
}

TEST(HandoffDeadlinesTest, AClaimTakesAGracedReferenceAfterThoseWithDeadlines) {
  HandoffDeadlines deadlines;
  const Key a{1, 10, -1};
  deadlines.Add(a, kNever, 7, 50);
  deadlines.Add(a, 900);
  EXPECT_EQ(deadlines.Claimed(a), 0u) << "the one due at 900 is taken: its charge stays";
  EXPECT_EQ(deadlines.Claimed(a), HandoffDeadlines::kBytes) << "the grace's charge ends";
  EXPECT_EQ(deadlines.graced(), 0u);
  deadlines.SenderEnded(7, 100);  // nothing of its is left waiting
  std::map<ClientId, uint64_t> freed;
  EXPECT_EQ(deadlines.Expire(1'000'000, &freed), std::vector<Key>{});
  EXPECT_EQ(freed[1], HandoffDeadlines::kBytes);  // the claimed deadline's
}

TEST(HandoffDeadlinesTest, ASendersEndIsTakenInSlicesFromTheTimeItEnded) {
  HandoffDeadlines deadlines;
  for (uint32_t i = 0; i < 5; ++i) deadlines.Add({1, i, -1}, kNever, 7, 100);
  EXPECT_TRUE(deadlines.SenderEnded(7, 1000, /*max=*/2));
  EXPECT_EQ(deadlines.graced(), 3u);
  // A claim between two slices takes one still waiting, with its grace.
  EXPECT_EQ(deadlines.Claimed({1, 4, -1}), HandoffDeadlines::kBytes);
  EXPECT_TRUE(deadlines.SenderEnded(7, 1000, 1));
  EXPECT_FALSE(deadlines.SenderEnded(7, 1000, 10));
  EXPECT_EQ(deadlines.graced(), 0u);
  EXPECT_FALSE(deadlines.SenderEnded(7, 5000));  // nothing left of it
  std::map<ClientId, uint64_t> freed;
  EXPECT_EQ(deadlines.Expire(1100, &freed).size(), 4u) << "all due at its end plus 100";
  EXPECT_EQ(freed[1], 4 * HandoffDeadlines::kBytes);
}

// Many graces of one key with deadlines in the other order than they came: each claim and
// expiry finds its own grace at once (a scan of the sender's graces made this quadratic).
TEST(HandoffDeadlinesTest, GracesOfOneKeyAreFoundByTheirDeadline) {
  HandoffDeadlines deadlines;
  const Key a{1, 10, -1};
  constexpr uint64_t kMany = 20'000;
  for (uint64_t i = 0; i < kMany; ++i) deadlines.Add(a, 1'000'000 + i, 7, 50);
  for (uint64_t i = 0; i < kMany; ++i) deadlines.Add(a, kMany - i, 7, 50);
  std::map<ClientId, uint64_t> freed;
  EXPECT_EQ(deadlines.Expire(kMany, &freed).size(), kMany);
  for (uint64_t i = 0; i < kMany; ++i) {
    ASSERT_EQ(deadlines.Claimed(a), HandoffDeadlines::kBytes);
  }
  EXPECT_EQ(deadlines.graced(), 0u);
  EXPECT_EQ(freed[1], 2 * kMany * HandoffDeadlines::kBytes);
}

TEST(HandoffDeadlinesTest, AGroupsEndForgetsTheGracesOfItsReferences) {
  HandoffDeadlines deadlines;
  deadlines.Add({3, 1, -1}, kNever, 7, 50);
  deadlines.Add({3, 2, -1}, 200, 7, 50);
  deadlines.Add({4, 1, -1}, kNever, 7, 50);
  EXPECT_EQ(deadlines.ForgetGroup(3), 3 * HandoffDeadlines::kBytes);
  EXPECT_EQ(deadlines.graced(), 1u);
  deadlines.SenderEnded(7, 1000);
  std::map<ClientId, uint64_t> freed;
  EXPECT_EQ(deadlines.Expire(2000, &freed), (std::vector<Key>{{4, 1, -1}}));
  EXPECT_EQ(freed.count(3), 0u);
  EXPECT_EQ(freed[4], HandoffDeadlines::kBytes);
}

}  // namespace
}  // namespace depot::store
