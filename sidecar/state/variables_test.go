package state

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// savedOf is a state of n incompressible engine bytes (so n/ChunkBytes
// chunks), told apart by tag.
func savedOf(t testing.TB, n int, tag string, gen uint64) *Saved {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	return &Saved{Engine: b, Agent: json.RawMessage(fmt.Sprintf(`{"tag":%q}`, tag)), At: time.Unix(1000, 0).UTC(), Index: 7, Leader: tag, Generation: gen}
}

func tagOf(s *Saved) string {
	if s == nil {
		return "<none>"
	}
	var a struct{ Tag string }
	json.Unmarshal(s.Agent, &a)
	return a.Tag
}

func saveAsync(s Store, saved *Saved) <-chan error {
	c := make(chan error, 1)
	go func() { c <- s.Save(context.Background(), saved) }()
	return c
}

func mustLoad(t *testing.T, s Store) *Saved {
	t.Helper()
	got, err := s.Load(context.Background())
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return got
}

// chunkDirs lists the chunk directories under the fake's state/.
func chunkDirs(f *fakeVars) []string {
	var out []string
	for _, p := range f.paths("hadar/sidecar/state/") {
		d := filepath.Dir(p)
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// manifestOf decodes the manifest the fake holds.
func manifestOf(t *testing.T, f *fakeVars) manifest {
	t.Helper()
	var m manifest
	if mv := f.get("hadar/sidecar/manifest"); mv == nil {
		t.Fatal("no manifest")
	} else if err := json.Unmarshal([]byte(mv.Items["manifest"]), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestVariablesRoundTripOfALargeState(t *testing.T) {
	f := newFakeVars(t)
	v := f.store("a")
	if s := mustLoad(t, v); s != nil {
		t.Fatalf("empty store loaded %+v", s)
	}
	big := savedOf(t, 3*ChunkBytes+1000, "big", 4)
	if err := v.Save(context.Background(), big); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, v); !reflect.DeepEqual(got, big) {
		t.Fatalf("loaded %q, want the state saved", tagOf(got))
	}
	m := manifestOf(t, f)
	if m.Chunks != 4 || len(f.paths("hadar/sidecar/state/")) != 4 || m.LockGeneration != 4 || m.Leader != "big" || len(m.SHA256) != 64 {
		t.Fatalf("manifest %+v over %v", m, f.paths("hadar/sidecar/state/"))
	}
	// Another store (a restarted sidecar) reads it; its save replaces it
	// and deletes the old generation's chunks.
	w := f.store("b")
	if got := mustLoad(t, w); !reflect.DeepEqual(got, big) {
		t.Fatalf("second store loaded %q", tagOf(got))
	}
	small := savedOf(t, 100, "small", 4)
	if err := w.Save(context.Background(), small); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, v); !reflect.DeepEqual(got, small) {
		t.Fatalf("loaded %q after the second save", tagOf(got))
	}
	if dirs := chunkDirs(f); len(dirs) != 1 || len(f.paths("hadar/sidecar/state/")) != 1 {
		t.Fatalf("chunks left: %v", f.paths("hadar/sidecar/state/"))
	}
}

// Two replicas save at once: exactly one wins, the other gets ErrConflict
// and leaves nothing behind, and the state is the winner's, whole.
func TestVariablesTwoWritersRacing(t *testing.T) {
	for name, tc := range map[string]struct {
		// hold is the loser's request held while the winner saves.
		hold string
		// winnerSaves is how many saves the winner makes meanwhile.
		winnerSaves int
	}{
		// The loser writes its chunks after the winner's switch: with
		// chunk paths shared by both, it overwrote the state's chunks.
		"loser writes its chunks after the switch": {hold: `state/.*/0$`, winnerSaves: 1},
		"both wrote their chunks, one switches":    {hold: `manifest$`, winnerSaves: 1},
		"winner saves twice meanwhile":             {hold: `state/.*/1$`, winnerSaves: 2},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeVars(t)
			a, b := f.store("a"), f.store("b")
			if err := a.Save(context.Background(), savedOf(t, 100, "first", 0)); err != nil {
				t.Fatal(err)
			}
			reached, release := f.hold("b", "PUT", tc.hold)
			errc := saveAsync(b, savedOf(t, 2*ChunkBytes, "b", 0))
			<-reached
			var win *Saved
			for i := range tc.winnerSaves {
				win = savedOf(t, 3*ChunkBytes, fmt.Sprintf("a%d", i), 0)
				if err := a.Save(context.Background(), win); err != nil {
					t.Fatal(err)
				}
			}
			release()
			if err := <-errc; !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "another replica saved") {
				t.Fatalf("loser: %v", err)
			}
			for _, s := range []*Variables{a, b, f.store("c")} {
				if got := mustLoad(t, s); !reflect.DeepEqual(got, win) {
					t.Fatalf("loaded %q, want the winner's %q", tagOf(got), tagOf(win))
				}
			}
			if dirs := chunkDirs(f); len(dirs) != 1 || !strings.Contains(dirs[0], "-"+a.writer+"_") {
				t.Fatalf("chunk directories left: %v (want the winner's only)", dirs)
			}
			// The loser's next save starts from the winner's and wins.
			last := savedOf(t, 100, "b2", 0)
			if err := b.Save(context.Background(), last); err != nil {
				t.Fatal(err)
			}
			if got := mustLoad(t, a); !reflect.DeepEqual(got, last) {
				t.Fatalf("loaded %q after the loser's next save", tagOf(got))
			}
		})
	}
}

