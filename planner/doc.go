// Package planner holds the data model shared by hadar's scheduling
// policies, its round mechanism and its trace-driven simulator.
//
// The planner is a pure library: it never imports Nomad. GPU types are data
// (any name, any number of them), never constants.
package planner
