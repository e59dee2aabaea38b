//go:build tools

// Package tools pins the Nomad version the e2e tests run against. The
// module exists only so `go build github.com/hashicorp/nomad` can honour the
// replace directives Nomad's own go.mod needs (go install refuses them).
package tools

import _ "github.com/hashicorp/nomad"
