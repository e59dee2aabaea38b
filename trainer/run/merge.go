package run

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"time"
)

// pollInterval is how often a waiting copy looks for the others' files.
const pollInterval = 50 * time.Millisecond

// exchange writes mine to round mine.Round of dir and waits, up to timeout
// from then, for the other copies' files of that round. It returns the files
// found, mine included, ordered by copy index. A copy whose file does not
// come in time, or is unreadable or belongs to another job, is skipped (and
// logged): a preempted copy must not stall the others. tick is called while
// waiting so the caller can keep the progress file fresh. Only a cancelled
// ctx or failing to write mine is an error.
func exchange(ctx context.Context, dir string, mine *MergeFile, timeout time.Duration, log *slog.Logger, tick func()) ([]*MergeFile, error) {
	b, err := EncodeMergeFile(mine)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(mergePath(dir, mine.Round, mine.CopyIndex), b); err != nil {
		return nil, fmt.Errorf("merge round %d: %w", mine.Round, err)
	}
	got := make([]*MergeFile, mine.Copies)
	got[mine.CopyIndex] = mine
	pending := map[int]bool{}
	for i := range mine.Copies {
		if i != mine.CopyIndex {
			pending[i] = true
		}
	}
	deadline := time.Now().Add(timeout)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for len(pending) > 0 {
		for i := range pending {
			path := mergePath(dir, mine.Round, i)
			raw, err := os.ReadFile(path)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			delete(pending, i)
			if err != nil {
				log.Warn("merge: skipping unreadable copy file", "path", path, "err", err)
				continue
			}
			m, err := DecodeMergeFile(raw)
			if err == nil {
				err = checkPeer(m, mine, i)
			}
			if err != nil {
				log.Warn("merge: skipping invalid copy file", "path", path, "err", err)
				continue
			}
			got[i] = m
		}
		if len(pending) == 0 {
			break
		}
		if !time.Now().Before(deadline) {
			missing := slices.Sorted(maps.Keys(pending))
			log.Warn("merge: copies missing after the wait; merging without them", "round", mine.Round, "missing", missing, "timeout", timeout)
			break
		}
		tick()
		timer.Reset(min(pollInterval, time.Until(deadline)))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("merge round %d: %w", mine.Round, ctx.Err())
		case <-timer.C:
		}
	}
	out := make([]*MergeFile, 0, mine.Copies)
	for _, m := range got {
		if m != nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// checkPeer rejects a file that cannot be merged with mine.
func checkPeer(m, mine *MergeFile, index int) error {
	switch {
	case m.JobID != mine.JobID:
		return fmt.Errorf("field \"job_id\": %q, this copy runs %q; give every copy its own job's merge dir", m.JobID, mine.JobID)
	case m.Round != mine.Round || m.CopyIndex != index:
		return fmt.Errorf("fields \"round\" %d, \"copy_index\" %d do not match the file's path (round %d, copy %d)", m.Round, m.CopyIndex, mine.Round, index)
	case m.Copies != mine.Copies:
		return fmt.Errorf("field \"copies\": %d, this copy has %d; all copies must be given the same HADAR_COPIES", m.Copies, mine.Copies)
	case !m.Params.SameShape(mine.Params):
		return fmt.Errorf("field \"params\": shape %s/%d/%d/%d differs from this copy's %s/%d/%d/%d; all copies must run the same model",
			m.Params.Model, m.Params.Dim, m.Params.Hidden, m.Params.Classes, mine.Params.Model, mine.Params.Dim, mine.Params.Hidden, mine.Params.Classes)
	}
	return nil
}
