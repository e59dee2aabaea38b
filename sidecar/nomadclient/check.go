package nomadclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/hashicorp/go-version"
	"github.com/hashicorp/nomad/api"
)

// The Nomad releases hadar works with (docs/deploy.md, "Nomad versions").
const (
	// MinimumVersion is the oldest Nomad the sidecar starts against: it
	// needs Variables locks (leader election and the shared state store,
	// 1.7), workload identities with a TTL that Nomad renews (1.7), node
	// pools (feasibility, 1.6) and the event stream (1.0).
	MinimumVersion = "1.7.0"
)

// Tested are the release lines hadar's tests run against: 1.10 (long-term
// support) and 1.11. Others at or above MinimumVersion run with a
// warning.
func Tested() []string { return []string{"1.10", "1.11"} }

// Server is one Nomad server and its release.
type Server struct {
	Name    string
	Version string
}

// Report is what Inspect found.
type Report struct {
	Region  string
	Servers []Server
	// Oldest is the oldest release among the region's live servers: the
	// one a feature must exist in (during a rolling upgrade they differ).
	Oldest string
	// Refused says why hadar cannot work with this Nomad ("" when it can).
	Refused string
	// Warning says what is untested ("" when every server runs a tested
	// release line).
	Warning string
}

// Check reads the release of every live Nomad server of the client's
// region and refuses a Nomad hadar cannot work with, saying why and what
// to do. It needs node read (GET /v1/agent/members), which the sidecar's
// policy grants.
func Check(ctx context.Context, c *api.Client) error {
	r, err := Inspect(ctx, c)
	if err != nil {
		return err
	}
	if r.Refused != "" {
		return errors.New(r.Refused)
	}
	return nil
}

// Inspect is Check's reading, with the warning for an untested release.
func Inspect(ctx context.Context, c *api.Client) (Report, error) {
	m, err := c.Agent().MembersOpts((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		var ue api.UnexpectedResponseError
		if errors.As(err, &ue) && ue.StatusCode() == http.StatusForbidden {
			return Report{}, fmt.Errorf("reading Nomad's server versions (GET /v1/agent/members): permission denied: the token needs node read (node { policy = \"read\" }, as in docs/acl/hadar-sidecar.nomad.hcl): %w", err)
		}
		return Report{}, fmt.Errorf("reading Nomad's server versions (GET /v1/agent/members at %s): %w", c.Address(), err)
	}
	return assess(m), nil
}

// assess applies the support rules to a members answer.
func assess(m *api.ServerMembers) Report {
	r := Report{Region: m.ServerRegion}
	var oldest *version.Version
	for _, mem := range m.Members {
		if mem == nil || mem.Status != "alive" || (r.Region != "" && mem.Tags["region"] != "" && mem.Tags["region"] != r.Region) {
			continue
		}
		build := mem.Tags["build"]
		r.Servers = append(r.Servers, Server{Name: mem.Name, Version: build})
		v, err := version.NewVersion(strings.SplitN(build, "+", 2)[0])
		if err != nil {
			r.Refused = fmt.Sprintf("Nomad server %s reports release %q, which hadar cannot read: it needs Nomad %s or later", mem.Name, build, MinimumVersion)
			continue
		}
		if oldest == nil || v.Core().LessThan(oldest.Core()) {
			oldest = v
			r.Oldest = build
		}
	}
	sort.Slice(r.Servers, func(i, j int) bool { return r.Servers[i].Name < r.Servers[j].Name })
	if len(r.Servers) == 0 {
		r.Refused = fmt.Sprintf("Nomad lists no live server in region %q (GET /v1/agent/members): hadar needs a Nomad cluster with a leader", r.Region)
		return r
	}
	if r.Refused != "" || oldest == nil {
		return r
	}
	floor := version.Must(version.NewVersion(MinimumVersion))
	if oldest.Core().LessThan(floor) {
		r.Refused = fmt.Sprintf("Nomad %s (server %s) is older than %s, the oldest release hadar works with: hadar needs Variables locks (leader election, the shared state store) and renewable workload identities, both from Nomad 1.7; upgrade Nomad's servers (hadar is tested on %s)",
			r.Oldest, oldestName(r), MinimumVersion, testedLines())
		return r
	}
	seg := oldest.Segments()
	line := fmt.Sprintf("%d.%d", seg[0], seg[1])
	ok := false
	for _, t := range Tested() {
		if t == line {
			ok = true
		}
	}
	if !ok {
		r.Warning = fmt.Sprintf("Nomad %s is not a release line hadar is tested on (%s): it should work from %s on, but report what does not", r.Oldest, testedLines(), MinimumVersion)
	}
	return r
}

func oldestName(r Report) string {
	for _, s := range r.Servers {
		if s.Version == r.Oldest {
			return s.Name
		}
	}
	return "?"
}

func testedLines() string {
	lines := Tested()
	out := make([]string, len(lines))
	for i, t := range lines {
		out[i] = t + ".x"
	}
	return strings.Join(out, " and ")
}
