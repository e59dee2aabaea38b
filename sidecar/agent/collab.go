package agent

import (
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/planner/belief"
	"github.com/hadar-sched/hadar/planner/profile"
	"github.com/hadar-sched/hadar/planner/speed"
	"github.com/hadar-sched/hadar/sidecar/apply"
	"github.com/hadar-sched/hadar/sidecar/config"
	"github.com/hadar-sched/hadar/sidecar/feasible"
	"github.com/hadar-sched/hadar/sidecar/watch"
)

// collaborators are what the agent works through: the Nomad client, the
// watcher's view of the cluster, the applier that writes decisions, where
// each job may run by Nomad's own placement rules (feas, cached across
// cycles), the beliefs the engine's speed model reads (the throughput
// profile and the network model) and the GPU types the configuration
// names. Each is built once, by New, and never replaced: the agent's
// state is what it does with them, not which ones it has.
type collaborators struct {
	client  *api.Client
	watcher *watch.Watcher
	applier *apply.Applier // set by New: it writes under the agent's fence
	feas    *feasible.Evaluator
	prof    *belief.Profile
	net     *belief.Network
	types   config.GPUTypes
}

// newCollaborators builds all but the applier from a resolved
// configuration: the profile (config profile, else the default) with its
// overlay loaded by overlay before the network model reads it. It does
// not contact Nomad.
func newCollaborators(cfg config.Config, client *api.Client, logger hclog.Logger, overlay func(*belief.Profile) error) (collaborators, error) {
	var base speed.Profile = profile.Default()
	if cfg.Profile != "" {
		p, err := profile.Load(cfg.Profile)
		if err != nil {
			return collaborators{}, fmt.Errorf("sidecar config: profile: %w", err)
		}
		base = p
	}
	w, err := watch.New(client, watch.Config{Namespaces: cfg.Namespaces, RackMetaKey: cfg.RackMetaKey}, logger)
	if err != nil {
		return collaborators{}, err
	}
	c := collaborators{client: client, watcher: w, types: config.NewGPUTypes(cfg.GPUTypes), prof: belief.NewProfile(base)}
	c.feas = feasible.NewEvaluator(c.types.Type)
	if err := overlay(c.prof); err != nil {
		return collaborators{}, err
	}
	if c.net, err = belief.NewNetwork(c.prof, nil); err != nil {
		return collaborators{}, fmt.Errorf("sidecar: the network model: %w", err)
	}
	return c, nil
}
