package device

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hadar-sched/hadar/driver/device/nvml"
	"github.com/hadar-sched/hadar/driver/plugin"
)

// Group attribute names; jobspecs constrain on ${device.attr.<name>}.
const (
	attrMemory            = "memory"
	attrComputeCapability = "compute_capability"
	attrDriverVersion     = "driver_version"
	attrNvLinkDomains     = "nvlink_domains"
	attrNvLinkDomainSize  = "nvlink_domain_size"
	attrSwitchDomains     = "pcie_switch_domains"
	attrSource            = "source"
	attrHealthy           = "healthy_gpus"

	// Units Nomad knows (it rejects a device group with any other).
	unitMiB = "MiB"
	unitW   = "W"
)

// buildGroups makes one device group per model. Nomad fills a device
// request from a single group, so a group must hold interchangeable GPUs.
// Topology is per GPU while attributes are per group: it is reported as
// the group's NVLink and PCIe-switch domains (connected components,
// "id,id;id,id") and the size of its largest NVLink domain, which a
// jobspec can constrain on (${device.attr.nvlink_domain_size} >= 4).
func buildGroups(gpus []nvml.GPU) []*plugin.DeviceGroup {
	byModel := map[string][]nvml.GPU{}
	for _, g := range gpus {
		byModel[g.Model] = append(byModel[g.Model], g)
	}
	models := make([]string, 0, len(byModel))
	for m := range byModel {
		models = append(models, m)
	}
	sort.Strings(models)
	groups := make([]*plugin.DeviceGroup, 0, len(models))
	for _, m := range models {
		members := byModel[m]
		sort.Slice(members, func(i, j int) bool { return members[i].ID < members[j].ID })
		first := members[0]
		grp := &plugin.DeviceGroup{
			Vendor: vendor,
			Type:   deviceType,
			Name:   m,
			Attributes: map[string]plugin.Attribute{
				attrMemory: plugin.IntAttr(first.MemoryMiB, unitMiB),
			},
		}
		if first.ComputeCapability != "" {
			grp.Attributes[attrComputeCapability] = plugin.StringAttr(first.ComputeCapability)
		}
		if first.DriverVersion != "" {
			grp.Attributes[attrDriverVersion] = plugin.StringAttr(first.DriverVersion)
		}
		source := "nvml"
		if first.DriverVersion == "declared" {
			source = "declared"
		}
		grp.Attributes[attrSource] = plugin.StringAttr(source)
		nv := domains(members, func(g nvml.GPU) []string { return g.NvLinkPeers })
		sw := domains(members, func(g nvml.GPU) []string { return g.SwitchPeers })
		largest := 0
		for _, d := range nv {
			if len(d) > 1 && len(d) > largest {
				largest = len(d)
			}
		}
		grp.Attributes[attrNvLinkDomainSize] = plugin.IntAttr(int64(largest), "")
		// Nomad leaves device health out of a node's computed class but
		// not group attributes: a blocked evaluation that found too few
		// healthy GPUs is woken only when the class changes, so the count
		// of healthy GPUs is published to change it.
		healthy := 0
		for _, g := range members {
			if g.Healthy {
				healthy++
			}
		}
		grp.Attributes[attrHealthy] = plugin.IntAttr(int64(healthy), "")
		if s := formatDomains(nv); s != "" {
			grp.Attributes[attrNvLinkDomains] = plugin.StringAttr(s)
		}
		if s := formatDomains(sw); s != "" {
			grp.Attributes[attrSwitchDomains] = plugin.StringAttr(s)
		}
		for _, g := range members {
			grp.Devices = append(grp.Devices, &plugin.Device{ID: g.ID, Healthy: g.Healthy, HealthDesc: g.HealthDesc, PCIBusID: g.PCIBusID})
		}
		groups = append(groups, grp)
	}
	return groups
}

// domains returns the connected components of the peer relation among
// members (peers outside the group are ignored), each sorted, components
// ordered by their first ID.
func domains(members []nvml.GPU, peers func(nvml.GPU) []string) [][]string {
	in := map[string]bool{}
	for _, g := range members {
		in[g.ID] = true
	}
	adj := map[string][]string{}
	for _, g := range members {
		for _, q := range peers(g) {
			if in[q] {
				adj[g.ID] = append(adj[g.ID], q)
				adj[q] = append(adj[q], g.ID)
			}
		}
	}
	seen := map[string]bool{}
	var out [][]string
	for _, g := range members {
		if seen[g.ID] {
			continue
		}
		var comp []string
		stack := []string{g.ID}
		seen[g.ID] = true
		for len(stack) > 0 {
			id := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			comp = append(comp, id)
			for _, q := range adj[id] {
				if !seen[q] {
					seen[q] = true
					stack = append(stack, q)
				}
			}
		}
		sort.Strings(comp)
		out = append(out, comp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

// formatDomains writes the domains with more than one GPU; "" when none.
func formatDomains(ds [][]string) string {
	var parts []string
	for _, d := range ds {
		if len(d) > 1 {
			parts = append(parts, strings.Join(d, ","))
		}
	}
	return strings.Join(parts, ";")
}

// groupsKey is a stable rendering of the groups, to tell whether a new
// fingerprint carries news.
func groupsKey(groups []*plugin.DeviceGroup) string {
	var b strings.Builder
	for _, g := range groups {
		fmt.Fprintf(&b, "%s|", g.Name)
		keys := make([]string, 0, len(g.Attributes))
		for k := range g.Attributes {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s=%s|", k, g.Attributes[k])
		}
		for _, d := range g.Devices {
			fmt.Fprintf(&b, "%s:%v:%s|", d.ID, d.Healthy, d.HealthDesc)
		}
		b.WriteString("\n")
	}
	return b.String()
}