// A save deletes the chunks of older generations and of writers that died,
// never those of a save that started after its switch.
func TestVariablesSweep(t *testing.T) {
	t.Run("a crashed writer's chunks go with the next save", func(t *testing.T) {
		f := newFakeVars(t)
		a, b := f.store("a"), f.store("b")
		f.crashAfter("b", "PUT", `state/.*/1$`)
		if err := b.Save(context.Background(), savedOf(t, 3*ChunkBytes, "b", 0)); err == nil {
			t.Fatal("the crashed writer's save succeeded")
		}
		if n := len(f.paths("hadar/sidecar/state/")); n != 2 {
			t.Fatalf("%d chunks after the crash, want the 2 written", n)
		}
		if got := mustLoad(t, a); got != nil {
			t.Fatalf("a state (%q) although no save completed", tagOf(got))
		}
		s := savedOf(t, 100, "a", 0)
		if err := a.Save(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		if dirs := chunkDirs(f); len(dirs) != 1 || !strings.Contains(dirs[0], "-"+a.writer+"_") {
			t.Fatalf("chunk directories left: %v", dirs)
		}
	})
	t.Run("a newer save's chunks stay", func(t *testing.T) {
		f := newFakeVars(t)
		a, c := f.store("a"), f.store("c")
		if err := a.Save(context.Background(), savedOf(t, 100, "a0", 0)); err != nil {
			t.Fatal(err)
		}
		// a switches to its next generation, then waits before its sweep
		// while c saves the one after.
		reached, release := f.hold("a", "GET", `^hadar/sidecar/state/$`)
		errc := saveAsync(a, savedOf(t, 100, "a1", 0))
		<-reached
		cs := savedOf(t, 2*ChunkBytes, "c", 0)
		if err := c.Save(context.Background(), cs); err != nil {
			t.Fatal(err)
		}
		release()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if got := mustLoad(t, a); !reflect.DeepEqual(got, cs) {
			t.Fatalf("loaded %q, want c's state", tagOf(got))
		}
		if dirs := chunkDirs(f); len(dirs) != 1 || !strings.Contains(dirs[0], "-"+c.writer+"_") {
			t.Fatalf("chunk directories: %v", dirs)
		}
	})
}

// A reader concurrent with saves reads a whole generation, old or new.
func TestVariablesLoadDuringSave(t *testing.T) {
	for name, tc := range map[string]struct {
		// readerHold and writerHold are the requests held; the writer's
		// saves run while the reader is held, then the reader goes on
		// while the writer is held.
		readerHold, writerHold string
		saves                  int
		want                   string
	}{
		// The writer switches and deletes the chunks being read: the
		// reader sees a chunk gone, reads the manifest again and the new
		// generation.
		"the generation being read is deleted": {readerHold: `state/.*/1$`, saves: 1, want: "new1"},
		"several saves meanwhile":              {readerHold: `state/.*/2$`, saves: 3, want: "new3"},
		// The writer has written its chunks, not switched: the old state.
		"a save not switched yet": {readerHold: `state/.*/1$`, writerHold: `manifest$`, saves: 1, want: "old"},
		// A chunk of the new generation is read with the old ones:
		// caught, read again.
		"the manifest switched before the first chunk": {readerHold: `state/.*/0$`, saves: 1, want: "new1"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeVars(t)
			w, r := f.store("w"), f.store("r")
			old := savedOf(t, 3*ChunkBytes, "old", 0)
			if err := w.Save(context.Background(), old); err != nil {
				t.Fatal(err)
			}
			want := map[string]*Saved{"old": old}
			reached, release := f.hold("r", "GET", tc.readerHold)
			type result struct {
				s   *Saved
				err error
			}
			rc := make(chan result, 1)
			go func() {
				s, err := r.Load(context.Background())
				rc <- result{s, err}
			}()
			<-reached
			var werr <-chan error
			wrelease := func() {}
			for i := range tc.saves {
				s := savedOf(t, 3*ChunkBytes, fmt.Sprintf("new%d", i+1), 0)
				want[tagOf(s)] = s
				if tc.writerHold != "" {
					var wreached <-chan struct{}
					wreached, wrelease = f.hold("w", "PUT", tc.writerHold)
					werr = saveAsync(w, s)
					<-wreached
					continue
				}
				if err := w.Save(context.Background(), s); err != nil {
					t.Fatal(err)
				}
			}
			release()
			got := <-rc
			if got.err != nil {
				t.Fatalf("reader: %v", got.err)
			}
			if tagOf(got.s) != tc.want || !reflect.DeepEqual(got.s, want[tc.want]) {
				t.Fatalf("reader loaded %q, want %q whole", tagOf(got.s), tc.want)
			}
			wrelease()
			if werr != nil {
				if err := <-werr; err != nil {
					t.Fatalf("writer: %v", err)
				}
			}
		})
	}
}

