package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// fakeACL is a Nomad that knows the tokens in good (client tokens with
// node read) and counts the token lookups it is asked.
type fakeACL struct {
	mu      sync.Mutex
	good    map[string]bool
	lookups map[string]int
}

func (f *fakeACL) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok := r.Header.Get("X-Nomad-Token")
	f.mu.Lock()
	ok := f.good[tok]
	if r.URL.Path == "/v1/acl/token/self" {
		f.lookups[tok]++
	}
	f.mu.Unlock()
	if !ok {
		http.Error(w, "ACL token not found", http.StatusForbidden)
		return
	}
	switch r.URL.Path {
	case "/v1/acl/token/self":
		json.NewEncoder(w).Encode(api.ACLToken{SecretID: tok, Type: "client", Policies: []string{"p"}})
	case "/v1/nodes":
		w.Write([]byte("[]"))
	default:
		http.Error(w, "job not found", http.StatusNotFound)
	}
}

func (f *fakeACL) count(tok string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if tok != "" {
		return f.lookups[tok]
	}
	n := 0
	for _, c := range f.lookups {
		n += c
	}
	return n
}

// A flood of unseen tokens costs Nomad a bounded number of lookups, is
// answered 429 with Retry-After once over the limit, does not evict the
// grant of a caller in use, and does not block that caller's refresh when
// its answer expires (issue #31, item 6).
func TestNomadTokensFlood(t *testing.T) {
	const caller = "11111111-aaaa-4bbb-8ccc-000000000001"
	fake := &fakeACL{good: map[string]bool{caller: true}, lookups: map[string]int{}}
	ts := httptest.NewServer(fake)
	defer ts.Close()
	client, err := api.NewClient(&api.Config{Address: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	checker := NewNomadTokens(client)
	now := time.Unix(1_700_000_000, 0)
	checker.clock = func() time.Time { return now }
	h := New(scenario(), Options{Auth: Auth{Nomad: checker}}).Handler()
	ctx := context.Background()

	if _, err := checker.access(ctx, caller); err != nil {
		t.Fatalf("the caller's token: %v", err)
	}
	flood := 8 * maxGrants
	limited := 0
	for i := 0; i < flood; i++ {
		tok := fmt.Sprintf("%08x-flood-4000-8000-%012x", i, i)
		_, err := checker.access(ctx, tok)
		var ae authError
		if !errors.As(err, &ae) {
			t.Fatalf("token %d: %v, want a refusal", i, err)
		}
		if ae.code == http.StatusTooManyRequests {
			limited++
		}
		// The caller polls between the flood's requests.
		if i%100 == 0 {
			if _, err := checker.access(ctx, caller); err != nil {
				t.Fatalf("the caller during the flood: %v", err)
			}
		}
	}
	if _, err := checker.access(ctx, caller); err != nil {
		t.Fatalf("the caller after the flood: %v", err)
	}
	if got := fake.count(caller); got != 1 {
		t.Errorf("the caller's token was looked up %d times during the flood: its grant was evicted", got)
	}
	if got := fake.count("") - 1; got > lookupBurst {
		t.Errorf("a flood of %d unseen tokens in one instant cost Nomad %d lookups, want at most %d", flood, got, lookupBurst)
	}
	if limited == 0 {
		t.Errorf("no unseen token was refused with 429")
	}

	// Over the limit, the API answers 429 with Retry-After.
	code, hdr, body := request(t, h, "/v1/status", bearer("22222222-bbbb-4ccc-8ddd-000000000002"))
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Errorf("an unseen token over the limit: %d, Retry-After %q: %.200s", code, hdr.Get("Retry-After"), body)
	}

	// A refused token retried is answered from the cache.
	now = now.Add(time.Minute)
	bad := "33333333-cccc-4ddd-8eee-000000000003"
	for i := 0; i < 5; i++ {
		if _, err := checker.access(ctx, bad); err == nil || !strings.Contains(err.Error(), "not one Nomad accepts") {
			t.Fatalf("a bad token: %v", err)
		}
	}
	if got := fake.count(bad); got != 1 {
		t.Errorf("a refused token retried 5 times cost %d lookups, want 1", got)
	}

	// The caller's answer expires while a flood holds the limit: its
	// refresh still goes to Nomad.
	for i := 0; i < 4*lookupBurst; i++ {
		checker.access(ctx, fmt.Sprintf("%08x-again-4000-8000-%012x", i, i))
	}
	before := fake.count(caller)
	if code, hdr, body := request(t, h, "/v1/status", bearer(caller)); code != http.StatusOK {
		t.Errorf("the caller after its answer expired, during a flood: %d %q %.200s", code, hdr.Get("Retry-After"), body)
	}
	if got := fake.count(caller); got != before+1 {
		t.Errorf("the caller's expired answer was refreshed with %d lookups, want 1", got-before)
	}
}

// A full cache drops an expired grant first, then a newcomer's, and a
// caller that came back only once no newcomer is left.
func TestNomadTokensEvictsNewcomersFirst(t *testing.T) {
	n := NewNomadTokens(nil)
	now := time.Unix(1_700_000_000, 0)
	key := func(i int) [32]byte { return [32]byte{byte(i), byte(i >> 8), 1} }
	for i := 0; i < maxGrants; i++ {
		n.grants[key(i)] = &grant{expires: now.Add(time.Minute), used: now.Add(time.Duration(i) * time.Millisecond), returned: i < 10}
	}
	n.grants[key(500)].expires = now
	n.evict(now)
	if _, ok := n.grants[key(500)]; ok {
		t.Fatal("an expired grant kept over live ones")
	}
	for i := 0; i < maxGrants-20; i++ {
		n.evict(now)
	}
	for i := 0; i < 10; i++ {
		if _, ok := n.grants[key(i)]; !ok {
			t.Fatalf("returning caller %d evicted while newcomers were left (%d grants)", i, len(n.grants))
		}
	}
}
