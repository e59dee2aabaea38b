package train

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hadar-sched/hadar/driver/confine"
	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
)

// DefaultJobIDRange is the block of uids and gids the driver gives jobs
// when the plugin block names none: above the ids distributions give
// accounts (and below 2^31, which some tools treat as negative).
const DefaultJobIDRange = "200000-265535"

// configSpec is the plugin block's schema (see docs/driver.md).
var configSpec = hclspec.Object(map[string]*hclspec.Spec{
	"enabled": hclspec.Default(
		hclspec.Attr("enabled", "bool", false),
		hclspec.Literal("true"),
	),
	"checkpoint_root": hclspec.Attr("checkpoint_root", "string", false),
	"merge_root":      hclspec.Attr("merge_root", "string", false),
	"state_dir":       hclspec.Attr("state_dir", "string", false),
	"job_id_range": hclspec.Default(
		hclspec.Attr("job_id_range", "string", false),
		hclspec.Literal(`"`+DefaultJobIDRange+`"`),
	),
	"progress_poll_interval": hclspec.Default(
		hclspec.Attr("progress_poll_interval", "string", false),
		hclspec.Literal(`"1s"`),
	),
	// Deprecated and ignored: progress is no longer published as periodic
	// task events (docs/driver.md). Accepted so existing configs load.
	"progress_event_interval": hclspec.Attr("progress_event_interval", "string", false),
	"allow_root": hclspec.Default(
		hclspec.Attr("allow_root", "bool", false),
		hclspec.Literal("false"),
	),
	"default_user": hclspec.Attr("default_user", "string", false),
})

// taskConfigSpec is the schema of a task's config block.
var taskConfigSpec = hclspec.Object(map[string]*hclspec.Spec{
	"command":        hclspec.Attr("command", "string", true),
	"args":           hclspec.Attr("args", "list(string)", false),
	"work_dir":       hclspec.Attr("work_dir", "string", false),
	"total_steps":    hclspec.Attr("total_steps", "number", false),
	"checkpoint_dir": hclspec.Attr("checkpoint_dir", "string", false),
	"progress_file":  hclspec.Attr("progress_file", "string", false),
	"emulate": hclspec.Block("emulate", false, hclspec.Object(map[string]*hclspec.Spec{
		// list(map(...)) as Nomad's own drivers declare maps: a jobspec
		// map reaches the driver as a list of maps after the API's JSON.
		"steps_per_sec": hclspec.Attr("steps_per_sec", "list(map(number))", true),
		// The pace when the task's unit spans several nodes: per model
		// (Gavel's "unconsolidated" figures), else steps_per_sec times
		// spread_factor; neither: no penalty.
		"spread_steps_per_sec": hclspec.Attr("spread_steps_per_sec", "list(map(number))", false),
		"spread_factor":        hclspec.Attr("spread_factor", "number", false),
	})),
	"hadare": hclspec.Block("hadare", false, hclspec.Object(map[string]*hclspec.Spec{
		// Unset: the copies are dynamic (the sidecar's units).
		"copies": hclspec.Attr("copies", "number", false),
		// Unset (-1): from the task's env (see copyIndex). A null number
		// would decode as 0, a valid index, hence the default.
		"copy_index": hclspec.Default(
			hclspec.Attr("copy_index", "number", false),
			hclspec.Literal("-1"),
		),
		"merge_every": hclspec.Attr("merge_every", "number", false),
		"merge_dir":   hclspec.Attr("merge_dir", "string", false),
	})),
})

// Config is the plugin block.
type Config struct {
	Enabled bool `cty:"enabled"`
	// CheckpointRoot and MergeRoot are the operator's roots: every
	// checkpoint and merge directory is a job's directory in them.
	CheckpointRoot string `cty:"checkpoint_root"`
	MergeRoot      string `cty:"merge_root"`
	// StateDir holds each task's supervisor state; "" puts it in the
	// client's data directory (docs/driver.md).
	StateDir string `cty:"state_dir"`
	// JobIDRange is "first-last", the uids and gids given to jobs.
	JobIDRange            string `cty:"job_id_range"`
	ProgressPollInterval  string `cty:"progress_poll_interval"`
	ProgressEventInterval string `cty:"progress_event_interval"`
	// AllowRoot lets tasks run as root (uid 0). Off by default: a task
	// with user = "root" (or default_user naming root) is refused.
	AllowRoot bool `cty:"allow_root"`
	// DefaultUser runs tasks that set no user; "" runs each as its job's
	// own uid. Ignored when the client is not root (it cannot switch
	// users).
	DefaultUser string `cty:"default_user"`
}

// defaultConfig is the plugin block's defaults, for a driver configured
// without a block.
func defaultConfig() Config {
	return Config{Enabled: true, JobIDRange: DefaultJobIDRange, ProgressPollInterval: "1s"}
}