// A chunk that changed under a manifest that did not is caught by the
// checksum, even when it still decodes.
func TestVariablesChecksum(t *testing.T) {
	for name, corrupt := range map[string]func(t *testing.T, f *fakeVars, chunk string){
		"a flipped bit": func(t *testing.T, f *fakeVars, chunk string) {
			b, _ := base64.StdEncoding.DecodeString(f.get(chunk).Items["data"])
			b[len(b)/2] ^= 0x10
			f.set(chunk, api.VariableItems{"data": base64.StdEncoding.EncodeToString(b)})
		},
		// Another state's chunk: valid gzip of valid JSON, only the
		// checksum tells.
		"another state, well formed": func(t *testing.T, f *fakeVars, chunk string) {
			g := newFakeVars(t)
			if err := g.store("x").Save(context.Background(), savedOf(t, 100, "impostor", 0)); err != nil {
				t.Fatal(err)
			}
			other := g.paths("hadar/sidecar/state/")[0]
			f.set(chunk, g.get(other).Items)
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeVars(t)
			v := f.store("a")
			if err := v.Save(context.Background(), savedOf(t, 100, "real", 0)); err != nil {
				t.Fatal(err)
			}
			corrupt(t, f, f.paths("hadar/sidecar/state/")[0])
			before := f.requests("a")
			got, err := v.Load(context.Background())
			if !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), "SHA-256") || !strings.Contains(err.Error(), "move it aside") {
				t.Fatalf("loaded %q, err = %v", tagOf(got), err)
			}
			// The manifest did not move: read twice, not loadAttempts times.
			if n := f.requests("a") - before; n != 3 {
				t.Errorf("%d requests to report a broken state, want 3 (manifest, chunk, manifest again)", n)
			}
		})
	}
}

