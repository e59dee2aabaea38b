package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// Shared is one Nomad agent for all the tests of a test binary that need
// no more than a server's HTTP API (parsing jobspecs with /v1/jobs/parse,
// validating, planning on an empty cluster), so they do not pay an agent
// start each. It starts on first use, so a run of other tests pays
// nothing, and is stopped by Main after the tests (or by Close):
//
//	var nomad = harness.NewShared(harness.Options{Mode: harness.ModeServer})
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m, nomad)) }
//
//	func TestX(t *testing.T) { c := nomad.Agent(t).Client; ... }
//
// Tests must leave the shared agent as they found it (purge what they
// register); it is not reset between tests.
type Shared struct {
	opts  Options
	once  sync.Once
	agent *Agent
	err   error
	host  *sharedHost
}

// NewShared describes a shared agent; nothing starts until Agent is
// called. Options are those of StartAgent; ModeServer starts in seconds
// and needs no plugins.
func NewShared(opts Options) *Shared {
	return &Shared{opts: opts, host: &sharedHost{name: "shared-agent"}}
}

// Agent returns the shared agent, starting it on the first call; it
// fails t when the agent cannot start (every later call fails the same
// way, without a second try).
func (s *Shared) Agent(t testing.TB) *Agent {
	t.Helper()
	s.once.Do(func() { s.agent, s.err = s.start() })
	if s.err != nil {
		t.Fatalf("shared nomad agent: %v", s.err)
	}
	return s.agent
}

func (s *Shared) start() (*Agent, error) {
	opts := s.opts
	if opts.NomadBin == "" {
		if opts.NomadVersion == "" {
			opts.NomadVersion = NomadVersion
		}
		bin, err := nomadBinary(context.Background(), opts.NomadVersion, s.host.Logf)
		if err != nil {
			return nil, err
		}
		opts.NomadBin = bin
	}
	if opts.PluginDir == "" && opts.Mode != ModeServer {
		return nil, errors.New("harness: a Shared agent other than a ModeServer one needs Options.PluginDir")
	}
	return startAgent(s.host, opts)
}

// Close stops the agent, if it was started, and removes what it left;
// it returns what went wrong meanwhile (the agent log's end included).
// Main calls it for the Shared agents it is given.
func (s *Shared) Close() error {
	s.once.Do(func() { s.err = errors.New("closed before first use") }) // no start after Close
	s.host.runCleanups()
	if s.host.Failed() {
		return fmt.Errorf("shared nomad agent: %s", strings.Join(s.host.errs, "; "))
	}
	return nil
}

// sharedHost stands in for a test for a Shared agent: it logs to stderr,
// collects errors, and runs cleanups on Close.
type sharedHost struct {
	name     string
	mu       sync.Mutex
	cleanups []func()
	errs     []string
}

func (h *sharedHost) Helper()      {}
func (h *sharedHost) Name() string { return h.name }

func (h *sharedHost) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "e2e harness: %s: %s\n", h.name, fmt.Sprintf(format, args...))
}

func (h *sharedHost) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.mu.Lock()
	h.errs = append(h.errs, msg)
	h.mu.Unlock()
	h.Logf("%s", msg)
}

func (h *sharedHost) Failed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.errs) > 0
}

func (h *sharedHost) Cleanup(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups = append(h.cleanups, f)
}

// runCleanups runs the cleanups last registered first, as testing does.
func (h *sharedHost) runCleanups() {
	h.mu.Lock()
	fs := h.cleanups
	h.cleanups = nil
	h.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