type settings struct {
	enabled        bool
	checkpointRoot string
	mergeRoot      string
	stateDir       string
	idRange        confine.IDRange
	pollEvery      time.Duration
	allowRoot      bool
	defaultUser    string
	// deprecated lists options that are accepted but ignored.
	deprecated []string
}

func parseConfig(c Config) (*settings, error) {
	s := &settings{enabled: c.Enabled, allowRoot: c.AllowRoot, defaultUser: strings.TrimSpace(c.DefaultUser)}
	for _, root := range []struct {
		name string
		v    string
		out  *string
	}{{"checkpoint_root", c.CheckpointRoot, &s.checkpointRoot}, {"merge_root", c.MergeRoot, &s.mergeRoot}, {"state_dir", c.StateDir, &s.stateDir}} {
		if root.v == "" {
			continue
		}
		if !filepath.IsAbs(root.v) {
			return nil, fmt.Errorf("%s %q: want an absolute path", root.name, root.v)
		}
		*root.out = filepath.Clean(root.v)
	}
	var err error
	if s.idRange, err = parseIDRange(c.JobIDRange); err != nil {
		return nil, err
	}
	if s.pollEvery, err = positiveDuration("progress_poll_interval", c.ProgressPollInterval, time.Second); err != nil {
		return nil, err
	}
	if c.ProgressEventInterval != "" {
		s.deprecated = append(s.deprecated, "progress_event_interval")
	}
	return s, nil
}

// parseIDRange reads job_id_range, "first-last" (inclusive).
func parseIDRange(v string) (confine.IDRange, error) {
	if strings.TrimSpace(v) == "" {
		v = DefaultJobIDRange
	}
	lo, hi, ok := strings.Cut(strings.TrimSpace(v), "-")
	first, err1 := strconv.Atoi(strings.TrimSpace(lo))
	last, err2 := strconv.Atoi(strings.TrimSpace(hi))
	switch {
	case !ok || errors.Join(err1, err2) != nil:
		return confine.IDRange{}, fmt.Errorf("job_id_range %q: want \"first-last\", e.g. %q", v, DefaultJobIDRange)
	case first < 1000 || last < first || last > math.MaxInt32-1:
		return confine.IDRange{}, fmt.Errorf("job_id_range %q: want 1000 <= first <= last < 2^31-1, ids no account or group uses (e.g. %q)", v, DefaultJobIDRange)
	case first <= 65534 && 65534 <= last:
		return confine.IDRange{}, fmt.Errorf("job_id_range %q: includes 65534 (nobody); choose ids no account uses, e.g. %q", v, DefaultJobIDRange)
	}
	return confine.IDRange{First: first, Count: last - first + 1}, nil
}

// checkSubordinateIDs fails if the range overlaps a block of
// /etc/subuid or /etc/subgid: the rootless containers of that user would
// share ids with jobs, and so their files.
func checkSubordinateIDs(rng confine.IDRange, files ...string) error {
	for _, file := range files {
		f, err := os.Open(file)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("job_id_range: %w", err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Split(strings.TrimSpace(sc.Text()), ":")
			if len(fields) != 3 {
				continue
			}
			start, err1 := strconv.Atoi(fields[1])
			count, err2 := strconv.Atoi(fields[2])
			if errors.Join(err1, err2) != nil {
				continue
			}
			if start < rng.First+rng.Count && rng.First < start+count {
				f.Close()
				return fmt.Errorf("job_id_range %s overlaps %s's subordinate ids %d-%d in %s: jobs would share ids with that user's containers; set job_id_range in the %s plugin block to ids nothing else uses", rng, fields[0], start, start+count-1, file, PluginName)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return fmt.Errorf("job_id_range: %s: %w", file, err)
		}
	}
	return nil
}

func positiveDuration(field, v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive duration such as \"2s\"", field, v)
	}
	return d, nil
}

// TaskConfig is a task's config block.
type TaskConfig struct {
	Command string   `cty:"command"`
	Args    []string `cty:"args"`
	WorkDir string   `cty:"work_dir"`
	// TotalSteps is float64 as the jobspec may hold any number; validate
	// wants a whole one.
	TotalSteps float64 `cty:"total_steps"`
	// CheckpointDir is relative to the job's directory in
	// checkpoint_root (or absolute under it).
	CheckpointDir string `cty:"checkpoint_dir"`
	// ProgressFile is relative to the task directory (or absolute under
	// it).
	ProgressFile string         `cty:"progress_file"`
	Emulate      *EmulateConfig `cty:"emulate"`
	HadarE       *HadarEConfig  `cty:"hadare"`
}

// EmulateConfig sets the pace of a training process on a machine
// without GPUs: steps/s of the job on each GPU model it may be given.
type EmulateConfig struct {
	StepsPerSec RateMaps `cty:"steps_per_sec"`
	// SpreadStepsPerSec is the job's steps/s on a model when its unit
	// spans several nodes; it wins over SpreadFactor for the models it
	// names.
	SpreadStepsPerSec RateMaps `cty:"spread_steps_per_sec"`
	// SpreadFactor multiplies StepsPerSec when the unit spans several
	// nodes (0: unset, no penalty).
	SpreadFactor float64 `cty:"spread_factor"`
}

