// Package trainer is hadar's small real-model trainer: a seeded synthetic
// classification dataset, softmax regression and a one-hidden-layer MLP,
// minibatch SGD with momentum, evaluation, parameter (de)serialization and
// HadarE parameter merging (weighted averaging by steps done).
//
// Everything is deterministic given a seed: the data, the initial
// parameters and the order in which minibatches are drawn, so a run that is
// interrupted and resumed reaches the same parameters as one that is not.
// It exists to show that HadarE merging works on a real model; the process
// that implements docs/training-contract.md lives in trainer/run.
package trainer
