package agent

import (
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/hadar-sched/hadar/planner/belief"
	"github.com/hadar-sched/hadar/planner/engine"
)

// learnState is the agent's side of learning throughputs: the profile
// overlay file it reloads, and the gaps it warned of.
type learnState struct {
	// The overlay file (config profile_overlay) as last loaded: its
	// modification time and size, when it was last looked at, and the
	// last error reading it (logged once).
	overlayMod     time.Time
	overlaySize    int64
	overlayChecked time.Time
	overlayErr     string
	// gapsWarned are the (model, type) pairs without an estimate that
	// were warned of: each is warned of once while it lasts.
	gapsWarned map[engine.Gap]bool
}

// overlayEvery is how often the overlay file is looked at for a change.
const overlayEvery = 5 * time.Second

// loadOverlay loads the configured overlay into p at start: one that does
// not load stops the sidecar, as the profile does.
func (a *Agent) loadOverlay(p *belief.Profile) error {
	path := a.cfg.ProfileOverlay
	if path == "" {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return errors.Join(errors.New("sidecar config: profile_overlay"), err)
	}
	if err := p.LoadOverlay(path); err != nil {
		return errors.Join(errors.New("sidecar config: profile_overlay"), err)
	}
	a.learning.overlayMod, a.learning.overlaySize, a.learning.overlayChecked = fi.ModTime(), fi.Size(), a.clock()
	a.log.Info("profile overlay loaded", "path", path)
	return nil
}

// reloadOverlay reloads the overlay when its file changed since it was
// loaded (modification time or size), at most every overlayEvery: the next
// plan uses its figures, and what was learned over figures it replaced is
// recomputed against them. A file that does not load, or is gone, leaves
// the overlay in force; the error is logged once. Called under a.mu.
func (a *Agent) reloadOverlay() {
	path := a.cfg.ProfileOverlay
	if path == "" || a.clock().Sub(a.learning.overlayChecked) < overlayEvery {
		return
	}
	a.learning.overlayChecked = a.clock()
	fi, err := os.Stat(path)
	if err == nil && fi.ModTime().Equal(a.learning.overlayMod) && fi.Size() == a.learning.overlaySize {
		return
	}
	if err == nil {
		err = a.prof.LoadOverlay(path)
	}
	if err != nil {
		if msg := err.Error(); msg != a.learning.overlayErr {
			a.learning.overlayErr = msg
			what := "the profile overlay does not load: the one loaded before stays in force"
			if errors.Is(err, fs.ErrNotExist) {
				what = "the profile overlay file is gone: the one loaded before stays in force (empty profile_overlay and restart to drop it)"
			}
			a.log.Error(what, "path", path, "error", err)
		}
		return
	}
	a.learning.overlayMod, a.learning.overlaySize, a.learning.overlayErr = fi.ModTime(), fi.Size(), ""
	a.log.Info("profile overlay reloaded", "path", path)
}
