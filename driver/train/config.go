package train

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
)

// configSpec is the plugin block's schema (see docs/driver.md).
var configSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"enabled": hclspec.NewDefault(
		hclspec.NewAttr("enabled", "bool", false),
		hclspec.NewLiteral("true"),
	),
	"checkpoint_root": hclspec.NewAttr("checkpoint_root", "string", false),
	"merge_root":      hclspec.NewAttr("merge_root", "string", false),
	"progress_poll_interval": hclspec.NewDefault(
		hclspec.NewAttr("progress_poll_interval", "string", false),
		hclspec.NewLiteral(`"1s"`),
	),
	// Deprecated and ignored: progress is no longer published as periodic
	// task events (docs/driver.md). Accepted so existing configs load.
	"progress_event_interval": hclspec.NewAttr("progress_event_interval", "string", false),
	"allow_root": hclspec.NewDefault(
		hclspec.NewAttr("allow_root", "bool", false),
		hclspec.NewLiteral("false"),
	),
	"default_user": hclspec.NewDefault(
		hclspec.NewAttr("default_user", "string", false),
		hclspec.NewLiteral(`"nobody"`),
	),
})

// taskConfigSpec is the schema of a task's config block.
var taskConfigSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"command":        hclspec.NewAttr("command", "string", true),
	"args":           hclspec.NewAttr("args", "list(string)", false),
	"work_dir":       hclspec.NewAttr("work_dir", "string", false),
	"total_steps":    hclspec.NewAttr("total_steps", "number", false),
	"checkpoint_dir": hclspec.NewAttr("checkpoint_dir", "string", false),
	"progress_file":  hclspec.NewAttr("progress_file", "string", false),
	"emulate": hclspec.NewBlock("emulate", false, hclspec.NewObject(map[string]*hclspec.Spec{
		// list(map(...)) as Nomad's own drivers declare maps: a jobspec
		// map reaches the driver as a list of maps after the API's JSON.
		"steps_per_sec": hclspec.NewAttr("steps_per_sec", "list(map(number))", true),
		// The pace when the task's unit spans several nodes: per model
		// (Gavel's "unconsolidated" figures), else steps_per_sec times
		// spread_factor; neither: no penalty.
		"spread_steps_per_sec": hclspec.NewAttr("spread_steps_per_sec", "list(map(number))", false),
		"spread_factor":        hclspec.NewAttr("spread_factor", "number", false),
	})),
	"hadare": hclspec.NewBlock("hadare", false, hclspec.NewObject(map[string]*hclspec.Spec{
		// Unset: the copies are dynamic (the sidecar's units).
		"copies":      hclspec.NewAttr("copies", "number", false),
		"copy_index":  hclspec.NewAttr("copy_index", "number", false),
		"merge_every": hclspec.NewAttr("merge_every", "number", false),
		"merge_dir":   hclspec.NewAttr("merge_dir", "string", false),
	})),
})

// Config is the plugin block.
type Config struct {
	Enabled               bool   `codec:"enabled"`
	CheckpointRoot        string `codec:"checkpoint_root"`
	MergeRoot             string `codec:"merge_root"`
	ProgressPollInterval  string `codec:"progress_poll_interval"`
	ProgressEventInterval string `codec:"progress_event_interval"`
	// AllowRoot lets tasks run as root (uid 0). Off by default: a task
	// that would run as root (user = "root", or no user with default_user
	// naming root) is refused.
	AllowRoot bool `codec:"allow_root"`
	// DefaultUser runs tasks that set no user; "" means the client's own
	// user. Ignored when the client is not root (it cannot switch users).
	DefaultUser string `codec:"default_user"`
}

// defaultConfig is the plugin block's defaults, for a driver configured
// without a block.
func defaultConfig() Config {
	return Config{Enabled: true, DefaultUser: "nobody"}
}

type settings struct {
	enabled        bool
	checkpointRoot string
	mergeRoot      string
	pollEvery      time.Duration
	allowRoot      bool
	defaultUser    string
	// deprecated lists options that are accepted but ignored.
	deprecated []string
}