// storeKinds opens each store, empty; the Variables store with the fake
// it talks to.
func storeKinds() map[string]func(t *testing.T) (Store, *fakeVars) {
	return map[string]func(t *testing.T) (Store, *fakeVars){
		"bolt": func(t *testing.T) (Store, *fakeVars) {
			b, err := OpenBolt(filepath.Join(t.TempDir(), "state.db"), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return b, nil
		},
		"variables": func(t *testing.T) (Store, *fakeVars) {
			f := newFakeVars(t)
			v := f.store("a")
			v.segSize = 3 // the fence crosses segments
			return v, f
		},
	}
}

// Saves and journal entries of an older lock generation than one already
// written are refused, in both stores alike.
func TestFencing(t *testing.T) {
	type step struct {
		gen    uint64
		fenced bool
	}
	for name, steps := range map[string][]step{
		"elected leaders":    {{5, false}, {5, false}, {3, true}, {0, true}, {7, false}, {5, true}, {7, false}},
		"election turned on": {{0, false}, {0, false}, {2, false}, {0, true}, {2, false}},
	} {
		for kind, open := range storeKinds() {
			t.Run(name+"/"+kind, func(t *testing.T) {
				s, f := open(t)
				ctx := context.Background()
				var last *Saved
				var seqs []uint64
				for i, st := range steps {
					saved := savedOf(t, 100, fmt.Sprintf("s%d", i), st.gen)
					err := s.Save(ctx, saved)
					if st.fenced != errors.Is(err, ErrFenced) || (!st.fenced && err != nil) {
						t.Fatalf("save %d by generation %d: %v (want fenced: %v)", i, st.gen, err, st.fenced)
					}
					if !st.fenced {
						last = saved
					} else if !strings.Contains(err.Error(), "refused") {
						t.Fatalf("fenced save: %v", err)
					}
					if got := mustLoad(t, s); !reflect.DeepEqual(got, last) {
						t.Fatalf("after save %d loaded %q, want %q", i, tagOf(got), tagOf(last))
					}
					if f != nil && len(f.paths("hadar/sidecar/state/")) != 1 {
						t.Fatalf("after save %d: chunks %v, want the state's only", i, f.paths("hadar/sidecar/state/"))
					}
					seq, err := s.Append(ctx, Entry{Job: fmt.Sprintf("j%d", i), Generation: st.gen})
					if st.fenced != errors.Is(err, ErrFenced) || (!st.fenced && err != nil) {
						t.Fatalf("append %d by generation %d: %v (want fenced: %v)", i, st.gen, err, st.fenced)
					}
					if !st.fenced {
						seqs = append(seqs, seq)
					}
				}
				es, err := s.Journal(ctx, 0)
				if err != nil {
					t.Fatal(err)
				}
				var got []uint64
				for i, e := range es {
					got = append(got, e.Seq)
					if e.Seq != uint64(i+1) {
						t.Fatalf("journal %+v: not 1..n", es)
					}
				}
				if !reflect.DeepEqual(got, seqs) {
					t.Fatalf("journal holds %v, appends returned %v", got, seqs)
				}
			})
		}
	}
}

// A deposed leader racing the new one: its save or append that reaches
// Nomad after the new leader's is refused as fenced, and leaves nothing.
func TestVariablesFencingRaces(t *testing.T) {
	t.Run("save", func(t *testing.T) {
		f := newFakeVars(t)
		old, cur := f.store("old"), f.store("new")
		if err := old.Save(context.Background(), savedOf(t, 100, "old0", 3)); err != nil {
			t.Fatal(err)
		}
		reached, release := f.hold("old", "PUT", `manifest$`)
		errc := saveAsync(old, savedOf(t, 2*ChunkBytes, "old1", 3))
		<-reached
		win := savedOf(t, 100, "new", 5)
		if err := cur.Save(context.Background(), win); err != nil {
			t.Fatal(err)
		}
		release()
		if err := <-errc; !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), `generation 5 (replica "new")`) {
			t.Fatalf("deposed leader's save: %v", err)
		}
		if dirs := chunkDirs(f); len(dirs) != 1 || !strings.Contains(dirs[0], "-"+cur.writer+"_") {
			t.Fatalf("chunk directories: %v", dirs)
		}
		if err := old.Save(context.Background(), savedOf(t, 100, "old2", 3)); !errors.Is(err, ErrFenced) {
			t.Fatalf("deposed leader's next save: %v", err)
		}
		if got := mustLoad(t, old); !reflect.DeepEqual(got, win) {
			t.Fatalf("loaded %q", tagOf(got))
		}
	})
	t.Run("append", func(t *testing.T) {
		f := newFakeVars(t)
		old, cur := f.store("old"), f.store("new")
		ctx := context.Background()
		for range 2 {
			if _, err := old.Append(ctx, Entry{Job: "old", Generation: 3, Leader: "old"}); err != nil {
				t.Fatal(err)
			}
		}
		if seq, err := cur.Append(ctx, Entry{Job: "new", Generation: 5, Leader: "new"}); err != nil || seq != 3 {
			t.Fatalf("new leader's append: %d, %v", seq, err)
		}
		// The deposed leader's copy of the tail is stale: its write is a
		// check-and-set conflict whose answer shows the fence.
		if _, err := old.Append(ctx, Entry{Job: "old", Generation: 3}); !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), `generation 5 (replica "new")`) {
			t.Fatalf("deposed leader's append: %v", err)
		}
		es, err := cur.Journal(ctx, 0)
		if err != nil || len(es) != 3 || es[2].Job != "new" {
			t.Fatalf("journal: %+v, %v", es, err)
		}
	})
}

