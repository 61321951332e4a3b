#pragma once

// Notice of preemption for a training loop: the signals a scheduler sends before it
// kills a job (SIGTERM from Slurm, Kubernetes and torchelastic; Slurm's --signal may
// add another, such as SIGUSR1) set a flag that the loop reads at each step boundary,
// instead of ending the process mid-step.
//
//   dist::PreemptionNotice notice(dist::PreemptionOptions().grace(std::chrono::seconds(30)));
//   for (step = first_step; step <= steps; ++step) {
//     train_step(step);
//     manager.save(step, state);
//     if (notice.agreed(group)) {      // every rank, the same step
//       manager.save_now(step, state);  // commits before it returns
//       notice.disarm();                // later signals are ignored: the job is ending
//       return kPreempted;
//     }
//   }
//
// With a group, agreed() is collective: every rank learns at the same step that some
// rank got notice, so every rank saves that step even when one alone was signalled.
// A second notice signal ends the process at once, as the signal's default action
// (status 128 + signal), and so does the grace deadline: a save cut short that way is
// simply not committed (dcp commits a checkpoint by writing its metadata last).
//
// REQUIRES: one PreemptionNotice at a time per process (signal dispositions are
// process-wide).

#include <stowage/dist/process_group.h>

#include <torch/arg.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <vector>

namespace stowage::dist {

// How a preempted process exits, the step it ended on committed (train::Trainer::finish()
// returns it): EX_TEMPFAIL, the job is not done and may be retried, which is what a
// scheduler that requeues preempted jobs (Kubernetes' restart policy, torchelastic) needs
// to see.
inline constexpr int kPreemptedStatus = 75;

struct PreemptionOptions {
  // The signals that give notice (SIGTERM, SIGUSR1, ...), each caught while the notice
  // lives. SIGKILL and SIGSTOP cannot be caught.
  TORCH_ARG(std::vector<int>, signals) = std::vector<int>{SIGTERM};
  // A second notice signal ends the process at once (the escape from a save that hangs).
  TORCH_ARG(bool, second_signal_exits) = true;
  // After the first notice the process ends this much later, if it is still running,
  // after a line on stderr; zero: no deadline.
  TORCH_ARG(std::chrono::milliseconds, grace) = std::chrono::milliseconds(0);
};

class PreemptionNotice {
 public:
  // Catches the options' signals. Throws InvalidArgument for a signal that cannot be
  // caught, a negative grace, or while another notice lives.
  explicit PreemptionNotice(PreemptionOptions options = {});
  // Gives the signals back their previous handlers.
  ~PreemptionNotice();

  PreemptionNotice(const PreemptionNotice&) = delete;
  PreemptionNotice& operator=(const PreemptionNotice&) = delete;

  // Whether this process has notice: a notice signal arrived, notify() was called, or
  // agreed() learnt of another rank's.
  bool received() const;
  // The signal of the first notice (notify()'s argument); 0 before any.
  int signal_number() const;
  // Gives notice as if `signal` had arrived (a scheduler's API, a test), unless notice
  // was given already: it never ends the process.
  void notify(int signal);
  // Whether any rank of `group` has notice, the same answer on every rank; collective:
  // every rank calls it at the same point. A rank without notice of its own then has
  // it, with the lowest signal any rank got. Without a group, received().
  bool agreed(const std::optional<ProcessGroup>& group) const;
  // The job is ending on its own terms (its final checkpoint committed): later notice
  // signals are ignored and the grace deadline no longer applies.
  void disarm();

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

}  // namespace stowage::dist
