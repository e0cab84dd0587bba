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

}  // namespace
}  // namespace depot::store