// RateMaps maps GPU models to steps/s, in the list-of-maps form jobspec
// maps take on their way to the driver; Rates merges them.
type RateMaps []map[string]float64

// Rates is the merged map.
func (ms RateMaps) Rates() map[string]float64 {
	out := map[string]float64{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// HadarEConfig makes the task one copy of a HadarE job.
type HadarEConfig struct {
	// Copies is the declared number of copies; 0 (unset) makes them
	// dynamic: whoever announces itself in the merge directory.
	Copies int `cty:"copies"`
	// CopyIndex is -1 when unset.
	CopyIndex  int `cty:"copy_index"`
	MergeEvery int `cty:"merge_every"`
	// MergeDir is relative to the job's directory in merge_root (or
	// absolute under it).
	MergeDir string `cty:"merge_dir"`
}

func (tc *TaskConfig) validate() error {
	if strings.TrimSpace(tc.Command) == "" {
		return fmt.Errorf("command: empty; give the training program to run")
	}
	if tc.WorkDir != "" && !filepath.IsAbs(tc.WorkDir) {
		return fmt.Errorf("work_dir %q: want an absolute path", tc.WorkDir)
	}
	if tc.TotalSteps < 0 || tc.TotalSteps != math.Trunc(tc.TotalSteps) || tc.TotalSteps > 1<<53 {
		return fmt.Errorf("total_steps %v: want a whole, positive number of steps", tc.TotalSteps)
	}
	if e := tc.Emulate; e != nil {
		rates := e.StepsPerSec.Rates()
		if len(rates) == 0 {
			return fmt.Errorf("emulate.steps_per_sec: empty; map each GPU model to the job's steps/s on it")
		}
		for m, v := range rates {
			if !(v > 0) || math.IsInf(v, 0) {
				return fmt.Errorf("emulate.steps_per_sec[%q] = %v: want a positive rate", m, v)
			}
		}
		for m, v := range e.SpreadStepsPerSec.Rates() {
			if !(v > 0) || math.IsInf(v, 0) {
				return fmt.Errorf("emulate.spread_steps_per_sec[%q] = %v: want a positive rate", m, v)
			}
		}
		if f := e.SpreadFactor; f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("emulate.spread_factor = %v: want a positive factor (0.8: a unit spanning nodes runs at 80%% of its pace), or leave it unset", e.SpreadFactor)
		}
	}
	if h := tc.HadarE; h != nil {
		if h.Copies < 0 {
			return fmt.Errorf("hadare.copies %d: want at least 1, or unset for dynamic copies", h.Copies)
		}
		if h.CopyIndex < -1 || (h.Copies > 0 && h.CopyIndex >= h.Copies) {
			if h.Copies == 0 {
				return fmt.Errorf("hadare.copy_index %d: want >= 0", h.CopyIndex)
			}
			return fmt.Errorf("hadare.copy_index %d: want 0..%d", h.CopyIndex, h.Copies-1)
		}
		if h.MergeEvery < 0 {
			return fmt.Errorf("hadare.merge_every %d: want a positive number of steps", h.MergeEvery)
		}
	}
	return nil
}

// spreadStepsPerSec is the pace for the GPU models Nomad gave when the
// task's unit spans several nodes: spread_steps_per_sec of the model,
// else its steps_per_sec times spread_factor; the slowest, if several.
// ok is false when neither option is set (a spread unit pays nothing).
func (e *EmulateConfig) spreadStepsPerSec(models []string) (rate float64, ok bool) {
	spread, rates := e.SpreadStepsPerSec.Rates(), e.StepsPerSec.Rates()
	if len(spread) == 0 && e.SpreadFactor == 0 {
		return 0, false
	}
	for _, m := range models {
		v, found := spread[m]
		if !found {
			v = rates[m]
			if e.SpreadFactor > 0 {
				v *= e.SpreadFactor
			}
		}
		if rate == 0 || v < rate {
			rate = v
		}
	}
	return rate, rate > 0
}

// stepsPerSec picks the emulated pace for the GPU models Nomad gave.
func (e *EmulateConfig) stepsPerSec(models []string) (float64, error) {
	if len(models) == 0 {
		return 0, fmt.Errorf("emulate: the task got no GPU; ask for one with device \"nvidia/gpu\"")
	}
	rates := e.StepsPerSec.Rates()
	// A task with several device requests runs at its slowest GPU's pace.
	rate := 0.0
	for _, m := range models {
		v, ok := rates[m]
		if !ok {
			known := make([]string, 0, len(rates))
			for k := range rates {
				known = append(known, k)
			}
			sort.Strings(known)
			return 0, fmt.Errorf("emulate.steps_per_sec: no entry for GPU model %q (have %q); add one", m, known)
		}
		if rate == 0 || v < rate {
			rate = v
		}
	}
	return rate, nil
}
