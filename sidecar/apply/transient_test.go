package apply

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hashicorp/nomad/api"
)

// newUnexpected is the error the Nomad API client returns for an answer
// of code: a real one, from a server that answers so.
func newUnexpected(t *testing.T, code int, body string) error {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, body, code) }))
	defer srv.Close()
	c, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Jobs().Info("x", nil)
	if err == nil {
		t.Fatalf("a %d answer gave no error", code)
	}
	return err
}

func TestIsTransient(t *testing.T) {
	resp := func(code int) error {
		// What the Nomad API client returns, wrapped as apply wraps it.
		return fmt.Errorf("job default/x: registering the start write: %w", newUnexpected(t, code, "boom"))
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"500", resp(500), true},
		{"503", resp(503), true},
		{"429", resp(429), true},
		{"400: the write itself", resp(400), false},
		{"404", resp(404), false},
		{"check-and-set conflict", fmt.Errorf("x: %w", newUnexpected(t, 500, "conflicting job modify index")), false},
		{"no answer", fmt.Errorf("x: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), true},
		{"not an API error", errors.New("placement refused"), false},
		{"nil", nil, false},
	} {
		if got := IsTransient(tc.err); got != tc.want {
			t.Errorf("%s: IsTransient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
