//go:build tools

// Package tools pins the Consul agent the e2e tests run (the sidecar's
// Consul leader lock): `make consul` builds bin/consul from it.
package tools

import _ "github.com/hashicorp/consul"