// The segment write is the commit point: a writer that dies right after it
// (before the head or anything else) leaves no duplicate and no gap.
func TestVariablesJournalCrash(t *testing.T) {
	for name, tc := range map[string]struct {
		before int    // entries appended before the crash
		after  string // the request after which the writer dies
		fail   bool   // the request fails instead, the writer lives on
	}{
		"mid-segment, after the segment write":        {before: 9, after: `journal/\d+$`},
		"last of a segment, after the segment write":  {before: 63, after: `journal/\d+$`},
		"first of a segment, after the segment write": {before: 64, after: `journal/\d+$`},
		"first of a segment, after the head":          {before: 64, after: `journal/head$`},
		"the head write fails":                        {before: 64, after: `journal/head$`, fail: true},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeVars(t)
			a := f.store("a")
			ctx := context.Background()
			for i := range tc.before {
				if _, err := a.Append(ctx, Entry{Job: fmt.Sprint(i + 1)}); err != nil {
					t.Fatal(err)
				}
			}
			next := a
			if tc.fail {
				f.fail("a", "PUT", tc.after, 500, 1)
				if seq, err := a.Append(ctx, Entry{Job: fmt.Sprint(tc.before + 1)}); err != nil || seq != uint64(tc.before+1) {
					t.Fatalf("append with the head failing: %d, %v (the head is a hint)", seq, err)
				}
			} else {
				f.crashAfter("a", "PUT", tc.after)
				a.Append(ctx, Entry{Job: fmt.Sprint(tc.before + 1)}) // its answer is lost with it
				next = f.store("b")
			}
			for i := range 70 {
				seq, err := next.Append(ctx, Entry{Job: fmt.Sprint(tc.before + 2 + i)})
				if err != nil || seq != uint64(tc.before+2+i) {
					t.Fatalf("append %d after the crash: seq %d, %v", i, seq, err)
				}
			}
			es, err := f.store("c").Journal(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) != tc.before+71 {
				t.Fatalf("%d entries, want %d", len(es), tc.before+71)
			}
			for i, e := range es {
				if e.Seq != uint64(i+1) || e.Job != fmt.Sprint(i+1) {
					t.Fatalf("entry %d: seq %d job %s", i, e.Seq, e.Job)
				}
			}
			if h := f.get("hadar/sidecar/journal/head"); h == nil || h.Items["segment"] != fmt.Sprint((tc.before+70)/64) {
				t.Fatalf("head %+v, want the last segment", h)
			}
			if es, err := next.Journal(ctx, uint64(tc.before)); err != nil || len(es) != 71 || es[0].Seq != uint64(tc.before+1) {
				t.Fatalf("journal after %d: %d entries, %v", tc.before, len(es), err)
			}
		})
	}
}

// A journal writer that could not tell whether its write was made, or
// that follows a head left behind, finds the true tail again.
func TestVariablesJournalRecovers(t *testing.T) {
	for name, tc := range map[string]struct {
		spoil func(f *fakeVars)
		// failed: the spoiled append returns an error; journaled: its
		// entry is in the journal all the same.
		failed, journaled bool
	}{
		"segment write refused":        {spoil: func(f *fakeVars) { f.fail("a", "PUT", `journal/\d+$`, 500, 1) }, failed: true},
		"segment written, answer lost": {spoil: func(f *fakeVars) { f.lose("a", "PUT", `journal/\d+$`) }, failed: true, journaled: true},
		// A replica stalled long enough writes a head whose segment has
		// been trimmed since: the newest segment listed is the tail.
		"head far behind": {spoil: func(f *fakeVars) { f.set("hadar/sidecar/journal/head", api.VariableItems{"segment": "1"}) }, journaled: true},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeVars(t)
			ctx := context.Background()
			open := func(name string) *Variables {
				v := f.store(name)
				v.keep, v.segSize = 8, 4
				return v
			}
			a := open("a")
			for i := range 30 {
				if _, err := a.Append(ctx, Entry{Job: fmt.Sprint(i + 1)}); err != nil {
					t.Fatal(err)
				}
			}
			tc.spoil(f)
			seq, err := a.Append(ctx, Entry{Job: "31"})
			if tc.failed != (err != nil) || (err == nil && seq != 31) {
				t.Fatalf("spoiled append: seq %d, %v", seq, err)
			}
			want := 30
			if tc.journaled {
				want = 31
			}
			for _, v := range []*Variables{a, open("b")} {
				want++
				if seq, err := v.Append(ctx, Entry{Job: fmt.Sprint(want)}); err != nil || seq != uint64(want) {
					t.Fatalf("next append: seq %d, %v; want %d", seq, err, want)
				}
			}
			es, err := open("c").Journal(ctx, 0)
			if err != nil || len(es) == 0 || es[len(es)-1].Seq != uint64(want) {
				t.Fatalf("journal: %+v, %v", es, err)
			}
			for i, e := range es {
				if e.Seq != es[0].Seq+uint64(i) || e.Job != fmt.Sprint(e.Seq) {
					t.Fatalf("entry %d: seq %d job %s", i, e.Seq, e.Job)
				}
			}
		})
	}
}

