// Package run is the training process of docs/training-contract.md: the
// logic behind cmd/hadar-trainer, kept here so tests can drive it in
// process. It parses flags and HADAR_* environment variables, trains a
// trainer model, writes the progress file, checkpoints on cancellation
// (SIGTERM/SIGINT in the binary) and resumes from the newest checkpoint,
// paces itself to an emulated GPU speed, and merges parameters with the
// job's other HadarE copies through a shared directory.
package run
