package profile

import (
	_ "embed"
	"fmt"
	"sync"
)

// The Gavel figures, converted to hadar's own format by
// TestEmbeddedMatchesGavel -update (see data/README.md). MIT licence in
// data/LICENSE.gavel.
var (
	//go:embed data/gavel-simulation.json
	gavelSimulationJSON []byte
	//go:embed data/gavel-physical.json
	gavelPhysicalJSON []byte
)

// Parsed once on first use; a Profile is immutable, so sharing it is safe.
var (
	defaultProfile  = sync.OnceValue(func() *Profile { return mustParseEmbedded("data/gavel-simulation.json", gavelSimulationJSON) })
	physicalProfile = sync.OnceValue(func() *Profile { return mustParseEmbedded("data/gavel-physical.json", gavelPhysicalJSON) })
)

// Default returns Gavel's simulation throughputs (simulation_throughputs.json:
// v100, p100, k80, consolidated and spread), the figures Gavel's simulator
// and hadar's use by default.
func Default() *Profile { return defaultProfile() }

// GavelPhysical returns Gavel's throughputs measured on its physical cluster
// (physical_cluster_throughputs.json).
func GavelPhysical() *Profile { return physicalProfile() }

// mustParseEmbedded panics because a bad embedded file is a build defect,
// which the package's tests catch before any release.
func mustParseEmbedded(name string, data []byte) *Profile {
	p, err := parseOwn(data)
	if err != nil {
		panic(fmt.Sprintf("profile: embedded %s: %v", name, err))
	}
	return p
}