// Replicas appending at once, 24 writers each: every entry is journaled
// once, sequence numbers unique and without a gap, each as Append said.
func TestVariablesJournalConcurrent(t *testing.T) {
	f := newFakeVars(t)
	ctx := context.Background()
	var mu sync.Mutex
	seqOf := map[string]uint64{}
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		v := f.store(name)
		v.segSize = 8
		for w := range 24 {
			wg.Go(func() {
				for i := range 10 {
					job := fmt.Sprintf("%s-%d-%d", name, w, i)
					seq, err := v.Append(ctx, Entry{Job: job})
					// A batch that loses more than appendConflicts
					// check-and-set races to the other store's writer
					// fails unwritten (make test run 34, on a loaded
					// machine: 48 appenders, two writers); its caller
					// may append again.
					for try := 0; errors.Is(err, ErrConflict) && try < 8; try++ {
						seq, err = v.Append(ctx, Entry{Job: job})
					}
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
	r := f.store("r")
	r.segSize = 8
	es, err := r.Journal(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 480 {
		t.Fatalf("%d entries, want 480", len(es))
	}
	for i, e := range es {
		if e.Seq != uint64(i+1) || seqOf[e.Job] != e.Seq {
			t.Fatalf("entry %d: seq %d for %s, Append said %d", i, e.Seq, e.Job, seqOf[e.Job])
		}
	}
}

// A batch spanning several segments retries each write's check-and-set
// races up to appendConflicts in a row, counted afresh after each write
// that lands (they were once counted over the whole batch, so a long
// batch failed after 33 races spread over its segments); a write that
// loses more in a row fails its entries, unwritten, with ErrConflict.
func TestVariablesJournalConflictsInARow(t *testing.T) {
	for name, tc := range map[string]struct {
		races   []int // lost races on journal/0, /1, /2
		written int   // entries journaled
	}{
		"spread over the segments": {races: []int{appendConflicts, appendConflicts, appendConflicts}, written: 6},
		"too many on one segment":  {races: []int{0, appendConflicts + 1, 0}, written: 2},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeVars(t)
			ctx := context.Background()
			v := f.store("a")
			v.segSize = 2
			for seg, n := range tc.races {
				if n > 0 {
					f.conflict("a", http.MethodPut, fmt.Sprintf(`journal/%d$`, seg), n)
				}
			}
			var batch []*appendReq
			for i := range 6 {
				batch = append(batch, &appendReq{ctx: ctx, e: Entry{Job: fmt.Sprint(i)}, done: make(chan struct{})})
			}
			v.appendBatch(batch)
			for i, r := range batch {
				<-r.done
				if i < tc.written {
					if r.err != nil || r.seq != uint64(i+1) {
						t.Errorf("entry %d: seq %d, %v; want %d", i, r.seq, r.err, i+1)
					}
					continue
				}
				if !errors.Is(r.err, ErrConflict) || !strings.Contains(r.err.Error(), "in a row") {
					t.Errorf("entry %d: seq %d, %v; want ErrConflict", i, r.seq, r.err)
				}
			}
			es, err := f.store("r").Journal(ctx, 0)
			if err != nil || len(es) != tc.written {
				t.Fatalf("journal: %d entries, %v; want %d", len(es), err, tc.written)
			}
		})
	}
}

// The journal keeps MaxJournal entries (at least), the newest, and
// deletes the segments before them.
func TestVariablesJournalTrim(t *testing.T) {
	for name, tc := range map[string]struct{ keep, segSize, appends, writers int }{
		"small":      {keep: 10, segSize: 4, appends: 50, writers: 1},
		"MaxJournal": {keep: MaxJournal, segSize: SegmentSize, appends: MaxJournal + 500, writers: 64},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeVars(t)
			v := f.store("a")
			v.keep, v.segSize = tc.keep, tc.segSize
			ctx := context.Background()
			var wg sync.WaitGroup
			for w := range tc.writers {
				wg.Go(func() {
					for range tc.appends / tc.writers {
						if _, err := v.Append(ctx, Entry{Job: fmt.Sprint(w)}); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			total := tc.appends / tc.writers * tc.writers
			es, err := v.Journal(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) < tc.keep || len(es) > tc.keep+2*tc.segSize || es[len(es)-1].Seq != uint64(total) {
				t.Fatalf("%d entries kept, the last %d; want the last %d or a segment or two more, up to %d", len(es), es[len(es)-1].Seq, tc.keep, total)
			}
			for i, e := range es {
				if e.Seq != es[0].Seq+uint64(i) {
					t.Fatalf("gap at %d: %d", i, e.Seq)
				}
			}
			segs := len(f.paths("hadar/sidecar/journal/")) - 1 // the head
			if want := (tc.keep+tc.segSize-1)/tc.segSize + 1; segs > want {
				t.Fatalf("%d segments kept, want at most %d", segs, want)
			}
		})
	}
}

// Appends go out in few requests: one segment write for every entry
// waiting, plus the head and the trimming every new segment. (Before the
// journal writer: 4 requests an append, 5 once trimming began.)
func TestVariablesAppendRequests(t *testing.T) {
	for name, tc := range map[string]struct {
		writers, each int
		most          float64
	}{
		"one writer": {writers: 1, each: 640, most: 1.05},
		"48 writers": {writers: 48, each: 20, most: 0.5},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeVars(t)
			v := f.store("a")
			v.keep = 256 // trimming in the count too
			var wg sync.WaitGroup
			start := time.Now()
			for range tc.writers {
				wg.Go(func() {
					for range tc.each {
						if _, err := v.Append(context.Background(), Entry{Job: "default/j", Kind: "start"}); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			n := tc.writers * tc.each
			per := float64(f.requests("a")) / float64(n)
			t.Logf("%d appends by %d writers: %d requests, %.3f per append, %v", n, tc.writers, f.requests("a"), per, time.Since(start))
			if per > tc.most {
				t.Fatalf("%.3f requests per append, want at most %.2f", per, tc.most)
			}
		})
	}
}

// Entries too large for 64 per variable seal their segment early; one too
// large on its own is refused, alone.
func TestVariablesLargeEntries(t *testing.T) {
	f := newFakeVars(t)
	v := f.store("a")
	ctx := context.Background()
	noise := func(n int) string {
		b := make([]byte, n)
		rand.Read(b)
		return base64.StdEncoding.EncodeToString(b)
	}
	for i := range 12 {
		seq, err := v.Append(ctx, Entry{Job: fmt.Sprint(i), Error: noise(9000)})
		if err != nil || seq != uint64(i+1) {
			t.Fatalf("append %d: seq %d, %v", i, seq, err)
		}
	}
	if _, err := v.Append(ctx, Entry{Job: "huge", Error: noise(60000)}); err == nil || !strings.Contains(err.Error(), "larger than a Nomad variable holds") {
		t.Fatalf("huge entry: %v", err)
	}
	if seq, err := v.Append(ctx, Entry{Job: "12"}); err != nil || seq != 13 {
		t.Fatalf("append after the huge one: %d, %v", seq, err)
	}
	es, err := f.store("b").Journal(ctx, 0)
	if err != nil || len(es) != 13 {
		t.Fatalf("journal: %d entries, %v", len(es), err)
	}
	for i, e := range es {
		if e.Seq != uint64(i+1) || e.Job != fmt.Sprint(i) {
			t.Fatalf("entry %d: %d %s", i, e.Seq, e.Job)
		}
	}
	if segs := len(f.paths("hadar/sidecar/journal/")) - 1; segs < 2 {
		t.Fatalf("%d segments: none sealed early", segs)
	}
	// Many at once: a batch too large for one segment is split.
	var wg sync.WaitGroup
	for range 24 {
		wg.Go(func() {
			if _, err := v.Append(ctx, Entry{Job: "many", Error: noise(9000)}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	es, err = f.store("c").Journal(ctx, 0)
	if err != nil || len(es) != 37 {
		t.Fatalf("journal: %d entries, %v", len(es), err)
	}
	for i, e := range es {
		if e.Seq != uint64(i+1) {
			t.Fatalf("entry %d: seq %d", i, e.Seq)
		}
	}
}

// An Append whose caller gives up fails alone; a closed store refuses.
func TestVariablesAppendCancelAndClose(t *testing.T) {
	f := newFakeVars(t)
	v := f.store("a")
	if _, err := v.Append(context.Background(), Entry{Job: "first"}); err != nil {
		t.Fatal(err)
	}
	reached, release := f.hold("a", "PUT", `journal/0$`)
	gone, cancel := context.WithCancel(context.Background())
	type result struct {
		seq uint64
		err error
	}
	ca, cb := make(chan result, 1), make(chan result, 1)
	go func() {
		seq, err := v.Append(context.Background(), Entry{Job: "stays"})
		ca <- result{seq, err}
	}()
	<-reached
	go func() {
		seq, err := v.Append(gone, Entry{Job: "gives up"})
		cb <- result{seq, err}
	}()
	time.Sleep(50 * time.Millisecond) // queued behind the held write
	cancel()
	if r := <-cb; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled append: %+v", r)
	}
	release()
	if r := <-ca; r.err != nil || r.seq != 2 {
		t.Fatalf("append in flight: %+v", r)
	}
	es, err := v.Journal(context.Background(), 0)
	if err != nil || len(es) != 2 || es[1].Job != "stays" {
		t.Fatalf("journal: %+v, %v", es, err)
	}
	v.Close()
	if _, err := v.Append(context.Background(), Entry{}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("append after Close: %v", err)
	}
}

// The layout before writers and checksums (chunks under state/<gen>/, a
// head with the last sequence number) is read, and continued.
func TestVariablesReadsTheFirstLayout(t *testing.T) {
	f := newFakeVars(t)
	old := savedOf(t, 100, "old", 0)
	raw, _ := json.Marshal(old)
	gz, _ := gzipBytes(raw)
	f.set("hadar/sidecar/state/3/0", api.VariableItems{"data": base64.StdEncoding.EncodeToString(gz)})
	f.set("hadar/sidecar/manifest", api.VariableItems{"manifest": `{"format":"hadar-sidecar-state","version":1,"generation":3,"chunks":1}`})
	var es []Entry
	for i := range 70 {
		es = append(es, Entry{Seq: uint64(i + 1), Job: fmt.Sprint(i + 1)})
	}
	for seg, part := range [][]Entry{es[:64], es[64:]} {
		raw, _ := json.Marshal(part)
		gz, _ := gzipBytes(raw)
		f.set(fmt.Sprintf("hadar/sidecar/journal/%d", seg), api.VariableItems{"entries": base64.StdEncoding.EncodeToString(gz)})
	}
	f.set("hadar/sidecar/journal/head", api.VariableItems{"seq": "70"})
	v := f.store("a")
	if got := mustLoad(t, v); !reflect.DeepEqual(got, old) {
		t.Fatalf("loaded %q", tagOf(got))
	}
	ctx := context.Background()
	if seq, err := v.Append(ctx, Entry{Job: "71"}); err != nil || seq != 71 {
		t.Fatalf("append: %d, %v", seq, err)
	}
	if got, err := v.Journal(ctx, 60); err != nil || len(got) != 11 || got[10].Job != "71" {
		t.Fatalf("journal: %+v, %v", got, err)
	}
	if err := v.Save(ctx, savedOf(t, 100, "new", 0)); err != nil {
		t.Fatal(err)
	}
	if dirs := chunkDirs(f); len(dirs) != 1 || !strings.Contains(dirs[0], "-"+v.writer+"_") {
		t.Fatalf("chunk directories: %v", dirs)
	}
}

// A manifest switch whose answer is lost and that Nomad applies late,
// after the same store's next save wrote its chunks: that save loses the
// race (409) and must neither have rewritten nor delete the chunks the
// manifest now names; the state loads, and the save after it goes through
// (issue #31, item 9).
func TestVariablesLateSwitch(t *testing.T) {
	f := newFakeVars(t)
	v := f.store("a")
	if err := v.Save(context.Background(), savedOf(t, 3*ChunkBytes, "first", 1)); err != nil {
		t.Fatal(err)
	}
	// The switch of "late" reaches Nomad but waits there; its sender gives
	// up on the answer.
	reached, release := f.hold("a", "PUT", `^hadar/sidecar/manifest$`)
	ctx, cancel := context.WithCancel(context.Background())
	lateDone := make(chan error, 1)
	go func() { lateDone <- v.Save(ctx, savedOf(t, 3*ChunkBytes, "late", 1)) }()
	<-reached
	cancel()
	if err := <-lateDone; err == nil {
		t.Fatal("a save whose answer was lost succeeded")
	}
	// The next save writes its chunks, then its switch waits until the
	// late one is applied.
	reached2, release2 := f.hold("a", "PUT", `^hadar/sidecar/manifest$`)
	next := saveAsync(v, savedOf(t, 3*ChunkBytes, "next", 1))
	<-reached2
	release()
	for deadline := time.Now().Add(5 * time.Second); manifestOf(t, f).Generation != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the late switch was never applied")
		}
	}
	release2()
	if err := <-next; !errors.Is(err, ErrConflict) {
		t.Fatalf("the save racing the late switch: %v, want ErrConflict", err)
	}
	if got := tagOf(mustLoad(t, f.store("reader"))); got != "late" {
		t.Fatalf("loaded %q, want the late switch's state", got)
	}
	if err := v.Save(context.Background(), savedOf(t, 3*ChunkBytes, "after", 1)); err != nil {
		t.Fatal(err)
	}
	if got := tagOf(mustLoad(t, f.store("reader2"))); got != "after" {
		t.Fatalf("loaded %q after the next save", got)
	}
	if dirs := chunkDirs(f); len(dirs) != 1 {
		t.Errorf("chunk directories left: %v", dirs)
	}
}