func parseConfig(c Config) (*settings, error) {
	s := &settings{enabled: c.Enabled, checkpointRoot: c.CheckpointRoot, mergeRoot: c.MergeRoot,
		allowRoot: c.AllowRoot, defaultUser: strings.TrimSpace(c.DefaultUser)}
	for _, root := range []struct{ name, v string }{{"checkpoint_root", c.CheckpointRoot}, {"merge_root", c.MergeRoot}} {
		if root.v != "" && !filepath.IsAbs(root.v) {
			return nil, fmt.Errorf("%s %q: want an absolute path", root.name, root.v)
		}
	}
	var err error
	if s.pollEvery, err = positiveDuration("progress_poll_interval", c.ProgressPollInterval, time.Second); err != nil {
		return nil, err
	}
	if c.ProgressEventInterval != "" {
		s.deprecated = append(s.deprecated, "progress_event_interval")
	}
	return s, nil
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
	Command       string         `codec:"command"`
	Args          []string       `codec:"args"`
	WorkDir       string         `codec:"work_dir"`
	TotalSteps    int64          `codec:"total_steps"`
	CheckpointDir string         `codec:"checkpoint_dir"`
	ProgressFile  string         `codec:"progress_file"`
	Emulate       *EmulateConfig `codec:"emulate"`
	HadarE        *HadarEConfig  `codec:"hadare"`
}

// EmulateConfig sets the pace of a training process on a machine
// without GPUs: steps/s of the job on each GPU model it may be given.
type EmulateConfig struct {
	StepsPerSec RateMap `codec:"steps_per_sec"`
	// SpreadStepsPerSec is the job's steps/s on a model when its unit
	// spans several nodes; it wins over SpreadFactor for the models it
	// names.
	SpreadStepsPerSec RateMap `codec:"spread_steps_per_sec"`
	// SpreadFactor multiplies StepsPerSec when the unit spans several
	// nodes (0: unset, no penalty).
	SpreadFactor Number `codec:"spread_factor"`
}

// RateMap maps a GPU model to steps/s. It decodes the list-of-maps form
// jobspec maps take on their way to the driver, merging the maps.
type RateMap map[string]float64

// CodecEncodeSelf writes the list-of-maps form.
func (m *RateMap) CodecEncodeSelf(enc *codec.Encoder) {
	enc.MustEncode([]map[string]float64{*m})
}

// CodecDecodeSelf reads the list-of-maps form.
func (m *RateMap) CodecDecodeSelf(dec *codec.Decoder) {
	var ms []map[string]Number
	dec.MustDecode(&ms)
	out := RateMap{}
	for _, x := range ms {
		for k, v := range x {
			out[k] = float64(v)
		}
	}
	*m = out
}

// Number is a jobspec number as it reaches the driver: cty's msgpack
// writes a number float64 holds exactly as a number (40, 21.5), and any
// other (0.8, 12.3) as its decimal string, which a float64 field would
// refuse.
type Number float64

// CodecEncodeSelf writes a float.
func (n *Number) CodecEncodeSelf(enc *codec.Encoder) { enc.MustEncode(float64(*n)) }

// CodecDecodeSelf reads a number or a decimal string.
func (n *Number) CodecDecodeSelf(dec *codec.Decoder) {
	var v interface{}
	dec.MustDecode(&v)
	switch x := v.(type) {
	case float64:
		*n = Number(x)
	case float32:
		*n = Number(x)
	case int64:
		*n = Number(x)
	case uint64:
		*n = Number(x)
	case string, []byte:
		f, err := strconv.ParseFloat(fmt.Sprintf("%s", x), 64)
		if err != nil {
			panic(fmt.Errorf("number %q: %w", x, err))
		}
		*n = Number(f)
	default:
		panic(fmt.Errorf("want a number, got %T", v))
	}
}

