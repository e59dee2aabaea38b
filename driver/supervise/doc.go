// Package supervise runs a task's program under a supervisor process of
// its own that outlives the driver: hadar-train's replacement for Nomad's
// executor, with no Nomad code.
//
// Start writes a Spec into the task's state directory and re-executes
// the driver's binary as "<binary> supervise <spec-file>" (the binary's
// main hands those arguments to Main) in a new session, so a plugin that
// restarts or crashes takes neither the supervisor nor the task with it.
// The supervisor:
//
//   - opens the task's stdout and stderr (Nomad's FIFOs),
//   - creates the task's cgroup (or uses the one Nomad's client made) and
//     sets its limits (package cgroup: v2, or v1 on hybrid hosts),
//   - starts the program inside that cgroup, in its own process group, as
//     the task's uid, gid and exactly the given supplementary groups,
//     never root unless the spec allows it,
//   - reports to Start that the program runs, or why it could not
//     start, and waits for Start's acknowledgement (without one, the
//     starter died or gave up, and it kills the task: nothing is left
//     that nobody knows of),
//   - waits for the program, kills what is left in its cgroup, records
//     the result (exit code, signal, OOM kill from the cgroup's counter,
//     times) atomically in the state directory, removes the cgroup it
//     made and exits.
//
// The driver holds a Handle. Its State (pids with their start times, so a
// reused pid is never taken for the task, the cgroup, the state
// directory) is what the driver persists; Attach rebuilds a Handle from
// it after a restart. Waiting is poll(2) on pidfds, for the supervisor
// and the program alike, whether or not they are children of the waiter.
//
// Linux only: pidfds (5.3), and on cgroup v2 clone3 into a cgroup (5.7).
package supervise
