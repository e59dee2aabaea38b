//go:build tools

// Package tools pins Nomad 1.10.5, the long-term-support line, as a second
// Nomad the e2e tests can run against (e2e/harness, NomadVersion). Like
// e2e/tools/nomad, the module exists only so `go build
// github.com/hashicorp/nomad` honours the replace directives Nomad's go.mod
// needs; the main module never imports it.
package tools

import _ "github.com/hashicorp/nomad"
