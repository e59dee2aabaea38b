package state

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Bolt is the default store: one local bbolt file. Every Save and Append
// is one transaction, fsync'd before it returns, so a crash leaves the last
// committed state.
type Bolt struct {
	db   *bolt.DB
	path string
	// keep is how many journal entries are kept (MaxJournal).
	keep uint64
}

var (
	bucketMeta    = []byte("meta")
	bucketState   = []byte("state")
	bucketJournal = []byte("journal")
	keyHeader     = []byte("header")
	keySaved      = []byte("saved")
	// The fences: the highest lock generation (and its replica) that
	// saved, and that journaled.
	keySaveFence    = []byte("save_fence")
	keyJournalFence = []byte("journal_fence")
)

// fenceRecord is a fence as the bbolt store keeps it.
type fenceRecord struct {
	Generation uint64 `json:"generation"`
	Leader     string `json:"leader,omitempty"`
}

// raise refuses a write by generation gen (ErrFenced) when the fence at
// key in meta is higher, and raises it to gen otherwise.
func (b *Bolt) raise(meta *bolt.Bucket, key []byte, what string, gen uint64, leader string) error {
	var f fenceRecord
	raw := meta.Get(key)
	if raw != nil {
		if err := json.Unmarshal(raw, &f); err != nil {
			return unreadable(b.path, fmt.Errorf("%s: %v", key, err))
		}
	}
	if err := fence(b.path, what, gen, f.Generation, f.Leader); err != nil {
		return err
	}
	if raw != nil && gen == f.Generation {
		return nil // nothing to raise: no write
	}
	out, err := json.Marshal(fenceRecord{Generation: gen, Leader: leader})
	if err != nil {
		return err
	}
	return meta.Put(key, out)
}

// OpenBolt opens (or creates) the state file at path. A file another
// process holds open makes it wait up to timeout (two sidecars on one
// state file is a configuration error). A file that is not a state file
// of this version is refused.
func OpenBolt(path string, timeout time.Duration) (*Bolt, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("state %s: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("state %s: another process holds it open (another sidecar on the same state file?): %w", path, err)
		}
		return nil, unreadable(path, err)
	}
	b := &Bolt{db: db, path: path, keep: MaxJournal}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if raw := meta.Get(keyHeader); raw != nil {
			var h header
			if err := json.Unmarshal(raw, &h); err != nil {
				return unreadable(path, fmt.Errorf("header: %v", err))
			}
			if err := checkHeader(path, h); err != nil {
				return err
			}
		} else {
			raw, _ := json.Marshal(header{Format: Format, Version: Version})
			if err := meta.Put(keyHeader, raw); err != nil {
				return err
			}
		}
		if _, err := tx.CreateBucketIfNotExists(bucketState); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketJournal)
		return err
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return b, nil
}

// Where implements Store.
func (b *Bolt) Where() string { return b.path }

// Close implements Store.
func (b *Bolt) Close() error { return b.db.Close() }

// Load implements Store.
func (b *Bolt) Load(context.Context) (*Saved, error) {
	var out *Saved
	err := b.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketState).Get(keySaved)
		if raw == nil {
			return nil
		}
		var s Saved
		if err := json.Unmarshal(raw, &s); err != nil {
			return unreadable(b.path, fmt.Errorf("saved state: %v", err))
		}
		out = &s
		return nil
	})
	return out, err
}

// Save implements Store.
func (b *Bolt) Save(_ context.Context, s *Saved) error {
	raw, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("state %s: %w", b.path, err)
	}
	err = b.db.Update(func(tx *bolt.Tx) error {
		if err := b.raise(tx.Bucket(bucketMeta), keySaveFence, "save", s.Generation, s.Leader); err != nil {
			return err
		}
		return tx.Bucket(bucketState).Put(keySaved, raw)
	})
	if errors.Is(err, ErrFenced) {
		return err
	}
	if err != nil {
		return fmt.Errorf("state %s: save: %w", b.path, err)
	}
	return nil
}

// Append implements Store.
func (b *Bolt) Append(_ context.Context, e Entry) (uint64, error) {
	err := b.db.Update(func(tx *bolt.Tx) error {
		if err := b.raise(tx.Bucket(bucketMeta), keyJournalFence, "journal entry", e.Generation, e.Leader); err != nil {
			return err
		}
		j := tx.Bucket(bucketJournal)
		seq, err := j.NextSequence()
		if err != nil {
			return err
		}
		e.Seq = seq
		raw, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := j.Put(seqKey(seq), raw); err != nil {
			return err
		}
		// Keep the journal bounded: drop the oldest entries.
		if seq > b.keep {
			c := j.Cursor()
			for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= seq-b.keep; k, _ = c.Next() {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if errors.Is(err, ErrFenced) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("state %s: journal: %w", b.path, err)
	}
	return e.Seq, nil
}

// Journal implements Store.
func (b *Bolt) Journal(_ context.Context, after uint64) ([]Entry, error) {
	var out []Entry
	err := b.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketJournal).Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil; k, v = c.Next() {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return unreadable(b.path, fmt.Errorf("journal entry %d: %v", binary.BigEndian.Uint64(k), err))
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}