// HadarEConfig makes the task one copy of a HadarE job.
type HadarEConfig struct {
	// Copies is the declared number of copies; 0 (unset) makes them
	// dynamic: whoever announces itself in the merge directory.
	Copies     int    `codec:"copies"`
	CopyIndex  *int   `codec:"copy_index"`
	MergeEvery int    `codec:"merge_every"`
	MergeDir   string `codec:"merge_dir"`
}

func (tc *TaskConfig) validate() error {
	if strings.TrimSpace(tc.Command) == "" {
		return fmt.Errorf("command: empty; give the training program to run")
	}
	if tc.WorkDir != "" && !filepath.IsAbs(tc.WorkDir) {
		return fmt.Errorf("work_dir %q: want an absolute path", tc.WorkDir)
	}
	if tc.CheckpointDir != "" && !filepath.IsAbs(tc.CheckpointDir) {
		return fmt.Errorf("checkpoint_dir %q: want an absolute path", tc.CheckpointDir)
	}
	if tc.ProgressFile != "" && !filepath.IsAbs(tc.ProgressFile) {
		return fmt.Errorf("progress_file %q: want an absolute path", tc.ProgressFile)
	}
	if tc.TotalSteps < 0 {
		return fmt.Errorf("total_steps %d: want a positive number of steps", tc.TotalSteps)
	}
	if e := tc.Emulate; e != nil {
		if len(e.StepsPerSec) == 0 {
			return fmt.Errorf("emulate.steps_per_sec: empty; map each GPU model to the job's steps/s on it")
		}
		for m, v := range e.StepsPerSec {
			if v <= 0 {
				return fmt.Errorf("emulate.steps_per_sec[%q] = %v: want a positive rate", m, v)
			}
		}
		for m, v := range e.SpreadStepsPerSec {
			if v <= 0 {
				return fmt.Errorf("emulate.spread_steps_per_sec[%q] = %v: want a positive rate", m, v)
			}
		}
		if f := float64(e.SpreadFactor); f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("emulate.spread_factor = %v: want a positive factor (0.8: a unit spanning nodes runs at 80%% of its pace), or leave it unset", e.SpreadFactor)
		}
	}
	if h := tc.HadarE; h != nil {
		if h.Copies < 0 {
			return fmt.Errorf("hadare.copies %d: want at least 1, or unset for dynamic copies", h.Copies)
		}
		if h.CopyIndex != nil && (*h.CopyIndex < 0 || (h.Copies > 0 && *h.CopyIndex >= h.Copies)) {
			if h.Copies == 0 {
				return fmt.Errorf("hadare.copy_index %d: want >= 0", *h.CopyIndex)
			}
			return fmt.Errorf("hadare.copy_index %d: want 0..%d", *h.CopyIndex, h.Copies-1)
		}
		if h.MergeEvery < 0 {
			return fmt.Errorf("hadare.merge_every %d: want a positive number of steps", h.MergeEvery)
		}
		if h.MergeDir != "" && !filepath.IsAbs(h.MergeDir) {
			return fmt.Errorf("hadare.merge_dir %q: want an absolute path", h.MergeDir)
		}
	}
	return nil
}

// spreadStepsPerSec is the pace for the GPU models Nomad gave when the
// task's unit spans several nodes: spread_steps_per_sec of the model,
// else its steps_per_sec times spread_factor; the slowest, if several.
// ok is false when neither option is set (a spread unit pays nothing).
func (e *EmulateConfig) spreadStepsPerSec(models []string) (rate float64, ok bool) {
	if len(e.SpreadStepsPerSec) == 0 && e.SpreadFactor == 0 {
		return 0, false
	}
	for _, m := range models {
		v, found := e.SpreadStepsPerSec[m]
		if !found {
			v = e.StepsPerSec[m]
			if e.SpreadFactor > 0 {
				v *= float64(e.SpreadFactor)
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
	// A task with several device requests runs at its slowest GPU's pace.
	rate := 0.0
	for _, m := range models {
		v, ok := e.StepsPerSec[m]
		if !ok {
			known := make([]string, 0, len(e.StepsPerSec))
			for k := range e.StepsPerSec {
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
