// Package netmodel prices where a distributed training job's GPUs sit.
//
// A Topology describes GPUs in nodes, nodes in racks behind top-of-rack
// switches, and racks under one spine, with a bandwidth and latency per
// level, oversubscribed rack uplinks and background congestion that may
// change over time. A JobComm describes one job's communication: bytes
// all-reduced per iteration, the compute time of one iteration on each GPU
// type, and how much of that compute can hide communication. From the two,
// IterationTime, Slowdown and Sensitivity price a placement in well under a
// microsecond per worker, so a scheduler can price every candidate.
//
// The package is pure: no Nomad import, no global state, no I/O beyond the
// loaders that take a reader or a path. Topologies come from a JSON file
// (ParseTopology, LoadTopologyFile) or from Nomad-style node descriptions
// (FromNodes). Calibrate fits the model's free parameters to Gavel's
// consolidated versus unconsolidated throughputs; docs/netmodel.md holds the
// file format, the defaults and the fit.
package netmodel
