package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/e2e/harness"
)

// nomad is one server-only Nomad agent for the package's tests against
// the real Variables API; it starts on first use and harness.Main stops
// it and checks that nothing is left behind.
var nomad = harness.NewShared(harness.Options{Name: "state-vars", Mode: harness.ModeServer})

func TestMain(m *testing.M) { os.Exit(harness.Main(m, nomad)) }

// The Variables store against a real Nomad server: a state of several
// chunks, the journal across segments, two replicas saving and appending
// at once while a third reads, and the fence.
func TestVariablesAgainstNomad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Nomad agent; skipped with -short")
	}
	client := nomad.Agent(t).Client
	ctx := context.Background()
	const prefix = "hadar-test/state"
	// A server that just elected itself answers variable writes with
	// "keyring has not been initialized yet" for a moment.
	err := harness.Eventually(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		_, _, err := client.Variables().Update(&api.Variable{Path: prefix + "/probe", Items: api.VariableItems{"ready": "yes"}}, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	client.Variables().Delete(prefix+"/probe", nil)
	t.Cleanup(func() { // leave the shared agent as found
		vs, _, err := client.Variables().PrefixList(prefix+"/", nil)
		if err != nil {
			t.Error(err)
		}
		for _, v := range vs {
			client.Variables().Delete(v.Path, nil)
		}
	})
	open := func() *Variables {
		v := NewVariables(client, "", prefix)
		v.segSize = 16
		t.Cleanup(func() { v.Close() })
		return v
	}
	a, b, r := open(), open(), open()

	big := savedOf(t, 2*ChunkBytes+5000, "big", 1)
	if err := a.Save(ctx, big); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, r); !reflect.DeepEqual(got, big) {
		t.Fatalf("loaded %q, want the 3-chunk state", tagOf(got))
	}

	// Two replicas save at once, 6 times each, while a third reads: every
	// save wins or loses whole, every read is a whole state.
	var mu sync.Mutex
	saved := map[string]*Saved{"big": big}
	var won []string
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, s := range []*Variables{a, b} {
		wg.Go(func() {
			for i := range 6 {
				st := savedOf(t, ChunkBytes+1000*i, fmt.Sprintf("%s%d", s.writer, i), 1)
				mu.Lock()
				saved[tagOf(st)] = st
				mu.Unlock()
				err := s.Save(ctx, st)
				if err != nil && !errors.Is(err, ErrConflict) {
					t.Errorf("save: %v", err)
				}
				if err == nil {
					mu.Lock()
					won = append(won, tagOf(st))
					mu.Unlock()
				}
			}
		})
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, err := r.Load(ctx)
			mu.Lock()
			want := saved[tagOf(got)]
			mu.Unlock()
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("concurrent load: %q, %v", tagOf(got), err)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-readerDone
	got := mustLoad(t, r)
	if len(won) == 0 || !slices.Contains(won, tagOf(got)) {
		t.Fatalf("loaded %q; saves that won: %v", tagOf(got), won)
	}
	t.Logf("%d of 12 racing saves won", len(won))

	// Both append at once, across segments: unique, gap-free.
	seqOf := map[string]uint64{}
	for _, s := range []*Variables{a, b} {
		for w := range 4 {
			wg.Go(func() {
				for i := range 10 {
					job := fmt.Sprintf("%s-%d-%d", s.writer, w, i)
					seq, err := s.Append(ctx, Entry{Job: job, Generation: 1})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					seqOf[job] = seq
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	es, err := r.Journal(ctx, 0)
	if err != nil || len(es) != 80 {
		t.Fatalf("journal: %d entries, %v", len(es), err)
	}
	for i, e := range es {
		if e.Seq != uint64(i+1) || seqOf[e.Job] != e.Seq {
			t.Fatalf("entry %d: seq %d for %s (Append said %d)", i, e.Seq, e.Job, seqOf[e.Job])
		}
	}

	// A new leader (generation 2) fences the old one out.
	if err := b.Save(ctx, savedOf(t, 100, "leader2", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Append(ctx, Entry{Job: "leader2", Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if err := a.Save(ctx, savedOf(t, 100, "deposed", 1)); !errors.Is(err, ErrFenced) {
		t.Fatalf("deposed leader's save: %v", err)
	}
	if _, err := a.Append(ctx, Entry{Job: "deposed", Generation: 1}); !errors.Is(err, ErrFenced) {
		t.Fatalf("deposed leader's append: %v", err)
	}
	if got := mustLoad(t, r); tagOf(got) != "leader2" {
		t.Fatalf("loaded %q", tagOf(got))
	}
	chunks, _, err := client.Variables().PrefixList(prefix+"/state/", nil)
	if err != nil || len(chunks) != 1 {
		t.Fatalf("chunks left: %d, %v", len(chunks), err)
	}
}
