package state

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hadar-sched/hadar/planner"
)

func TestBoltSaveLoadAndJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	b, err := OpenBolt(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s, err := b.Load(ctx); err != nil || s != nil {
		t.Fatalf("empty store: %v, %v", s, err)
	}
	want := &Saved{Engine: []byte(`{"format":"x"}`), Agent: []byte(`{"rounds":3}`), At: time.Unix(100, 0).UTC(), Index: 42, JournalSeq: 2, Leader: "a", Generation: 7}
	if err := b.Save(ctx, want); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		seq, err := b.Append(ctx, Entry{Job: "default/j", Kind: "start", Units: []planner.Unit{{Slots: []planner.Slot{{Node: "n", Type: "v100", Count: i + 1}}}}})
		if err != nil || seq != uint64(i+1) {
			t.Fatalf("append %d: seq %d, %v", i, seq, err)
		}
	}
	b.Close()
	// A new process opens the same file: everything is there.
	b, err = OpenBolt(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, err := b.Load(ctx)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("loaded %+v, %v; want %+v", got, err, want)
	}
	es, err := b.Journal(ctx, 1)
	if err != nil || len(es) != 2 || es[0].Seq != 2 || es[1].Units[0].Slots[0].Count != 3 {
		t.Fatalf("journal after 1: %+v, %v", es, err)
	}
}

func TestBoltJournalIsBounded(t *testing.T) {
	b, err := OpenBolt(filepath.Join(t.TempDir(), "state.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.keep = 5
	ctx := context.Background()
	for range 12 {
		if _, err := b.Append(ctx, Entry{Job: "j"}); err != nil {
			t.Fatal(err)
		}
	}
	es, _ := b.Journal(ctx, 0)
	if len(es) != 5 || es[0].Seq != 8 {
		t.Fatalf("kept %d entries from %d, want the last 5 (8..12)", len(es), es[0].Seq)
	}
}

func TestBoltRefusesWhatItCannotRead(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 1000)), 0o600)
	future := filepath.Join(dir, "future.db")
	db, err := bolt.Open(future, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		m, _ := tx.CreateBucketIfNotExists(bucketMeta)
		return m.Put(keyHeader, []byte(`{"format":"hadar-sidecar-state","version":9}`))
	})
	db.Close()
	other := filepath.Join(dir, "other.db")
	db, _ = bolt.Open(other, 0o600, nil)
	db.Update(func(tx *bolt.Tx) error {
		m, _ := tx.CreateBucketIfNotExists(bucketMeta)
		return m.Put(keyHeader, []byte(`{"format":"something-else","version":1}`))
	})
	db.Close()
	for name, tc := range map[string]struct{ path, want string }{
		"corrupt":        {garbage, "move it aside"},
		"future version": {future, "version 9"},
		"another format": {other, "something-else"},
	} {
		_, err := OpenBolt(tc.path, time.Second)
		if !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "rebuilds from Nomad") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	// A corrupt saved state inside a good file is refused at Load.
	bad := filepath.Join(dir, "bad-saved.db")
	b, err := OpenBolt(bad, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketState).Put(keySaved, []byte("{truncated")) })
	if _, err := b.Load(context.Background()); !errors.Is(err, ErrUnreadable) {
		t.Errorf("corrupt saved state: err = %v", err)
	}
	b.Close()
}

func TestBoltRefusesASecondOpener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	b, err := OpenBolt(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := OpenBolt(path, 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "another process holds it") {
		t.Fatalf("second open: %v", err)
	}
}
