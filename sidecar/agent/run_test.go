package agent

import (
	"context"
	"errors"
	"testing"
)

// A sidecar stopped just after it started: the watcher's nil return and
// ctx.Done race in Run's select, and the watcher's side used to win half
// the time with "watcher: %!w(<nil>)". Stopping is no error; a watcher
// that ends on its own while the sidecar runs is one, with its reason.
func TestWatcherEnded(t *testing.T) {
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	running := context.Background()
	cause := errors.New("event stream: 403")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want string // "" = nil
	}{
		{"stopping, watcher ended cleanly", stopped, nil, ""},
		{"stopping, watcher's error", stopped, cause, ""},
		{"running, watcher's error", running, cause, "watcher: event stream: 403"},
		{"running, watcher ended without a reason", running, nil, "watcher: stopped without an error while the sidecar runs"},
	} {
		got := watcherEnded(tc.ctx, tc.err)
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("%s: %v, want nil", tc.name, got)
		case tc.want != "" && (got == nil || got.Error() != tc.want):
			t.Errorf("%s: %v, want %q", tc.name, got, tc.want)
		}
	}
	if got := watcherEnded(running, cause); !errors.Is(got, cause) {
		t.Errorf("the watcher's error is not wrapped: %v", got)
	}
}
