// --exit-signal parsing and ExitSignalHandler: the flag after the first delivery, the previous
// disposition back after destruction, and death by the signal on a second delivery.
#include <gtest/gtest.h>

#include <signal.h>

#include <string>

#include "core/error.h"
#include "train/exit_signal.h"

namespace megatron {
namespace {

TEST(ParseExitSignal, RoundTripsEveryAcceptedName) {
  for (const char* name : {"SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"}) {
    EXPECT_STREQ(exit_signal_name(parse_exit_signal(name)), name);
  }
  EXPECT_EQ(parse_exit_signal(kDefaultExitSignal), SIGTERM);
  EXPECT_EQ(parse_exit_signal("SIGUSR1"), SIGUSR1);
}

TEST(ParseExitSignal, RejectsOtherNamesWithTheAcceptedList) {
  // Case-sensitive and with the prefix, as Megatron's choices; numbers are not names either.
  for (const char* bad : {"SIGKILL", "sigterm", "TERM", "15", ""}) {
    try {
      parse_exit_signal(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--exit-signal"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP"), std::string::npos) << msg;
    }
  }
}

TEST(ExitSignalName, RejectsASignalItDoesNotAccept) {
  EXPECT_THROW(exit_signal_name(SIGKILL), InternalError);
}

TEST(ExitSignalHandler, ReceivedOnlyAfterTheSignal) {
  ExitSignalHandler handler(SIGUSR1);
  EXPECT_EQ(handler.signum(), SIGUSR1);
  EXPECT_FALSE(handler.received());
  // raise() runs the handler on this thread before it returns.
  ASSERT_EQ(raise(SIGUSR1), 0);
  EXPECT_TRUE(handler.received());
}

TEST(ExitSignalHandler, ANewHandlerStartsUnreceived) {
  {
    ExitSignalHandler handler(SIGUSR1);
    raise(SIGUSR1);
    ASSERT_TRUE(handler.received());
  }
  ExitSignalHandler handler(SIGUSR1);
  EXPECT_FALSE(handler.received());
}

TEST(ExitSignalHandler, OnlyOneAtATime) {
  ExitSignalHandler handler(SIGUSR1);
  EXPECT_THROW(ExitSignalHandler(SIGUSR2), InternalError);
  // The failed construction must not have released the first one's claim.
  EXPECT_THROW(ExitSignalHandler(SIGUSR1), InternalError);
}

TEST(ExitSignalHandler, RejectsASignalItDoesNotAccept) {
  EXPECT_THROW(ExitSignalHandler(SIGSEGV), InternalError);
  ExitSignalHandler handler(SIGUSR1);  // and the rejection left no claim behind
}

volatile sig_atomic_t g_test_handler_calls = 0;
void count_test_signal(int) {
  g_test_handler_calls = g_test_handler_calls + 1;
}

TEST(ExitSignalHandler, DestructorRestoresThePreviousHandler) {
  struct sigaction mine {
  }, before{};
  mine.sa_handler = count_test_signal;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &mine, &before), 0);
  g_test_handler_calls = 0;
  {
    ExitSignalHandler handler(SIGUSR2);
    raise(SIGUSR2);
    EXPECT_TRUE(handler.received());
    EXPECT_EQ(g_test_handler_calls, 0);  // ours was replaced, not chained
  }
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGUSR2, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &count_test_signal);
  raise(SIGUSR2);
  EXPECT_EQ(g_test_handler_calls, 1);
  sigaction(SIGUSR2, &before, nullptr);
}

TEST(ExitSignalHandlerDeathTest, SecondSignalKillsWithoutSaving) {
  EXPECT_EXIT(
      {
        ExitSignalHandler handler(SIGUSR2);
        raise(SIGUSR2);  // first: only the flag
        if (!handler.received()) _exit(3);
        raise(SIGUSR2);  // second: the process dies of the signal here
        _exit(4);
      },
      testing::KilledBySignal(SIGUSR2),
      "received the exit signal a second time: exiting without saving");
}

}  // namespace
}  // namespace megatron
